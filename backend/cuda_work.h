// CudaCollectives: the torch face of a process group's calls on CUDA tensors: torch's streams,
// caching allocator and CUDA-aware futures around the group's Communicator, whose device rows
// (collectives/device/rows.cc) run the calls on a CudaDevice (collectives/device/cuda_device.h),
// as ProcessGroupNCCL does it. The calls are the communicator's own: ordered with its host
// calls, on its transports, in its stats.
//
// Only c10's device-generic interfaces are used (c10::impl::DeviceGuardImplInterface,
// c10::Stream::native_handle, c10::StreamGuard): this file builds against a CPU torch too,
// and at run time reaches torch's CUDA side only where torch has one.
//
// What a call does (run()), ProcessGroupNCCL's semantics:
// - the group's internal stream (one of torch's pool streams for the device) waits for the
//   caller's current stream at the call (DeviceCall::after): the call sees its inputs as the
//   caller left them;
// - the tensors are recorded on the internal stream (recordStream) and held until the call's
//   work is all queued there, so the caching allocator never hands their memory out under it;
// - Work::wait() waits on the host only for the call's host stages (network legs through
//   pinned memory), then makes the caller's current stream wait for the call's end: the
//   result is visible to later work on that stream, without synchronizing the host with the GPU;
// - Work::getFuture() is CUDA-aware (torch's Future with the device): it completes when the call
//   is queued, with events on the internal stream that its users' streams then wait on;
// - Work::isCompleted() is true once the GPU has passed the call's end (or it failed).
//
// Threads: run() on the caller's thread, in the process group's call order; the calls run on
// the communicator's worker (run() hands them over at once). A list output's copies are queued
// on the internal stream by the thread that ran the call, as it completes; the Work's future
// completes, and its callbacks run, on the callback runner (common/callback_runner.h), under a
// StreamGuard of the internal stream (as ProcessGroupNCCL runs them under its NCCL stream).
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

#include "collectives/communicator.h"
#include "collectives/device/cuda_device.h"
#include "common/status.h"

namespace nanoccl {

class CudaCollectives {
 public:
  // Whether this build has CUDA and NCCL.
  static bool built() { return CudaDevice::built(); }

  // The CUDA side of the process group whose communicator is `comm`, on `device` (the device of
  // its first CUDA tensor): a pool stream and a CudaDevice on it. `timeout`: the group's (a
  // Work's wait ends at its call's issue + timeout). kUnavailable without CUDA in the build or
  // in torch.
  static Result<std::unique_ptr<CudaCollectives>> create(std::shared_ptr<Communicator> comm,
                                                         const c10::Device& device,
                                                         std::chrono::milliseconds timeout);
  ~CudaCollectives();

  const c10::Device& device() const { return device_; }

  // The collectives on CUDA tensors of this group's device. The reductions take the dtype and
  // op the backend mapped. kInvalidArgument: the call is rejected (nothing was queued). In-place
  // tensors (allreduce, broadcast) and the flat outputs must be contiguous; other inputs go
  // through a contiguous copy on the caller's stream, list outputs get their parts by copies on
  // the internal stream.
  using WorkResult = Result<c10::intrusive_ptr<c10d::Work>>;
  WorkResult allreduce(const at::Tensor& tensor, DataType dtype, ReduceOp op, double factor);
  // allreduce_compressed: `request`'s codec on the cross-node leg; `residual` (undefined: none)
  // a float32 CPU tensor of the tensor's size, held until the call ends.
  WorkResult allreduceCompressed(const at::Tensor& tensor, const at::Tensor& residual,
                                 std::shared_ptr<CompressionRequest> request, DataType dtype,
                                 ReduceOp op, double factor);
  WorkResult broadcast(const at::Tensor& tensor, int root);
  WorkResult allgather(const std::vector<at::Tensor>& outputs, const at::Tensor& input);
  WorkResult allgatherBase(const at::Tensor& output, const at::Tensor& input);
  WorkResult reduceScatter(const at::Tensor& output, const std::vector<at::Tensor>& inputs,
                           DataType dtype, ReduceOp op, double factor);
  WorkResult reduceScatterBase(const at::Tensor& output, const at::Tensor& input, DataType dtype,
                               ReduceOp op, double factor);

  // Fails the device's queued work (the communicator is aborted by the process group).
  void abort(const Status& why) { cuda_->abort(why); }
  // Lets the device's queued work end (until `deadline`), then closes NCCL.
  void shutdown(const Deadline& deadline) { cuda_->shutdown(deadline); }

 private:
  CudaCollectives(std::shared_ptr<Communicator> comm, std::shared_ptr<CudaDevice> cudaDevice,
                  c10::Device device, c10::Stream stream, std::chrono::milliseconds timeout);

  // A CUDA tensor of this group's device (kInvalidArgument naming `what` otherwise).
  Status check(const at::Tensor& t, const char* what, bool contiguous) const;
  // Issues `call`, whose pointers point into `tensors` (held until it is queued);
  // `copyOut` (optional) runs on the internal stream after it. The Work's result() and future
  // give `outputs`.
  WorkResult run(DeviceCall call, c10d::OpType type, const char* what,
                 std::vector<at::Tensor> tensors, std::vector<at::Tensor> outputs,
                 std::function<void()> copyOut = nullptr);

  std::shared_ptr<Communicator> comm_;
  std::shared_ptr<CudaDevice> cuda_;
  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  c10::Device device_;
  c10::Stream stream_;  // the internal stream, a torch pool stream
};

}  // namespace nanoccl
