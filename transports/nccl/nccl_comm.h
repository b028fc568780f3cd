// NcclComm: an NCCL communicator over the ranks of one node, for CUDA buffers.
//
// Setup is two-phase, like the other transports (transport.h): the layer above does the store
// exchange. One rank calls newUniqueId() and publishes the bytes; every rank (that one
// included) passes them to create(). Nothing here knows the Store.
//
// Nothing hangs: the communicator is non-blocking (ncclConfig_t::blocking = 0), so every NCCL
// call returns at once and is then settled by polling ncclCommGetAsyncError against the
// caller's deadline. A call that fails, or is still in progress at the deadline, aborts the
// communicator (ncclCommAbort) and returns the error; every later call fails with it. A peer
// that dies after a collective was enqueued shows up as that collective never completing on
// the stream: the caller watches its own events against its deadline and calls abort(), which
// makes the kernels of the aborted communicator return.
//
// No CUDA or NCCL type appears here, so callers need neither header: streams are cudaStream_t
// passed as void* (nullptr: the legacy default stream), buffers are device pointers.
//
// Threads and ownership: one thread at a time drives a NcclComm (NCCL's rule, and every rank
// must issue the calls in the same order); create() and every call also make the comm's device
// the calling thread's current CUDA device. Each collective is enqueued on `stream` and returns
// once it is enqueued, not done: the buffers belong to the stream until its work completes.
// The destructor aborts a communicator that close() did not finalize.
#pragma once

#include <memory>
#include <string>

#include "common/deadline.h"
#include "common/dtype.h"
#include "common/status.h"

namespace nanoccl {

class NcclComm {
 public:
  // Whether this build has NCCL (NANOCCL_WITH_CUDA).
  static bool built();
  // Whether NCCL reduces (or, with op = kNumOps, moves) `t` with `op` on the device:
  // float32/64, float16, bfloat16, int8, uint8, int32, int64; sum, product, min, max, avg, and
  // premul_sum on floating point.
  static bool supports(DataType t, ReduceOp op);

  // The bytes of a fresh ncclUniqueId (ncclGetUniqueId: opens NCCL's bootstrap listener).
  static Result<std::string> newUniqueId();
  // Joins the communicator `uniqueId` names as `rank` of `size`, on CUDA device `device`.
  // Bounded by `deadline` (all `size` ranks must call it).
  static Result<std::unique_ptr<NcclComm>> create(const std::string& uniqueId, int rank,
                                                  int size, int device,
                                                  const Deadline& deadline);
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int device() const { return device_; }

  // The collectives, with NCCL's buffer rules (in place when send == recv; reduceScatter in
  // place when send + rank * recvCount == recv; allgather when recv + rank * sendCount == send).
  // kPremulSum multiplies each rank's input by `premulFactor` first. `count`s are elements.
  Status allreduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                   double premulFactor, void* stream, const Deadline& deadline);
  Status reduceScatter(const void* send, void* recv, size_t recvCount, DataType dtype,
                       ReduceOp op, double premulFactor, void* stream, const Deadline& deadline);
  Status allgather(const void* send, void* recv, size_t sendCount, DataType dtype, void* stream,
                   const Deadline& deadline);
  Status broadcast(const void* send, void* recv, size_t count, DataType dtype, int root,
                   void* stream, const Deadline& deadline);
  // The result lands in `recv` on `root` only.
  Status reduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                double premulFactor, int root, void* stream, const Deadline& deadline);

  // An asynchronous error of the communicator (a network failure, a peer's abort), or ok.
  // An error aborts the communicator.
  Status check();
  // Aborts the communicator: its enqueued kernels return, every later call fails. Idempotent.
  void abort(const Status& why);
  // Finalizes and destroys the communicator once its enqueued work is done, within `deadline`
  // (then aborts it). Idempotent; later calls fail.
  Status close(const Deadline& deadline);

 private:
  struct Impl;
  NcclComm(std::unique_ptr<Impl> impl, int rank, int size, int device);

  std::unique_ptr<Impl> impl_;
  int rank_;
  int size_;
  int device_;
};

}  // namespace nanoccl
