// Which of a peer's TCP connections carry which bytes of a message (the Matcher's `parts`):
// the sender frames by it and the receiver expects by it, so both compute it from the same
// inputs, every one of which all ranks agree on.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/status.h"
#include "transports/matcher.h"
#include "transports/tcp/address.h"

namespace nanoccl::tcp {

// Stripes are cut at multiples of this many bytes (but the last).
inline constexpr uint64_t kStripeAlign = 4096;

struct Rails {
  // Per rail, its share of striped bytes (any positive scale: Mbit/s, or 1 each). Connection c
  // runs on rail c % weights.size().
  std::vector<int64_t> weights = {1};
  uint64_t stripeMinBytes = 0;  // smaller messages travel whole on one connection
};

// The rails' weights from every rank's published address (formatRails(); index = rank, ""
// for a rank that published none): rail k weighs the slowest rate any rank published for it,
// so every rank that reads the same addresses weighs alike; all equal (1) where a rank
// published no rate for a rail or a different number of rails (setup names the latter).
inline Result<Rails> weighRails(const std::vector<std::string>& addresses, int rails,
                                uint64_t stripeMinBytes) {
  Rails out;
  out.stripeMinBytes = stripeMinBytes;
  out.weights.assign(static_cast<size_t>(rails), 1);
  if (rails == 1) return out;
  std::vector<int64_t> slowest(static_cast<size_t>(rails), 0);
  for (const std::string& text : addresses) {
    if (text.empty()) continue;
    NANOCCL_ASSIGN_OR_RETURN(const std::vector<RailAddress> published, parseRails(text));
    if (static_cast<int>(published.size()) != rails) return out;
    for (size_t k = 0; k < published.size(); ++k) {
      if (published[k].mbps <= 0) return out;
      slowest[k] = slowest[k] == 0 ? published[k].mbps : std::min(slowest[k], published[k].mbps);
    }
  }
  if (slowest[0] > 0) out.weights = slowest;
  return out;
}

// A message of `total` bytes on `connections` connections: point-to-point (kSendRecv) whole
// on the first connection of the heaviest rails (its receive does not know the sender's seq);
// smaller than stripeMinBytes (or one connection) whole on one chosen from (seq, tag) among
// the connections of the heaviest rails; else one stripe per connection, its length by its
// rail's weight (equal weights: equal stripes), a connection whose share rounds to nothing
// left out.
inline std::vector<Part> layoutMessage(const Rails& rails, int connections, OpType op,
                                       uint64_t seq, uint32_t tag, uint64_t total) {
  const auto& w = rails.weights;
  const auto weight = [&](int c) { return static_cast<uint64_t>(w[c % w.size()]); };
  // The i-th connection (mod their count) of the heaviest rails; counted, not collected: this
  // runs for every message sent and received.
  const auto heaviest = [&](uint64_t i) {
    const uint64_t top = static_cast<uint64_t>(*std::max_element(w.begin(), w.end()));
    uint64_t count = 0;
    for (int c = 0; c < connections; ++c) count += weight(c) == top ? 1 : 0;
    i %= count;
    int c = 0;
    for (;; ++c) {
      if (weight(c) == top && i-- == 0) break;
    }
    return c;
  };
  if (op == OpType::kSendRecv) return {{heaviest(0), 0, total}};
  if (connections == 1 || total < rails.stripeMinBytes) return {{heaviest(seq + tag), 0, total}};
  uint64_t sum = 0;
  for (int c = 0; c < connections; ++c) sum += weight(c);
  std::vector<Part> out;
  uint64_t off = 0, weightSoFar = 0;
  for (int c = 0; c < connections && off < total; ++c) {
    weightSoFar += weight(c);
    // Where this connection's stripe ends: its share of the weight so far, aligned up.
    uint64_t end = static_cast<uint64_t>(static_cast<unsigned __int128>(total) * weightSoFar / sum);
    end = (end + kStripeAlign - 1) / kStripeAlign * kStripeAlign;
    if (c + 1 == connections || end > total) end = total;
    if (end > off) out.push_back({c, off, end - off});
    off = std::max(off, end);
  }
  return out;
}

}  // namespace nanoccl::tcp
