// The fabric transport's frames on the wire: the header in front of every frame's payload, its
// kinds, the one tag all frames carry, the token that proves the sender holds the job secret
// (fabric_transport.h: "Who may send"), and the checks a frame from a member passes before its
// payload is used. A message's frames carry the shared FrameHeader (transports/frame.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "common/crypto.h"
#include "common/status.h"
#include "transports/frame.h"
#include "transports/identity.h"

namespace nanoccl::fabric {

constexpr uint64_t kTag = 0x6e63636c66616272ull;  // every frame; matching is ours
constexpr size_t kTokenBytes = 16;
constexpr size_t kNonceBytes = 16;  // each rank's, fresh per transport, in its address

enum class Kind : uint32_t { kData = 1, kAbort = 2, kClose = 3, kPing = 4, kHello = 5 };

// What precedes every frame's payload on the wire.
struct WireHeader {
  uint8_t token[kTokenBytes];  // proves the sender holds the job secret (fabric_transport.h)
  uint32_t from;               // the sender's rank
  Kind kind;
  uint64_t frameSeq;  // per sender and receiver, from 1: frames are handled in this order
  FrameHeader frame;  // kData: the frame; kAbort: abortFrameHeader(text length)
};
static_assert(sizeof(WireHeader) == 96);

// The token `from` puts in every frame to `to`: a member's MAC (transports/identity.h) of both
// ranks and both nonces (kNonceBytes each), cut to kTokenBytes.
inline void frameToken(const CommIdentity& member, int from, int to, const void* nFrom,
                       const void* nTo, uint8_t* out) {
  const uint32_t f = static_cast<uint32_t>(from), t = static_cast<uint32_t>(to);
  const crypto::Mac mac = member.prove(
      "nanoccl fabric frame token v3",
      {crypto::bytesOf(f), crypto::bytesOf(t),
       std::string_view(static_cast<const char*>(nFrom), kNonceBytes),
       std::string_view(static_cast<const char*>(nTo), kNonceBytes)});
  std::memcpy(out, mac.data(), kTokenBytes);
}

// Whether a frame whose token checked out is well formed: `len` bytes arrived for header `h`,
// and a data or abort frame's payload is at most `chunkBytes`. Its place in the sender's order
// (frameSeq) is the receiver's to check.
inline Status checkFrame(const WireHeader& h, size_t len, uint64_t chunkBytes) {
  if (h.kind != Kind::kData && h.kind != Kind::kAbort) {
    if (h.kind != Kind::kClose && h.kind != Kind::kPing && h.kind != Kind::kHello) {
      return protocolError("unknown frame kind " + std::to_string(static_cast<uint32_t>(h.kind)));
    }
    return len == sizeof(h) ? Status::ok() : protocolError("control frame with a payload");
  }
  NANOCCL_CHECK(validateFrameHeader(h.frame));
  if ((h.frame.kind == FrameKind::kData) != (h.kind == Kind::kData)) {
    return protocolError("frame kind disagrees with its header");
  }
  if (h.frame.length > chunkBytes || len != sizeof(h) + h.frame.length) {
    return protocolError("frame of " + std::to_string(len) + " bytes announces " +
                         std::to_string(h.frame.length) + " payload bytes");
  }
  return Status::ok();
}

}  // namespace nanoccl::fabric
