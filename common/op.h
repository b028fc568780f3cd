// What a message belongs to. Every frame header carries the sender's OpFingerprint; the
// receiver compares it with the one it posted, so ranks that disagree about a call (op, dtype,
// count, root, reduction, or the call's place in the sequence) get a kMismatch error that names
// both ranks and both calls, instead of a hang or wrong data.
#pragma once

#include <cstdint>
#include <string>

#include "common/dtype.h"

namespace nanoccl {

// The order is part of the wire format: append only.
enum class OpType : uint8_t {
  kNone = 0,
  kAllreduce,
  kReduce,
  kBroadcast,
  kAllgather,
  kReduceScatter,
  kAlltoall,
  kGather,
  kScatter,
  kSendRecv,  // point-to-point: matched by (peer, tag) in FIFO order, not by sequence number
  kBarrier,
  kNumOps,
};

const char* opTypeName(OpType op);

// The codecs of compressed collectives, by wire id (collectives/codec/codec.h's CodecId; its
// table takes its names from here and static_asserts the count). Frames carry the id, so ranks
// that disagree about compression meet a mismatch, not garbage.
inline constexpr const char* kCodecNames[] = {"none", "fp16", "bf16", "int8", "int4"};
inline constexpr uint8_t kNumCodecNames = 5;

// The root of a barrier that stands for a call this rank refused before queueing it
// (Communicator::refusedCall): ranks that refused the same call meet in it; a rank that made
// a real call there meets a mismatch.
inline constexpr int32_t kRefusedCallRoot = -2;

struct OpFingerprint {
  OpType op = OpType::kNone;
  DataType dtype = DataType::kUInt8;
  ReduceOp redop = ReduceOp::kSum;
  int32_t root = -1;   // -1 where the op has no root
  uint64_t count = 0;  // elements; for ops with per-rank counts, the total over all ranks
                       // (0 where counts are per peer pair, e.g. alltoall)
  uint64_t seq = 0;    // the communicator's collective sequence number (0 for p2p)
  uint8_t codec = 0;   // the inter-node codec's wire id (kCodecNames); 0: lossless
  // How many of a peer's connections on each rail the call's large messages are striped over
  // (tcp; the planner's socket count, collectives/planner.h); 0: all of them.
  uint8_t lanes = 0;
  // 1 where the call's buffers are device memory (a GPU's: collectives/device/device.h), so that
  // a rank calling on device tensors and one on host tensors meet a mismatch.
  uint8_t device = 0;

  bool operator==(const OpFingerprint& o) const {
    return op == o.op && dtype == o.dtype && redop == o.redop && root == o.root &&
           count == o.count && seq == o.seq && codec == o.codec && lanes == o.lanes &&
           device == o.device;
  }
  bool operator!=(const OpFingerprint& o) const { return !(*this == o); }

  // "allreduce #7 (float32 x 1024, sum)", "broadcast #3 (int64 x 8, root 1, on the device)",
  // "allreduce #9 (float32 x 4096, sum, int8 across nodes)", "... 1 socket a peer)".
  std::string describe() const;
};

}  // namespace nanoccl
