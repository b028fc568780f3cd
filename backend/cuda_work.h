// CudaCollectives: the torch face of CudaGroup (cuda_staging.h) for one ProcessGroupNanoccl:
// torch's streams, caching allocator and CUDA-aware futures around the engine, as
// ProcessGroupNCCL does it.
//
// Only c10's device-generic interfaces are used (c10::impl::DeviceGuardImplInterface,
// c10::Stream::native_handle, c10::StreamGuard): this file builds against a CPU torch too,
// and at run time reaches torch's CUDA side only where torch has one.
//
// What a call does (run()), ProcessGroupNCCL's semantics:
// - the group's internal stream (one of torch's pool streams for the device) waits for the
//   caller's current stream at the call: the call sees its inputs as the caller left them;
// - the tensors are recorded on the internal stream (recordStream) and also held until the GPU
//   is done, so the caching allocator never hands their memory out under the collective;
// - Work::wait() waits on the host only for the call's host stages (network legs through
//   pinned memory), then makes the caller's current stream wait for the call's end event: the
//   result is visible to later work on that stream, without synchronizing the host with the GPU;
// - Work::getFuture() is CUDA-aware (torch's Future with the device): it completes when the call
//   is enqueued, with events on the internal stream that its users' streams then wait on;
// - Work::isCompleted() is true once the GPU finished the call (or it failed).
//
// Threads: run() on the caller's thread, one call at a time per group (the process group's
// order); the Work's future completes, and its callbacks run, on the callback runner
// (common/callback_runner.h: never on the executor, which a callback's own CUDA call needs),
// under a StreamGuard of the internal stream (as ProcessGroupNCCL runs them under its NCCL
// stream).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

#include "backend/cuda_staging.h"
#include "common/status.h"

namespace nanoccl {

class CudaCollectives {
 public:
  // Whether this build has CUDA and NCCL.
  static bool built() { return CudaGroup::built(); }

  // Creates the group's CUDA side on `device` (the device of its first CUDA tensor): a pool
  // stream and a CudaGroup. `options.device` and `options.stream` are set here. kUnavailable
  // without CUDA in the build or in torch.
  static Result<std::unique_ptr<CudaCollectives>> create(CudaGroupOptions options,
                                                         const c10::Device& device);
  ~CudaCollectives();

  const c10::Device& device() const { return device_; }

  // The collectives on CUDA tensors of this group's device. The reductions take the dtype and
  // op the backend mapped. kInvalidArgument: the call is rejected (nothing was queued); any
  // other error: the group failed earlier. In-place tensors (allreduce, broadcast) and the
  // flat outputs must be contiguous; other inputs go through a contiguous copy on the caller's
  // stream, list outputs get their parts by copies on the internal stream.
  using WorkResult = Result<c10::intrusive_ptr<c10d::Work>>;
  WorkResult allreduce(const at::Tensor& tensor, DataType dtype, ReduceOp op, double factor);
  WorkResult broadcast(const at::Tensor& tensor, int root);
  WorkResult allgather(const std::vector<at::Tensor>& outputs, const at::Tensor& input);
  WorkResult allgatherBase(const at::Tensor& output, const at::Tensor& input);
  WorkResult reduceScatter(const at::Tensor& output, const std::vector<at::Tensor>& inputs,
                           DataType dtype, ReduceOp op, double factor);
  WorkResult reduceScatterBase(const at::Tensor& output, const at::Tensor& input, DataType dtype,
                               ReduceOp op, double factor);

  void abort(const Status& why) { group_->abort(why); }
  void shutdown(const Deadline& deadline) { group_->shutdown(deadline); }
  CommStats stats() const { return group_->stats(); }

 private:
  CudaCollectives(std::shared_ptr<CudaGroup> group, const CudaGroupOptions& options,
                  c10::Device device, c10::Stream stream);

  // A CUDA tensor of this group's device (kInvalidArgument naming `what` otherwise).
  Status check(const at::Tensor& t, const char* what, bool contiguous) const;
  // Submits `call`, whose pointers point into `tensors` (kept alive until the GPU is done);
  // `epilogue` (optional) runs on the internal stream before the end event. The Work's
  // result() and future give `outputs`.
  WorkResult run(CudaCall call, c10d::OpType type, const char* what,
                 std::vector<at::Tensor> tensors, std::vector<at::Tensor> outputs,
                 std::function<void()> epilogue = nullptr);

  std::shared_ptr<CudaGroup> group_;
  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  c10::Device device_;
  c10::Stream stream_;  // the internal stream, a torch pool stream
};

}  // namespace nanoccl
