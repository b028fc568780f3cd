// The TCP transport's published address: its rails (network interfaces, transports/netif.h)
// with their line rates, and the settings every rank must share.
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
// "<address>@<Mbit/s>", then, after a space, the settings every rank must share as
// TcpTransport::publish() writes them ("10.0.0.1:4000@1000,10.0.1.1:4001@100 size=4 nsocks=2
// stripe_min_bytes=65536 encrypt=0"; none when `settings` is empty). parseRails() reads the
// rails back (kInvalidArgument on anything else) and publishedSettings() the settings ("" when
// none): setup compares every rank's with its own, as text (buildMesh, handshake.h).
std::string formatRails(const std::vector<RailAddress>& rails, const std::string& settings = "");
Result<std::vector<RailAddress>> parseRails(const std::string& text);
std::string publishedSettings(const std::string& text);

}  // namespace nanoccl::tcp
