// The frame every transport puts in front of a message's bytes (tcp on the wire, shm in its
// ring chunks), and the checks applied to it before anything in it is trusted.
//
// Hosts of one job must share byte order (checked through the magic). Every field read from a
// peer is validated before it is used: nothing is allocated or indexed from an unchecked
// value (validateFrameHeader).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/op.h"
#include "common/status.h"

namespace nanoccl {

constexpr uint32_t kMagic = 0x4c43434e;  // "NCCL" little-endian: "NCCL" on the wire
constexpr uint16_t kVersion = 1;
// Largest message the transport accepts (a header announcing more is a protocol error).
constexpr uint64_t kMaxMessageBytes = uint64_t{1} << 40;
// Largest abort text.
constexpr uint32_t kMaxAbortText = 4096;
constexpr uint8_t kMaxFrameLanes = 64;  // OpFingerprint::lanes, at most (tcp's sockets a peer)

enum class FrameKind : uint8_t {
  kData = 1,
  kAbort = 2,  // payload: the sender's error text; the sender's transport is failed
};

// One frame: a header, then `length` payload bytes that belong at `offset` of a message of
// `total` bytes. A message is one frame, or one stripe per connection when striped.
struct FrameHeader {
  uint32_t magic;
  uint16_t version;
  FrameKind kind;
  OpType op;
  DataType dtype;
  ReduceOp redop;
  uint8_t codec;  // OpFingerprint::codec
  uint8_t lanes;  // OpFingerprint::lanes
  int32_t root;
  uint32_t tag;
  uint8_t device;  // OpFingerprint::device
  uint8_t reserved1[3];
  uint64_t seq;     // collective: the call's sequence number; p2p: the sender's message number
  uint64_t count;   // fingerprint count
  uint64_t total;   // message bytes
  uint64_t offset;  // this frame's byte offset in the message
  uint64_t length;  // this frame's payload bytes
};
static_assert(sizeof(FrameHeader) == 64);

// The header of one data frame of a message with this fingerprint. `seq` is the wire sequence
// number (the fingerprint's for collectives, the sender's message number for p2p).
inline FrameHeader dataFrameHeader(const OpFingerprint& fp, uint32_t tag, uint64_t seq,
                                   uint64_t total, uint64_t offset, uint64_t length) {
  FrameHeader h{};
  h.magic = kMagic;
  h.version = kVersion;
  h.kind = FrameKind::kData;
  h.op = fp.op;
  h.dtype = fp.dtype;
  h.redop = fp.redop;
  h.codec = fp.codec;
  h.lanes = fp.lanes;
  h.device = fp.device;
  h.root = fp.root;
  h.tag = tag;
  h.seq = seq;
  h.count = fp.count;
  h.total = total;
  h.offset = offset;
  h.length = length;
  return h;
}

// The header of an abort frame: `length` bytes of the sender's error text follow.
inline FrameHeader abortFrameHeader(uint64_t length) {
  FrameHeader h{};
  h.magic = kMagic;
  h.version = kVersion;
  h.kind = FrameKind::kAbort;
  h.total = length;
  h.length = length;
  return h;
}

inline OpFingerprint fingerprintOf(const FrameHeader& h) {
  OpFingerprint fp;
  fp.op = h.op;
  fp.dtype = h.dtype;
  fp.redop = h.redop;
  fp.root = h.root;
  fp.count = h.count;
  fp.seq = h.op == OpType::kSendRecv ? 0 : h.seq;
  fp.codec = h.codec;
  fp.lanes = h.lanes;
  fp.device = h.device;
  return fp;
}

// kProtocolError naming the bad field, or OK.
inline Status validateFrameHeader(const FrameHeader& h) {
  if (h.magic != kMagic) return protocolError("bad frame magic");
  if (h.version != kVersion) {
    return protocolError("frame version " + std::to_string(h.version) + ", expected " +
                         std::to_string(kVersion));
  }
  if (h.kind == FrameKind::kAbort) {
    if (h.length > kMaxAbortText || h.offset != 0 || h.total != h.length) {
      return protocolError("bad abort frame length " + std::to_string(h.length));
    }
    return Status::ok();
  }
  if (h.kind != FrameKind::kData) return protocolError("unknown frame kind");
  if (h.op == OpType::kNone || static_cast<uint32_t>(h.op) >= static_cast<uint32_t>(OpType::kNumOps)) {
    return protocolError("bad op in frame");
  }
  if (h.codec >= kNumCodecNames) return protocolError("bad codec in frame");
  if (h.lanes > kMaxFrameLanes) return protocolError("bad socket count in frame");
  if (h.device > 1) return protocolError("bad device flag in frame");
  if (static_cast<uint32_t>(h.dtype) >= static_cast<uint32_t>(DataType::kNumTypes)) {
    return protocolError("bad dtype in frame");
  }
  if (static_cast<uint32_t>(h.redop) >= static_cast<uint32_t>(ReduceOp::kNumOps)) {
    return protocolError("bad reduction in frame");
  }
  if (h.total > kMaxMessageBytes) {
    return protocolError("frame announces a message of " + std::to_string(h.total) +
                         " bytes (limit " + std::to_string(kMaxMessageBytes) + ")");
  }
  if (h.length > h.total || h.offset > h.total - h.length) {
    return protocolError("frame slice [" + std::to_string(h.offset) + ", +" +
                         std::to_string(h.length) + ") outside its message of " +
                         std::to_string(h.total) + " bytes");
  }
  return Status::ok();
}

// FNV-1a: a stable 64-bit id of the communicator's id string, for the handshake.
inline uint64_t hashCommId(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace nanoccl
