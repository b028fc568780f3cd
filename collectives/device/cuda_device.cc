// CudaDevice (cuda_device.h): a CUDA stream as the device queue, events as fences, pinned
// staging memory, NCCL as the node stage.
#include "collectives/device/cuda_device.h"

#include <cuda_runtime_api.h>

#include <mutex>
#include <string>
#include <vector>

#include "collectives/algorithm.h"
#include "common/logging.h"
#include "transports/nccl/nccl_comm.h"

namespace nanoccl {
namespace {

Status cudaFailed(const std::string& what, cudaError_t e) {
  (void)cudaGetLastError();  // clear a non-sticky error so that later calls do not see it
  const std::string message = what + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e);
  if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver || e == cudaErrorInvalidDevice) {
    return unavailableError(message);
  }
  return internalError(message);
}

#define NANOCCL_CUDA(what, expr)                                                      \
  do {                                                                                \
    const cudaError_t nanoccl_cuda_error_ = (expr);                                   \
    if (nanoccl_cuda_error_ != cudaSuccess) return cudaFailed(what, nanoccl_cuda_error_); \
  } while (0)

struct CudaFence : Fence {
  cudaEvent_t event = nullptr;
  // Destroying an event whose record is still pending is allowed: CUDA frees it once reached.
  ~CudaFence() override {
    if (event != nullptr) (void)cudaEventDestroy(event);
  }
};

Result<std::shared_ptr<Fence>> recordEvent(cudaStream_t stream) {
  auto f = std::make_shared<CudaFence>();
  NANOCCL_CUDA("cudaEventCreate", cudaEventCreateWithFlags(&f->event, cudaEventDisableTiming));
  NANOCCL_CUDA("cudaEventRecord", cudaEventRecord(f->event, stream));
  return std::shared_ptr<Fence>(std::move(f));
}

Result<cudaEvent_t> eventOf(const Fence& fence) {
  const auto* f = dynamic_cast<const CudaFence*>(&fence);
  if (f == nullptr) return invalidArgument("a fence of another device");
  return f->event;
}

}  // namespace

struct CudaDevice::Impl {
  int device = 0;
  cudaStream_t stream = nullptr;
  std::mutex mu;  // failed, abortPending, staging
  Status failed;
  bool abortPending = false;  // abort() came while a node stage held NCCL
  std::mutex ncclMu;          // NcclComm is driven by one thread at a time
  std::unique_ptr<NcclComm> nccl;
  struct Pinned {
    char* p = nullptr;
    size_t bytes = 0;
  };
  Pinned slots[kStagingSlots];

  Status failedStatus() {
    std::lock_guard<std::mutex> lock(mu);
    return failed;
  }
};

bool CudaDevice::built() { return true; }

bool CudaDevice::reduces(DataType dtype, ReduceOp op) {
  if (op == ReduceOp::kNumOps) return true;
  return NcclComm::supports(dtype, op) && reduceOpSupported(op, dtype);
}

CudaDevice::CudaDevice(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::shared_ptr<CudaDevice>> CudaDevice::create(int device, void* stream) {
  int devices = 0;
  NANOCCL_CUDA("cudaGetDeviceCount", cudaGetDeviceCount(&devices));
  if (device < 0 || device >= devices) {
    return invalidArgument("CUDA device cuda:" + std::to_string(device) + " of " +
                           std::to_string(devices));
  }
  auto impl = std::make_unique<Impl>();
  impl->device = device;
  impl->stream = static_cast<cudaStream_t>(stream);
  return std::shared_ptr<CudaDevice>(new CudaDevice(std::move(impl)));
}

CudaDevice::~CudaDevice() {
  (void)cudaSetDevice(impl_->device);
  if (impl_->nccl) impl_->nccl->abort(abortedError("the CUDA device was destroyed"));
  impl_->nccl.reset();
  // Nothing may still copy from or to the staging memory: wait for the stream (bounded: the
  // NCCL kernels were aborted), else leave the memory allocated.
  const bool drained = cudaStreamSynchronize(impl_->stream) == cudaSuccess;
  for (Impl::Pinned& s : impl_->slots) {
    if (s.p != nullptr && drained) (void)cudaFreeHost(s.p);
  }
  if (!drained) NANOCCL_WARN("CUDA device: the stream did not drain; staging memory left allocated");
}

std::string CudaDevice::describe() const { return "cuda:" + std::to_string(impl_->device); }

Result<std::shared_ptr<Fence>> CudaDevice::recordOn(void* stream) {
  NANOCCL_CUDA("cudaSetDevice", cudaSetDevice(impl_->device));
  return recordEvent(static_cast<cudaStream_t>(stream));
}

Status CudaDevice::blockStream(const Fence& fence, void* stream) {
  NANOCCL_ASSIGN_OR_RETURN(cudaEvent_t e, eventOf(fence));
  NANOCCL_CUDA("cudaSetDevice", cudaSetDevice(impl_->device));
  NANOCCL_CUDA("cudaStreamWaitEvent", cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), e, 0));
  return Status::ok();
}

Status CudaDevice::queueWait(const Fence& fence) {
  NANOCCL_CHECK(impl_->failedStatus());
  return blockStream(fence, impl_->stream);
}

Status CudaDevice::copy(void* dst, const void* src, size_t bytes) {
  NANOCCL_CHECK(impl_->failedStatus());
  if (bytes == 0) return Status::ok();
  NANOCCL_CUDA("cudaSetDevice", cudaSetDevice(impl_->device));
  NANOCCL_CUDA("cudaMemcpyAsync",
               cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, impl_->stream));
  return Status::ok();
}

Result<std::shared_ptr<Fence>> CudaDevice::record() {
  NANOCCL_CHECK(impl_->failedStatus());
  return recordOn(impl_->stream);
}

