// HostDevice: a Device (device.h) whose memory is host memory, for running the device rows of
// the algorithm table without a GPU. It is not a mock of results: the plans run exactly as on
// the CUDA device, only the bytes stay in host memory.
// - Copies are memcpy run on the device's own worker thread ("nanoccl-hdev"), in queue order,
//   after the caller has moved on (as cudaMemcpyAsync on a stream): a plan that reads staging
//   memory before waiting for the fence of the copy that fills it reads stale bytes. Tests can
//   slow every queued operation down (setOpDelay) so that such a race shows every time.
// - The node stage waits until the queue has run everything queued before it (stream order),
//   then runs the CPU building blocks (ring reduce-scatter and allgather, binomial trees) over
//   the node's transport on the calling thread, within the call's deadline.
// - Fences are positions in the queue.
// Threads: as Device; the test hooks from any thread.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "collectives/device/device.h"

namespace nanoccl {

class HostDevice : public Device {
 public:
  HostDevice();
  ~HostDevice() override;  // drops what is still queued and joins the worker
  HostDevice(const HostDevice&) = delete;
  HostDevice& operator=(const HostDevice&) = delete;

  std::string describe() const override { return "host device"; }
  bool supports(DataType dtype, ReduceOp op) const override;
  double copyMBps() const override;  // memcpy's, measured at construction
  double nodeMBps() const override { return 0; }  // the node's shm transport
  Status queueWait(const Fence& fence) override;
  Status copy(void* dst, const void* src, size_t bytes) override;
  Result<std::shared_ptr<Fence>> record() override;
  Result<bool> passed(const Fence& fence) override;
  Result<char*> staging(int slot, size_t bytes) override;
  Status nodeStage(detail::Context& node, const detail::CallArgs& call,
                   uint32_t tagBase) override;
  void abort(const Status& why) override;

  // ---- For tests ----
  // Every queued operation waits this long before it runs (0: none).
  void setOpDelay(std::chrono::microseconds delay);
  // While held, the queue runs nothing (a stalled GPU kernel); hold(false) lets it go on.
  void hold(bool on);
  // Queues `fn` (a kernel on the caller's stream: producing a call's input, reading its result).
  Status enqueue(std::function<void()> fn);
  // Copies queued so far (the node stages not counted).
  uint64_t copies() const;

 private:
  struct State;
  std::shared_ptr<State> s_;
  std::thread worker_;
};

}  // namespace nanoccl
