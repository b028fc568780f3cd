// The TCP transport's published address: its rails (network interfaces, transports/netif.h)
// with their line rates.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "transports/netif.h"

namespace nanoccl::tcp {

// One rail of a rank's published address: where it listens and the rail's line rate in
// Mbit/s (0: unknown; at most kMaxRailMbps, common/config.h).
struct RailAddress {
  SocketAddress address;
  int64_t mbps = 0;
};

// A rank's published TCP address: its rails joined by ',', each "<address>" or
// "<address>@<Mbit/s>" ("10.0.0.1:4000@1000,10.0.1.1:4001@100"); parseRails() reads it back
// (kInvalidArgument on anything else).
std::string formatRails(const std::vector<RailAddress>& rails);
Result<std::vector<RailAddress>> parseRails(const std::string& text);

}  // namespace nanoccl::tcp