Result<bool> CudaDevice::passed(const Fence& fence) {
  NANOCCL_CHECK(impl_->failedStatus());
  NANOCCL_ASSIGN_OR_RETURN(cudaEvent_t e, eventOf(fence));
  (void)cudaSetDevice(impl_->device);
  const cudaError_t q = cudaEventQuery(e);
  if (q == cudaSuccess) return true;
  if (q != cudaErrorNotReady) return cudaFailed("cudaEventQuery", q);
  std::unique_lock<std::mutex> lock(impl_->ncclMu, std::try_to_lock);
  if (lock.owns_lock() && impl_->nccl) NANOCCL_CHECK(impl_->nccl->check());
  return false;
}

Result<char*> CudaDevice::staging(int slot, size_t bytes) {
  if (slot < 0 || slot >= kStagingSlots) {
    return invalidArgument("CUDA device: no staging slot " + std::to_string(slot));
  }
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl::Pinned& s = impl_->slots[slot];
  if (s.bytes < bytes) {
    NANOCCL_CUDA("cudaSetDevice", cudaSetDevice(impl_->device));
    if (s.p != nullptr) (void)cudaFreeHost(s.p);
    s = {};
    void* p = nullptr;
    NANOCCL_CUDA("cudaHostAlloc(" + std::to_string(bytes) + " bytes)",
                 cudaHostAlloc(&p, bytes, cudaHostAllocDefault));
    s = {static_cast<char*>(p), bytes};
  }
  return s.p;
}

Status CudaDevice::nodeStage(detail::Context& node, const detail::CallArgs& call,
                             uint32_t tagBase) {
  NANOCCL_CHECK(impl_->failedStatus());
  NANOCCL_CUDA("cudaSetDevice", cudaSetDevice(impl_->device));
  std::lock_guard<std::mutex> lock(impl_->ncclMu);
  const Deadline& d = node.deadline();
  if (!impl_->nccl) {
    // The unique id from local rank 0, over the node's transport.
    std::string id;
    if (node.rank() == 0) {
      NANOCCL_ASSIGN_OR_RETURN(id, NcclComm::newUniqueId());
    }
    id.resize(128);  // NCCL_UNIQUE_ID_BYTES
    std::vector<detail::Pending> ps;
    for (int peer = 1; peer < node.size() && node.rank() == 0; ++peer) {
      ps.push_back(node.isend(peer, tagBase, id.data(), id.size()));
    }
    if (node.rank() != 0) ps.push_back(node.irecv(0, tagBase, id.data(), id.size()));
    NANOCCL_CHECK(node.waitAll(ps));
    NANOCCL_ASSIGN_OR_RETURN(impl_->nccl,
                             NcclComm::create(id, node.rank(), node.size(), impl_->device, d));
  }
  NcclComm& nc = *impl_->nccl;
  const size_t es = call.elemSize();
  const bool nativeType = NcclComm::supports(call.dtype, ReduceOp::kSum);
  auto equalCounts = [&]() -> Status {
    for (size_t c : call.counts) {
      if (c != call.counts[0]) return invalidArgument("NCCL takes equal counts per rank");
    }
    return Status::ok();
  };
  Status s;
  switch (call.op) {
    case OpType::kAllreduce:
      s = nc.allreduce(call.recv, call.recv, call.count, call.dtype, call.redop,
                       call.premulFactor, impl_->stream, d);
      break;
    case OpType::kReduceScatter:
      NANOCCL_CHECK(equalCounts());
      s = nc.reduceScatter(call.send, call.recv, call.counts[0], call.dtype, call.redop,
                           call.premulFactor, impl_->stream, d);
      break;
    case OpType::kReduce:
      s = nc.reduce(call.recv, call.recv, call.count, call.dtype, call.redop, call.premulFactor,
                    call.root, impl_->stream, d);
      break;
    case OpType::kAllgather:  // data movement: as bytes where NCCL lacks the type
      NANOCCL_CHECK(equalCounts());
      s = nativeType ? nc.allgather(call.send, call.recv, call.count, call.dtype, impl_->stream, d)
                     : nc.allgather(call.send, call.recv, call.count * es, DataType::kUInt8,
                                    impl_->stream, d);
      break;
    case OpType::kBroadcast:
      s = nc.broadcast(call.recv, call.recv, call.count * es, DataType::kUInt8, call.root,
                       impl_->stream, d);
      break;
    default:
      return invalidArgument(std::string("CUDA device: no node stage for ") + opTypeName(call.op));
  }
  bool abortNow = false;
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    abortNow = impl_->abortPending;
    impl_->abortPending = false;
  }
  if (abortNow) nc.abort(impl_->failedStatus());
  return s;
}

void CudaDevice::abort(const Status& why) {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (!impl_->failed.isOk()) return;
    impl_->failed = why;
  }
  std::unique_lock<std::mutex> lock(impl_->ncclMu, std::try_to_lock);
  if (!lock.owns_lock()) {
    std::lock_guard<std::mutex> l(impl_->mu);
    impl_->abortPending = true;  // the node stage holding NCCL aborts it when its call returns
    return;
  }
  if (impl_->nccl) impl_->nccl->abort(why);
}

void CudaDevice::shutdown(const Deadline& deadline) {
  (void)cudaSetDevice(impl_->device);
  std::lock_guard<std::mutex> lock(impl_->ncclMu);
  if (!impl_->nccl) return;
  if (impl_->failedStatus().isOk()) {
    const Status s = impl_->nccl->close(deadline);
    if (!s.isOk()) NANOCCL_WARN(describe() << ": closing NCCL: " << s.toString());
  } else {
    impl_->nccl->abort(impl_->failedStatus());
  }
  impl_->nccl.reset();
}

}  // namespace nanoccl
