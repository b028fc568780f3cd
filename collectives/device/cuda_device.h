// CudaDevice: the Device (device.h) of one CUDA GPU for one communicator's calls: the only code
// of the collectives engine that needs a GPU to run (with the codec kernels). No CUDA or NCCL
// type here (streams are cudaStream_t passed as void*), so callers need neither header; in a
// build without NANOCCL_WITH_CUDA, create() says why there is no CUDA.
// - The queue is a CUDA stream the caller owns (the process group's internal stream, one of
//   torch's pool streams): copies are cudaMemcpyAsync on it, fences CUDA events recorded on it.
// - Staging slots are page-locked host memory (cudaHostAlloc), so copies are true DMA.
// - The node stage is NCCL over the node's ranks, on the same stream. Its communicator is made
//   at the first node stage: local rank 0 makes the unique id and sends it to the others over
//   the node's own transport (the running call's Context), so there is no store key and no
//   connection of its own besides NCCL's.
// - passed() also reads NCCL's asynchronous error; abort() aborts the NCCL communicator, so
//   kernels waiting for a dead peer return.
// Threads: as Device. Every method makes the device current on the calling thread.
#pragma once

#include <memory>
#include <string>

#include "collectives/device/device.h"

namespace nanoccl {

class CudaDevice : public Device {
 public:
  // Whether this build has CUDA and NCCL.
  static bool built();
  // Whether NCCL reduces (or, with kNumOps, moves) `dtype` with `op`.
  static bool reduces(DataType dtype, ReduceOp op);
  // The device `device` (an index) queuing on `stream` (a cudaStream_t of that device, owned by
  // the caller, outliving the CudaDevice). kUnavailable without CUDA in the build or a device.
  static Result<std::shared_ptr<CudaDevice>> create(int device, void* stream);
  ~CudaDevice() override;  // aborts NCCL unless shutdown() closed it; frees the staging memory
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  // A fence at the current end of `stream` (a caller's stream at a call's issue: Fence for
  // DeviceCall::after).
  Result<std::shared_ptr<Fence>> recordOn(void* stream);
  // Makes `stream` wait on the GPU for `fence` (Work.wait(): the caller's stream waits for the
  // call, the host does not).
  Status blockStream(const Fence& fence, void* stream);
  // Waits (until `deadline`) for the queued work, then closes NCCL; abort() past the deadline.
  void shutdown(const Deadline& deadline);

  std::string describe() const override;
  bool supports(DataType dtype, ReduceOp op) const override { return reduces(dtype, op); }
  // A pinned copy's rate, each way, timed at create(); NCCL's node stage on PCIe GPUs (no
  // NVLink) moves at about the same rate.
  double copyMBps() const override;
  double nodeMBps() const override { return copyMBps(); }
  Status queueWait(const Fence& fence) override;
  Status copy(void* dst, const void* src, size_t bytes) override;
  Result<std::shared_ptr<Fence>> record() override;
  Result<bool> passed(const Fence& fence) override;
  Result<char*> staging(int slot, size_t bytes) override;
  Status nodeStage(detail::Context& node, const detail::CallArgs& call,
                   uint32_t tagBase) override;
  void abort(const Status& why) override;

 private:
  struct Impl;
  explicit CudaDevice(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace nanoccl
