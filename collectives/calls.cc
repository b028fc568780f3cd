// The public calls of a Communicator (communicator.h): each validates its arguments on the
// calling rank, then queues the call through Communicator::Impl::submit (call_queue.cc), or
// for send and recv posts it at once through Impl::postP2p. predictAllreduce plans a call
// without making it. Communicator::Impl is defined in communicator_impl.h.
#include "collectives/communicator.h"

#include <numeric>
#include <string>
#include <vector>

#include "collectives/algorithm.h"
#include "collectives/communicator_impl.h"
#include "collectives/planner.h"
#include "common/status.h"

namespace nanoccl {

using detail::CallArgs;
using detail::validDataType;

// ---- The calls: validate on the calling rank, then queue ----

namespace {

Status checkCounts(const char* name, const std::vector<size_t>& counts, int size) {
  if (static_cast<int>(counts.size()) != size) {
    return invalidArgument(std::string(name) + " has " + std::to_string(counts.size()) +
                           " entries for " + std::to_string(size) + " ranks");
  }
  return Status::ok();
}

Status checkRoot(int root, int size) {
  if (root < 0 || root >= size) {
    return invalidArgument("root " + std::to_string(root) + " is not a rank of this " +
                           std::to_string(size) + "-rank communicator");
  }
  return Status::ok();
}

Status checkBuffer(const char* name, const void* buf, size_t count) {
  if (buf == nullptr && count > 0) {
    return invalidArgument(std::string("null ") + name + " buffer for " + std::to_string(count) +
                           " elements");
  }
  return Status::ok();
}

Status checkReduction(ReduceOp op, DataType dtype) {
  if (!reduceOpSupported(op, dtype)) {
    return invalidArgument(std::string("reduction ") + reduceOpName(op) + " is not defined on " +
                           dataTypeName(dtype));
  }
  return Status::ok();
}

Status checkDataType(DataType dtype) {
  return validDataType(dtype) ? Status::ok() : invalidArgument("invalid data type");
}

size_t sum(const std::vector<size_t>& v) { return std::accumulate(v.begin(), v.end(), size_t{0}); }

// Runs checks in order; the first failure wins.
template <typename... Checks>
Status firstError(Checks&&... checks) {
  Status out;
  ((out.isOk() ? (out = checks(), 0) : 0), ...);
  return out;
}

}  // namespace

std::shared_ptr<Task> Communicator::allreduce(void* buf, size_t count, DataType dtype, ReduceOp op,
                                              double premulFactor) {
  return allreduceWith(buf, count, dtype, op, premulFactor, nullptr);
}

std::shared_ptr<Task> Communicator::allreduceCompressed(void* buf, size_t count, DataType dtype,
                                                        ReduceOp op,
                                                        const CompressionRequest& compression,
                                                        double premulFactor) {
  return allreduceWith(buf, count, dtype, op, premulFactor, &compression);
}

std::shared_ptr<Task> Communicator::allreduceWith(void* buf, size_t count, DataType dtype,
                                                  ReduceOp op, double premulFactor,
                                                  const CompressionRequest* compression) {
  CallArgs a;
  a.op = OpType::kAllreduce;
  a.dtype = dtype;
  a.redop = op;
  a.premulFactor = premulFactor;
  a.recv = buf;
  a.send = buf;
  a.count = count;
  const Status invalid =
      firstError([&] { return checkDataType(dtype); }, [&] { return checkReduction(op, dtype); },
                 [&] { return checkBuffer("", buf, count); },
                 [&] { return impl_->chooseCodec(a, compression); });
  return impl_->submit(OpFingerprint{OpType::kAllreduce, dtype, op, -1, count, 0}, std::move(a),
                       invalid);
}

std::shared_ptr<Task> Communicator::deviceCall(const DeviceCall& call) {
  CallArgs a;
  a.op = call.op;
  a.dtype = call.dtype;
  a.redop = call.redop;
  a.premulFactor = call.premulFactor;
  a.send = call.send != nullptr ? call.send : call.recv;
  a.recv = call.recv;
  a.count = call.count;
  a.device = call.device;
  a.after = call.after;
  const int n = size();
  const bool reduces = call.op == OpType::kAllreduce || call.op == OpType::kReduceScatter;
  size_t total = call.count;  // the fingerprint's count: all ranks' elements where per rank
  if (call.op == OpType::kAllgather || call.op == OpType::kReduceScatter) {
    a.counts.assign(static_cast<size_t>(n), call.count);
    total = call.count * static_cast<size_t>(n);
  }
  if (call.op == OpType::kBroadcast) a.root = call.root;
  if (!reduces) a.redop = ReduceOp::kSum;
  const Status invalid = firstError(
      [&] {
        if (!call.device) return invalidArgument("device call without a device");
        switch (call.op) {
          case OpType::kAllreduce:
          case OpType::kBroadcast:
          case OpType::kAllgather:
          case OpType::kReduceScatter:
            return Status::ok();
          default:
            return invalidArgument(std::string(opTypeName(call.op)) +
                                   " is not a collective on device memory");
        }
      },
      [&] { return checkDataType(call.dtype); },
      [&] { return reduces ? checkReduction(call.redop, call.dtype) : Status::ok(); },
      [&] {
        if (!reduces || call.device->supports(call.dtype, call.redop)) return Status::ok();
        return invalidArgument(std::string(reduceOpName(call.redop)) + " on " +
                               dataTypeName(call.dtype) + " is not supported on the " +
                               call.device->describe());
      },
      [&] { return call.op == OpType::kBroadcast ? checkRoot(call.root, n) : Status::ok(); },
      [&] { return checkBuffer("receive", call.recv, call.count); },
      [&] { return checkBuffer("send", a.send, call.count); },
      // NANOCCL_COMPRESSION, or the caller's request: the staged allreduce's cross-node leg, as
      // the host path's.
      [&] {
        if (call.op == OpType::kAllreduce) return impl_->chooseCodec(a, call.compression.get());
        if (call.compression) return invalidArgument("compression is for allreduce only");
        return Status::ok();
      });
  OpFingerprint fp{call.op, call.dtype, a.redop, a.root, total, 0};
  fp.device = 1;
  return impl_->submit(fp, std::move(a), invalid);
}

Result<Communicator::Prediction> Communicator::predictAllreduce(size_t count, DataType dtype,
                                                                const std::string& codec) const {
  CallArgs a;
  a.op = OpType::kAllreduce;
  a.dtype = dtype;
  a.redop = ReduceOp::kSum;
  a.count = count;
  NANOCCL_CHECK(checkDataType(dtype));
  CompressionRequest request;
  request.codec = codec;
  NANOCCL_CHECK(impl_->chooseCodec(a, codec.empty() ? nullptr : &request));
  NANOCCL_ASSIGN_OR_RETURN(detail::Plan plan,
                           detail::plan(a, impl_->topology, impl_->config, impl_->profile.get()));
  Prediction p;
  p.algorithm = plan.row->name;
  const bool lossy = plan.codec != nullptr && plan.row->lossy;
  p.codec = lossy ? plan.codec->name : "none";
  p.codecChunkBytes = !lossy ? 0
                      : plan.codecChunkBytes != 0 ? plan.codecChunkBytes
                                                  : impl_->config.chunkBytes;
  p.seconds = impl_->size < 2 ? 0 : plan.predictedSeconds;
  return p;
}

std::shared_ptr<Task> Communicator::reduce(void* buf, size_t count, DataType dtype, ReduceOp op,
                                           int root, double premulFactor) {
  CallArgs a;
  a.op = OpType::kReduce;
  a.dtype = dtype;
  a.redop = op;
  a.premulFactor = premulFactor;
  a.recv = buf;
  a.send = buf;
  a.count = count;
  a.root = root;
  const Status invalid = firstError(
      [&] { return checkDataType(dtype); }, [&] { return checkReduction(op, dtype); },
      [&] { return checkRoot(root, size()); }, [&] { return checkBuffer("", buf, count); });
  return impl_->submit(OpFingerprint{OpType::kReduce, dtype, op, root, count, 0}, std::move(a),
                       invalid);
}

std::shared_ptr<Task> Communicator::broadcast(void* buf, size_t count, DataType dtype, int root) {
  CallArgs a;
  a.op = OpType::kBroadcast;
  a.dtype = dtype;
  a.recv = buf;
  a.send = buf;
  a.count = count;
  a.root = root;
  const Status invalid =
      firstError([&] { return checkDataType(dtype); }, [&] { return checkRoot(root, size()); },
                 [&] { return checkBuffer("", buf, count); });
  return impl_->submit(OpFingerprint{OpType::kBroadcast, dtype, ReduceOp::kSum, root, count, 0},
                       std::move(a), invalid);
}

std::shared_ptr<Task> Communicator::allgather(const void* send, size_t sendCount, void* recv,
                                              const std::vector<size_t>& recvCounts,
                                              DataType dtype) {
  CallArgs a;
  a.op = OpType::kAllgather;
  a.dtype = dtype;
  a.send = send;
  a.recv = recv;
  a.count = sendCount;
  a.counts = recvCounts;
  const Status invalid =
      firstError([&] { return checkDataType(dtype); },
                 [&] { return checkCounts("recvCounts", recvCounts, size()); },
                 [&] {
                   return recvCounts[rank()] == sendCount
                              ? Status::ok()
                              : invalidArgument("recvCounts[" + std::to_string(rank()) + "] is " +
                                                std::to_string(recvCounts[rank()]) +
                                                " but sendCount is " + std::to_string(sendCount));
                 },
                 [&] { return checkBuffer("send", send, sendCount); },
                 [&] { return checkBuffer("recv", recv, sum(recvCounts)); });
  const size_t total = invalid.isOk() ? sum(recvCounts) : 0;
  return impl_->submit(OpFingerprint{OpType::kAllgather, dtype, ReduceOp::kSum, -1, total, 0},
                       std::move(a), invalid);
}

std::shared_ptr<Task> Communicator::reduceScatter(const void* send, void* recv,
                                                  const std::vector<size_t>& counts, DataType dtype,
                                                  ReduceOp op, double premulFactor) {
  return reduceScatterWith(send, recv, counts, dtype, op, premulFactor, nullptr);
}

std::shared_ptr<Task> Communicator::reduceScatterCompressed(const void* send, void* recv,
                                                            const std::vector<size_t>& counts,
                                                            DataType dtype, ReduceOp op,
                                                            const CompressionRequest& compression,
                                                            double premulFactor) {
  return reduceScatterWith(send, recv, counts, dtype, op, premulFactor, &compression);
}

std::shared_ptr<Task> Communicator::reduceScatterWith(const void* send, void* recv,
                                                      const std::vector<size_t>& counts,
                                                      DataType dtype, ReduceOp op,
                                                      double premulFactor,
                                                      const CompressionRequest* request) {
  CallArgs a;
  a.op = OpType::kReduceScatter;
  a.dtype = dtype;
  a.redop = op;
  a.premulFactor = premulFactor;
  a.send = send;
  a.recv = recv;
  a.counts = counts;
  const Status invalid =
      firstError([&] { return checkDataType(dtype); }, [&] { return checkReduction(op, dtype); },
                 [&] { return checkCounts("counts", counts, size()); },
                 [&] { return checkBuffer("send", send, sum(counts)); },
                 [&] { return checkBuffer("recv", recv, counts[rank()]); },
                 [&] { return impl_->chooseCodec(a, request); });
  if (invalid.isOk()) a.count = counts[rank()];
  const size_t total = invalid.isOk() ? sum(counts) : 0;
  return impl_->submit(OpFingerprint{OpType::kReduceScatter, dtype, op, -1, total, 0}, std::move(a),
                       invalid);
}

std::shared_ptr<Task> Communicator::alltoall(const void* send,
                                             const std::vector<size_t>& sendCounts, void* recv,
                                             const std::vector<size_t>& recvCounts,
                                             DataType dtype) {
  CallArgs a;
  a.op = OpType::kAlltoall;
  a.dtype = dtype;
  a.send = send;
  a.recv = recv;
  a.counts = sendCounts;
  a.recvCounts = recvCounts;
  const Status invalid = firstError(
      [&] { return checkDataType(dtype); },
      [&] { return checkCounts("sendCounts", sendCounts, size()); },
      [&] { return checkCounts("recvCounts", recvCounts, size()); },
      [&] {
        return sendCounts[rank()] == recvCounts[rank()]
                   ? Status::ok()
                   : invalidArgument("this rank sends itself " +
                                     std::to_string(sendCounts[rank()]) + " elements but expects " +
                                     std::to_string(recvCounts[rank()]));
      },
      [&] { return checkBuffer("send", send, sum(sendCounts)); },
      [&] { return checkBuffer("recv", recv, sum(recvCounts)); });
  return impl_->submit(OpFingerprint{OpType::kAlltoall, dtype, ReduceOp::kSum, -1, 0, 0},
                       std::move(a), invalid);
}

// Only the root knows the per-rank sizes of gather and scatter, so their fingerprint carries
// count 0 (like alltoall) and the transport's per-message length check catches disagreements.
std::shared_ptr<Task> Communicator::gather(const void* send, size_t sendCount, void* recv,
                                           const std::vector<size_t>& recvCounts, DataType dtype,
                                           int root) {
  CallArgs a;
  a.op = OpType::kGather;
  a.dtype = dtype;
  a.send = send;
  a.recv = recv;
  a.count = sendCount;
  a.root = root;
  const bool isRoot = root == rank();
  if (isRoot) a.counts = recvCounts;
  const Status invalid = firstError(
      [&] { return checkDataType(dtype); }, [&] { return checkRoot(root, size()); },
      [&] { return isRoot ? checkCounts("recvCounts", recvCounts, size()) : Status::ok(); },
      [&] {
        return !isRoot || recvCounts[rank()] == sendCount
                   ? Status::ok()
                   : invalidArgument("recvCounts[root] is " + std::to_string(recvCounts[rank()]) +
                                     " but the root's sendCount is " + std::to_string(sendCount));
      },
      [&] { return checkBuffer("send", send, sendCount); },
      [&] { return isRoot ? checkBuffer("recv", recv, sum(recvCounts)) : Status::ok(); });
  return impl_->submit(OpFingerprint{OpType::kGather, dtype, ReduceOp::kSum, root, 0, 0},
                       std::move(a), invalid);
}

std::shared_ptr<Task> Communicator::scatter(const void* send, const std::vector<size_t>& sendCounts,
                                            void* recv, size_t recvCount, DataType dtype,
                                            int root) {
  CallArgs a;
  a.op = OpType::kScatter;
  a.dtype = dtype;
  a.send = send;
  a.recv = recv;
  a.count = recvCount;
  a.root = root;
  const bool isRoot = root == rank();
  if (isRoot) a.counts = sendCounts;
  const Status invalid = firstError(
      [&] { return checkDataType(dtype); }, [&] { return checkRoot(root, size()); },
      [&] { return isRoot ? checkCounts("sendCounts", sendCounts, size()) : Status::ok(); },
      [&] {
        return !isRoot || sendCounts[rank()] == recvCount
                   ? Status::ok()
                   : invalidArgument("sendCounts[root] is " + std::to_string(sendCounts[rank()]) +
                                     " but the root's recvCount is " + std::to_string(recvCount));
      },
      [&] { return isRoot ? checkBuffer("send", send, sum(sendCounts)) : Status::ok(); },
      [&] { return checkBuffer("recv", recv, recvCount); });
  return impl_->submit(OpFingerprint{OpType::kScatter, dtype, ReduceOp::kSum, root, 0, 0},
                       std::move(a), invalid);
}

std::shared_ptr<Task> Communicator::send(const void* buf, size_t count, DataType dtype, int peer,
                                         uint32_t tag) {
  return impl_->postP2p(true, const_cast<void*>(buf), count, dtype, peer, tag);
}

std::shared_ptr<Task> Communicator::recv(void* buf, size_t count, DataType dtype, int peer,
                                         uint32_t tag) {
  return impl_->postP2p(false, buf, count, dtype, peer, tag);
}

std::shared_ptr<Task> Communicator::barrier() {
  CallArgs a;
  a.op = OpType::kBarrier;
  return impl_->submit(OpFingerprint{OpType::kBarrier, DataType::kUInt8, ReduceOp::kSum, -1, 0, 0},
                       std::move(a), Status::ok());
}

std::shared_ptr<Task> Communicator::refusedCall() {
  CallArgs a;
  a.op = OpType::kBarrier;
  return impl_->submit(
      OpFingerprint{OpType::kBarrier, DataType::kUInt8, ReduceOp::kSum, kRefusedCallRoot, 0, 0},
      std::move(a), Status::ok());
}

}  // namespace nanoccl
