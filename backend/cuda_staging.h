// CudaGroup: the collectives of one process group on CUDA buffers, one device per rank, with
// ProcessGroupNCCL's stream semantics. No torch and no CUDA type here (streams and pointers are
// void*), so it builds and tests without torch; backend/cuda_work.h is its torch face.
//
// Plans (topology = the group communicator's, collectives/topology.h):
// - One node: the call is one NCCL collective over the node's ranks (transports/nccl/).
// - Several nodes, allreduce: intra-node NCCL reduce-scatter into shards, local rank s of every
//   node allreduces shard s through pinned host memory with local rank s of the other nodes (a
//   CPU Communicator of its own: the CPU path's algorithms and TCP), then intra-node NCCL
//   allgather. The shard goes through the host chunk by chunk: the copy to the host of chunk
//   c + 1 and the copy back of chunk c - 1 overlap the network allreduce of chunk c. As in the
//   CPU hierarchical algorithms, there are S = the smallest node's local size shards (local
//   ranks >= S carry none; with S < local size NCCL reduces to and broadcasts from each
//   shard's local rank instead); one-rank nodes use no NCCL at all, only the staging.
// - Several nodes, broadcast / allgather / reduce_scatter: the buffers go through pinned host
//   memory and a CPU Communicator of the whole group (broadcast chunk by chunk), so the
//   inter-node part is whatever the CPU path does for that call (hierarchical where it pays).
// AVG divides once, by the group size, on the host (common/reduce.h divideInPlace); PREMUL_SUM
// scales each rank's input once, in the first stage that reduces it.
//
// Stream semantics (ProcessGroupNCCL's)
// - submit() records an event on the caller's stream at once; the call's first operation on
//   the group's internal stream waits for it, so the call reads its inputs as the caller's
//   stream left them at the call, never earlier.
// - Every operation of a call runs on the internal stream (the caller provides it: torch's pool
//   stream, so its caching allocator can track the tensors); at the end the job records its
//   end event there. CudaJob::blockStream() makes another stream (the caller's current one, in
//   Work.wait()) wait for that event on the GPU, without blocking the host.
// - The caller keeps the buffers alive until CudaJob::done() (backend/cuda_work.cc holds the
//   tensors until then and also records them on the internal stream).
//
// Threads: submit() may be called from any thread; the calls' order is their submit() order,
// and every rank of the group must submit the same calls in the same order (as for the CPU
// Communicator). One thread of the group (the "executor") runs the calls in that order: it
// issues every NCCL call (NCCL needs one order and one caller per communicator), waits for the
// host stages and watches finished calls' end events. CudaJob callbacks run on it.
//
// Nothing hangs: each call has the group's timeout as its deadline, for its host stages and for
// its GPU stages (the executor watches the end event, and the NCCL communicator's asynchronous
// errors); a call that misses it fails, and so does the group: the NCCL communicator is aborted
// (its kernels return) and every pending and later call fails with the first error.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/store.h"
#include "collectives/topology.h"
#include "common/config.h"
#include "common/deadline.h"
#include "common/dtype.h"
#include "common/op.h"
#include "common/status.h"

namespace nanoccl {

struct CudaGroupOptions {
  int rank = 0;
  int size = 1;
  // The group communicator's topology (which ranks share a node).
  Topology topology;
  // Rendezvous for the NCCL unique ids and the staging communicators; their keys live under
  // "nanoccl/<commId>.cuda...", apart from the group communicator's.
  std::shared_ptr<Store> store;
  std::string commId = "0";
  Config config;
  // Every call's deadline, host and GPU stages together.
  std::chrono::milliseconds timeout{300000};
  int device = 0;
  // The cudaStream_t every call runs on. Owned by the caller; it must outlive the group.
  void* stream = nullptr;
};

// One call on device buffers.
struct CudaCall {
  OpType op = OpType::kAllreduce;  // kAllreduce, kBroadcast, kAllgather or kReduceScatter
  DataType dtype = DataType::kFloat32;
  ReduceOp redop = ReduceOp::kSum;
  double premulFactor = 1.0;
  int root = 0;  // broadcast
  // allreduce, broadcast: `count` elements, in place on `recv` (`send` == `recv` or null).
  // allgather: `count` elements at `send`; `recv` gets size x count, in rank order.
  // reduce_scatter: size x count elements at `send`; `recv` gets this rank's `count`.
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  // Runs on the executor thread after the call's last collective operation and before its end
  // event: it may enqueue more work on the internal stream (copying a result into the
  // caller's tensors), which Work.wait() then covers. An error fails the call.
  std::function<Status()> epilogue;
};

// One submitted call. Thread-safe.
class CudaJob {
 public:
  struct Impl;  // cuda_staging.cc: events, state, callbacks
  explicit CudaJob(std::unique_ptr<Impl> impl);
  ~CudaJob();
  CudaJob(const CudaJob&) = delete;
  CudaJob& operator=(const CudaJob&) = delete;

  // Until every GPU operation of the call is enqueued on the internal stream (its host stages
  // are then over), or it failed, or `deadline` passed (kTimeout; the call goes on).
  Status waitEnqueued(const Deadline& deadline) const;
  // Makes `stream` wait on the GPU for the call's end (cudaStreamWaitEvent); once enqueued.
  Status blockStream(void* stream) const;
  // Done on the GPU, or failed.
  bool finished() const;
  // The first error, or ok.
  Status status() const;
  // `cb` runs once with ok when the call is enqueued (its end event is recorded), or with the
  // error if it fails first; on the executor thread, or here if that already happened.
  void onEnqueued(std::function<void(const Status&)> cb);
  // `cb` runs once when the call is done on the GPU (ok) or failed (the error); likewise.
  void onFinished(std::function<void(const Status&)> cb);

  Impl& impl() { return *impl_; }  // for CudaGroup's executor

 private:
  std::unique_ptr<Impl> impl_;
};

class CudaGroup {
 public:
  // Whether this build has CUDA and NCCL (NANOCCL_WITH_CUDA).
  static bool built();
  // Whether NCCL and the CPU reductions both take `dtype` with `op` (kNumOps: data movement
  // only, which takes every type as bytes).
  static bool supports(DataType dtype, ReduceOp op);

  // Starts the executor; communicators are created when a call first needs them (all ranks
  // reach that call), within that call's deadline.
  static Result<std::shared_ptr<CudaGroup>> create(const CudaGroupOptions& options);
  // Aborts what is pending (abort()), stops the executor and frees the group's memory.
  ~CudaGroup();
  CudaGroup(const CudaGroup&) = delete;
  CudaGroup& operator=(const CudaGroup&) = delete;

  int device() const;
  // Queues `call` behind the work queued on `callerStream` so far (see above). Fails at once
  // (invalid call, failed group) without queueing anything.
  Result<std::shared_ptr<CudaJob>> submit(const CudaCall& call, void* callerStream);
  // Fails every pending and later call with `why` and aborts the communicators. Idempotent.
  void abort(const Status& why);
  // Lets the submitted calls finish (bounded by their deadlines and `deadline`), then closes the
  // communicators. Later submits fail.
  void shutdown(const Deadline& deadline);

  // Bytes the staging communicators moved, under the group's ranks, and calls per plan
  // ("allreduce/cuda_nccl", "allreduce/cuda_staged", ...) in callsPerAlgorithm.
  CommStats stats() const;

 private:
  struct Impl;
  explicit CudaGroup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace nanoccl
