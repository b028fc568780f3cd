// The TCP transport's handshake records. After the handshake, a connection carries frames
// (transports/frame.h). Nothing read from an unauthenticated connection sizes an allocation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "transports/frame.h"

namespace nanoccl::tcp {

constexpr size_t kMaxSecretBytes = 64;

// First bytes on a new connection, from the connecting rank.
struct Hello {
  uint32_t magic;
  uint16_t version;
  uint16_t socketIndex;  // which of the nsocks connections to the acceptor this is
  int32_t rank;          // the connecting rank
  int32_t size;          // its communicator size
  int32_t nsocks;        // its NANOCCL_NSOCKS
  uint32_t secretBytes;
  uint64_t commIdHash;
  uint64_t stripeMinBytes;  // its NANOCCL_STRIPE_MIN_BYTES: striping must agree on both sides
  uint8_t secret[kMaxSecretBytes];
};
static_assert(sizeof(Hello) == 104);

// The acceptor's answer to a Hello that presented the right secret. A connection without the
// secret gets no answer: it is closed.
enum class HelloVerdict : uint32_t {
  kAccepted = 0,
  kConfigMismatch = 1,  // same job, but nsocks / stripe size / size disagree: fatal for the job
  kDuplicate = 2,
};
struct HelloAck {
  uint32_t magic;
  HelloVerdict verdict;
  int32_t rank;  // the acceptor's rank
  int32_t nsocks;
  uint64_t stripeMinBytes;
};
static_assert(sizeof(HelloAck) == 24);

}  // namespace nanoccl::tcp
