// CudaGroup's private half (backend/cuda_staging.h): CudaJob::Impl, CudaGroup::Impl (the group's
// state and the declarations of its executor, communicators and plans) and the CUDA helpers both
// halves use. Included only by cuda_staging.cc (CudaJob, the executor thread, the communicators,
// the public calls) and cuda_staging_plans.cc (the plans and the pinned-memory staging).
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda_staging.h"
#include "common/completion.h"
#include "transports/nccl/nccl_comm.h"

namespace nanoccl {
namespace cuda_staging {

// The staging unit: large enough that a chunk's network allreduce dwarfs its fixed costs, small
// enough that the copies of the neighbouring chunks hide behind it. Two pinned buffers of it.
constexpr size_t kChunkBytes = size_t{4} << 20;
constexpr int kChunkBuffers = 2;

inline Status cudaFailed(const std::string& what, cudaError_t e) {
  (void)cudaGetLastError();  // clear a non-sticky error so that later calls do not see it
  const std::string message = what + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e);
  if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ||
      e == cudaErrorInvalidDevice) {
    return unavailableError(message);
  }
  return internalError(message);
}

}  // namespace cuda_staging

#define NANOCCL_CUDA(what, expr)                                             \
  do {                                                                       \
    const cudaError_t nanoccl_cuda_error_ = (expr);                          \
    if (nanoccl_cuda_error_ != cudaSuccess) {                                \
      return ::nanoccl::cuda_staging::cudaFailed(what, nanoccl_cuda_error_); \
    }                                                                        \
  } while (0)

namespace cuda_staging {

// Page-locked host memory (cudaHostAlloc), so that copies are true asynchronous DMA.
class PinnedBuffer {
 public:
  ~PinnedBuffer() { release(); }
  char* data() const { return p_; }
  size_t bytes() const { return bytes_; }
  // At least `bytes`. The caller guarantees that no pending copy uses the old memory.
  Status ensure(size_t bytes) {
    if (bytes <= bytes_) return Status::ok();
    release();
    void* p = nullptr;
    NANOCCL_CUDA("cudaHostAlloc(" + std::to_string(bytes) + " bytes)",
                 cudaHostAlloc(&p, bytes, cudaHostAllocDefault));
    p_ = static_cast<char*>(p);
    bytes_ = bytes;
    return Status::ok();
  }
  void release() {
    if (p_ != nullptr) (void)cudaFreeHost(p_);
    p_ = nullptr;
    bytes_ = 0;
  }
  // Forgets the memory without freeing it: a copy the device never finished may still target it.
  void leak() {
    p_ = nullptr;
    bytes_ = 0;
  }

 private:
  char* p_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace cuda_staging

struct CudaJob::Impl {
  enum class Phase { kEnqueued, kDone, kFailed };

  CudaCall call;
  Deadline deadline = Deadline::never();
  cudaEvent_t start = nullptr;  // recorded on the caller's stream at submit()
  cudaEvent_t end = nullptr;    // recorded on the internal stream after the call's last operation

  // The two stages (common/completion.h): every operation enqueued on the internal stream (ok,
  // or the error that came first), then done on the GPU (ok) or failed.
  Completion enqueued;
  Completion finished;

  ~Impl() {
    // Destroying an event whose record is still pending is allowed: CUDA frees it once reached.
    if (start != nullptr) (void)cudaEventDestroy(start);
    if (end != nullptr) (void)cudaEventDestroy(end);
  }

  // Moves forward (enqueued -> done, or failed from anywhere before done); the callbacks that
  // become due run on this thread. A stage already over stays as it was.
  void advance(Phase to, const Status& why) {
    if (finished.done()) return;
    const Status s = to == Phase::kFailed ? why : Status::ok();
    enqueued.complete(s);
    if (to != Phase::kEnqueued) finished.complete(s);
  }

  // The first error, or ok.
  Status status() const {
    if (finished.done()) return finished.status();
    return enqueued.done() ? enqueued.status() : Status::ok();
  }
};

struct CudaGroup::Impl {
  using Phase = CudaJob::Impl::Phase;
  using JobPtr = std::shared_ptr<CudaJob>;

  CudaGroupOptions o;
  cudaStream_t stream = nullptr;
  // This rank's place: m nodes, this node's index, local rank and local size; `shards` local
  // ranks of every node carry the allreduce across nodes (the smallest local size).
  int m = 1, node = 0, local = 0, localSize = 1, shards = 1;

  std::thread executor;
  mutable std::mutex mu;
  std::condition_variable cv;
  std::deque<JobPtr> queue;
  bool stopping = false;
  bool exited = false;
  std::condition_variable exitedCv;
  Status failed;                          // sticky: the first error
  std::atomic<bool> aborting{false};      // failed is set and the executor has not acted yet
  std::shared_ptr<Communicator> world;    // every rank, for the staged broadcast/gathers
  std::shared_ptr<Communicator> cross;    // local rank `local` of every node (allreduce)
  std::map<std::string, uint64_t> plans;  // calls per plan, for stats()

  // Executor only.
  std::unique_ptr<NcclComm> nccl;
  std::vector<JobPtr> watching;  // enqueued, not known done; in call order
  cuda_staging::PinnedBuffer chunks[cuda_staging::kChunkBuffers];
  cuda_staging::PinnedBuffer bulk;
  cudaEvent_t ready[cuda_staging::kChunkBuffers] = {};
  cudaEvent_t marker = nullptr;
  bool reported = false;  // the failure was logged

  // ---- executor (cuda_staging.cc) --------------------------------------------------------

  void loop();
  Status failedStatus() const;
  void failEverything(const Status& why);
  void watch();
  Status waitEvent(cudaEvent_t e, const Deadline& deadline, const char* what);
  Status drain(const Deadline& deadline);
  void teardown();

  // ---- communicators (cuda_staging.cc; created by the executor, when a call first needs them)

  Result<NcclComm*> ensureNccl(const Deadline& deadline);
  Result<std::shared_ptr<Communicator>> ensureWorld();
  Result<std::shared_ptr<Communicator>> ensureCross();

  // ---- plans (cuda_staging_plans.cc) -----------------------------------------------------

  Status runJob(CudaJob& job);
  Status singleNode(const CudaCall& c, const Deadline& d);
  Status hierarchicalAllreduce(const CudaCall& c, const Deadline& d);
  Status stagedBroadcast(const CudaCall& c, const Deadline& d);
  Status stagedGather(const CudaCall& c, const Deadline& d);
  Status stage(char* dev, size_t n, size_t es, bool download, bool upload,
               const std::function<Status(void*, size_t)>& hostOp, const Deadline& d);
};

}  // namespace nanoccl
