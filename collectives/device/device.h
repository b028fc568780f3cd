// Device: the seam between the collectives engine and memory the host does not touch directly
// (a GPU's). A call on device buffers is an ordinary call of a Communicator (CallArgs::device);
// the device rows of the algorithm table (collectives/device/rows.cc) run it through this
// interface, on the thread that runs the call, like every other row. Two implementations:
//   - the CUDA device (backend/, only where the build has CUDA): copies are cudaMemcpyAsync on
//     the group's internal stream, fences are CUDA events, the node stage is NCCL;
//   - HostDevice (host_device.h): device memory is host memory, copies are memcpy run on the
//     device's own worker thread in queue order, the node stage is the CPU algorithms over the
//     node's transport (shm). It runs the same plans as the CUDA device, so the C++ suites prove
//     them on any machine (ctest -R Device).
//
// The model is a CUDA stream: a device has one queue; copies and node stages are queued and run
// in queue order, after whatever the queue waits for (queueWait). The host sees the queue's
// progress only through fences (record, passed, waitFence). A plan that reads host staging
// memory must first wait for a fence recorded after the copy that fills it.
//
// Threads and ownership
// - One call at a time uses a device's queue: the thread running the call (the communicator's
//   worker, or a caller in Task::runHere) calls queueWait, copy, record, staging and nodeStage.
//   passed() and abort() may be called from any thread (the communicator's watchdog polls the
//   calls in flight).
// - The caller owns the device buffers of a call until the call's end fence has passed (the
//   torch glue holds its tensors until then) or the device was aborted.
// - Staging memory belongs to the device and lives until it is destroyed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/deadline.h"
#include "common/dtype.h"
#include "common/status.h"

namespace nanoccl {
namespace detail {
class Context;
struct CallArgs;
}  // namespace detail

// A point in a device's queue (CUDA: an event). Made by Device::record() of the same device.
class Fence {
 public:
  virtual ~Fence() = default;
};

class Device {
 public:
  virtual ~Device() = default;

  // "cuda:0", "host device": for logs and errors.
  virtual std::string describe() const = 0;
  // Whether the node stage reduces `dtype` with `op` (kNumOps: data movement, every type).
  virtual bool supports(DataType dtype, ReduceOp op) const = 0;
  // What the cost model prices the device rows with (cost_model.h), measured when the device
  // was made: one copy between device and staging memory (MB/s), and the node stage's rate a
  // rank (MB/s; 0: the node's transport, the link profile's intra-node class).
  virtual double copyMBps() const = 0;
  virtual double nodeMBps() const = 0;

  // Work queued after this waits until the device has passed `fence` (a fence of this device,
  // e.g. the caller's position at the call's issue).
  virtual Status queueWait(const Fence& fence) = 0;
  // Queues a copy of `bytes` from `src` to `dst`, each device or staging memory.
  virtual Status copy(void* dst, const void* src, size_t bytes) = 0;
  // A fence after everything queued so far.
  virtual Result<std::shared_ptr<Fence>> record() = 0;
  // Whether the device has passed `fence`, without blocking; an error if the device failed
  // (aborted, or an asynchronous error such as NCCL's). Any thread.
  virtual Result<bool> passed(const Fence& fence) = 0;
  // Host memory of at least `bytes` that copies run fast to and from (CUDA: page-locked), one
  // buffer per `slot` (0 <= slot < kStagingSlots), kept between calls. Growing a slot frees its
  // old memory: the caller makes sure no queued copy still uses it.
  static constexpr int kStagingSlots = 3;
  virtual Result<char*> staging(int slot, size_t bytes) = 0;

  // The node stage: one collective among the ranks of this rank's node on device memory,
  // queued like a copy. `node` is the running call's Context of those ranks (its rank is the
  // local rank); every one of them queues the same stages in the same order. `call` gives
  // op, dtype, redop, premulFactor, root, send, recv, count and counts (CallArgs' meaning, in
  // elements; kReduce and kBroadcast in place on recv). kAvg divides by the node's size. The
  // stage's messages on `node` use tags [tagBase, tagBase + kNodeStageTags).
  static constexpr uint32_t kNodeStageTags = uint32_t{1} << 24;
  virtual Status nodeStage(detail::Context& node, const detail::CallArgs& call,
                           uint32_t tagBase) = 0;

  // Fails the device: queued work is dropped or ended (CUDA: the NCCL communicator aborted),
  // passed() reports `why` from now on. Idempotent; any thread.
  virtual void abort(const Status& why) = 0;
};

// Waits on the host until `device` has passed `fence`, polling (a copy of a chunk takes a
// fraction of a millisecond: short sleeps first, then up to 200 us). kTimeout naming `what` when
// `deadline` passes first; the device's error when it fails.
Status waitFence(Device& device, const Fence& fence, const Deadline& deadline, const char* what);

}  // namespace nanoccl
