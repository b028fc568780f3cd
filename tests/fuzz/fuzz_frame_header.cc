// A frame header a peer sends is checked by validateFrameHeader() before anything in it is
// used; whatever it accepts must keep the promises the receive path relies on.
#include <cstdint>
#include <cstring>

#include "transports/frame.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nanoccl::FrameHeader h{};
  std::memcpy(&h, data, size < sizeof(h) ? size : sizeof(h));
  const nanoccl::Status st = nanoccl::validateFrameHeader(h);
  if (!st.isOk()) {
    if (st.code() != nanoccl::StatusCode::kProtocolError || st.message().empty()) __builtin_trap();
    return 0;
  }
  // Accepted: the slice lies inside its message, the message within the limit, and every
  // enum the receive path switches on is one it knows.
  if (h.total > nanoccl::kMaxMessageBytes) __builtin_trap();
  if (h.length > h.total || h.offset > h.total - h.length) __builtin_trap();
  if (h.kind == nanoccl::FrameKind::kAbort) {
    if (h.length > nanoccl::kMaxAbortText) __builtin_trap();
    return 0;
  }
  if (h.kind != nanoccl::FrameKind::kData) __builtin_trap();
  (void)nanoccl::fingerprintOf(h).describe();
  return 0;
}
