#include "common/op.h"

namespace nanoccl {

const char* opTypeName(OpType op) {
  static constexpr const char* kNames[] = {"none",           "allreduce", "reduce", "broadcast",
                                           "allgather",      "reduce_scatter", "alltoall",
                                           "gather",         "scatter",   "send/recv", "barrier"};
  static_assert(sizeof(kNames) / sizeof(kNames[0]) == static_cast<size_t>(OpType::kNumOps));
  const auto i = static_cast<size_t>(op);
  return i < static_cast<size_t>(OpType::kNumOps) ? kNames[i] : "invalid-op";
}

std::string OpFingerprint::describe() const {
  if (op == OpType::kBarrier && root == kRefusedCallRoot) {
    return "call #" + std::to_string(seq) + " (refused on that rank: a bad argument)";
  }
  std::string s = opTypeName(op);
  if (op != OpType::kSendRecv) s += " #" + std::to_string(seq);
  s += " (";
  s += dataTypeName(dtype);
  s += " x " + std::to_string(count);
  if (op == OpType::kAllreduce || op == OpType::kReduce || op == OpType::kReduceScatter) {
    s += ", ";
    s += reduceOpName(redop);
  }
  if (root >= 0) s += ", root " + std::to_string(root);
  if (codec != 0) {
    s += ", ";
    s += codec < kNumCodecNames ? kCodecNames[codec] : "unknown codec";
    s += " across nodes";
  }
  if (lanes != 0) s += ", " + std::to_string(lanes) + (lanes == 1 ? " socket" : " sockets") + " a peer";
  if (device != 0) s += ", on the device";
  s += ")";
  return s;
}

}  // namespace nanoccl
