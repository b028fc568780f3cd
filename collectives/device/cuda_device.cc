// CudaDevice (cuda_device.h): a CUDA stream as the device queue, events as fences, pinned
// staging memory, NCCL as the node stage.
//
// NCCL runs non-blocking (ncclConfig_t::blocking = 0): every NCCL call returns at once and is
// settled by polling ncclCommGetAsyncError against the call's deadline, so nothing waits on
// NCCL without a bound. Any NCCL failure fails the device: the communicator is aborted (its
// kernels return) and every later operation reports the first error.
#include "collectives/device/cuda_device.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "collectives/algorithm.h"
#include "common/logging.h"

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

// NCCL's type for `t`; false where NCCL has none.
bool ncclType(DataType t, ncclDataType_t* out) {
  switch (t) {
    case DataType::kFloat32: *out = ncclFloat32; return true;
    case DataType::kFloat64: *out = ncclFloat64; return true;
    case DataType::kFloat16: *out = ncclFloat16; return true;
    case DataType::kBFloat16: *out = ncclBfloat16; return true;
    case DataType::kInt8: *out = ncclInt8; return true;
    case DataType::kUInt8: *out = ncclUint8; return true;
    case DataType::kInt32: *out = ncclInt32; return true;
    case DataType::kInt64: *out = ncclInt64; return true;
    default: return false;
  }
}

// NCCL's built-in operator for `op`; false for premul_sum (made per call) and the others.
bool ncclOp(ReduceOp op, ncclRedOp_t* out) {
  switch (op) {
    case ReduceOp::kSum: *out = ncclSum; return true;
    case ReduceOp::kProduct: *out = ncclProd; return true;
    case ReduceOp::kMin: *out = ncclMin; return true;
    case ReduceOp::kMax: *out = ncclMax; return true;
    case ReduceOp::kAvg: *out = ncclAvg; return true;
    default: return false;
  }
}

Status ncclFailed(const std::string& what, ncclResult_t r, ncclComm_t comm) {
  std::string message = what + ": " + ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') message += " (" + std::string(last) + ")";
  if (r == ncclInvalidArgument || r == ncclInvalidUsage) return invalidArgument(message);
  if (r == ncclRemoteError || r == ncclSystemError) return peerError(message);
  return internalError(message);
}

// Settles an NCCL call that returned `r`: a non-blocking call may return ncclInProgress, and the
// communicator takes no other call until its state leaves ncclInProgress. Polls get slower the
// longer a call takes (most settle within microseconds; a peer still joining must not keep a
// core busy).
Status settle(ncclComm_t comm, const std::string& what, ncclResult_t r, const Deadline& deadline) {
  int pauseUs = 5;
  while (r == ncclInProgress) {
    if (deadline.expired()) {
      return timeoutError(what + " did not complete within its deadline (a peer that never "
                                 "joined or died?)");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(pauseUs));
    pauseUs = std::min(pauseUs * 2, 1000);
    const ncclResult_t q = ncclCommGetAsyncError(comm, &r);
    if (q != ncclSuccess) r = q;
  }
  return r == ncclSuccess ? Status::ok() : ncclFailed(what, r, comm);
}

// premul_sum's operator: NCCL multiplies each rank's input by `factor` (in the data's type;
// ncclScalarHostImmediate reads it before returning). The caller destroys it.
Status makePremulSum(ncclComm_t comm, DataType t, ncclDataType_t nt, double factor,
                     ncclRedOp_t* op) {
  float f = static_cast<float>(factor);
  double d = factor;
  uint16_t h = t == DataType::kFloat16 ? floatToHalf(f) : floatToBFloat16(f);
  void* scalar = t == DataType::kFloat64 ? static_cast<void*>(&d)
                 : t == DataType::kFloat32 ? static_cast<void*>(&f)
                                           : static_cast<void*>(&h);
  const ncclResult_t r = ncclRedOpCreatePreMulSum(op, scalar, nt, ncclScalarHostImmediate, comm);
  return r == ncclSuccess ? Status::ok() : ncclFailed("ncclRedOpCreatePreMulSum", r, comm);
}

// A pinned 16 MB copy to the device and back on a stream of its own (the second round of two:
// the first pays for setup), timed with events: MB/s each way.
Result<double> measureCopyMBps(int device) {
  constexpr size_t kBytes = size_t{16} << 20;
  NANOCCL_CUDA("cudaSetDevice", cudaSetDevice(device));
  void* host = nullptr;
  void* dev = nullptr;
  cudaStream_t st = nullptr;
  cudaEvent_t ev[2] = {nullptr, nullptr};
  float ms = 0;
  cudaError_t e = cudaHostAlloc(&host, kBytes, cudaHostAllocDefault);
  if (e == cudaSuccess) e = cudaMalloc(&dev, kBytes);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
  for (cudaEvent_t& x : ev) {
    if (e == cudaSuccess) e = cudaEventCreate(&x);
  }
  for (int round = 0; round < 2 && e == cudaSuccess; ++round) {
    e = cudaEventRecord(ev[0], st);
    if (e == cudaSuccess) e = cudaMemcpyAsync(dev, host, kBytes, cudaMemcpyHostToDevice, st);
    if (e == cudaSuccess) e = cudaMemcpyAsync(host, dev, kBytes, cudaMemcpyDeviceToHost, st);
    if (e == cudaSuccess) e = cudaEventRecord(ev[1], st);
    if (e == cudaSuccess) e = cudaEventSynchronize(ev[1]);
    if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, ev[0], ev[1]);
  }
  for (cudaEvent_t x : ev) {
    if (x != nullptr) (void)cudaEventDestroy(x);
  }
  if (st != nullptr) (void)cudaStreamDestroy(st);
  if (dev != nullptr) (void)cudaFree(dev);
  if (host != nullptr) (void)cudaFreeHost(host);
  if (e != cudaSuccess) return cudaFailed("measuring the staging copy rate", e);
  return 2.0 * kBytes / (std::max(ms, 1e-3f) * 1e-3) / 1e6;
}

}  // namespace

struct CudaDevice::Impl {
  int device = 0;
  cudaStream_t stream = nullptr;
  double copyMBps = 0;  // measured at create()
  std::mutex mu;  // failed, abortPending, staging
  Status failed;
  bool abortPending = false;  // abort() came while a node stage held NCCL
  std::mutex ncclMu;          // NCCL takes one thread at a time; guards comm
  ncclComm_t comm = nullptr;  // made at the first node stage
  struct Pinned {
    char* p = nullptr;
    size_t bytes = 0;
  };
  Pinned slots[kStagingSlots];

  Status failedStatus() {
    std::lock_guard<std::mutex> lock(mu);
    return failed;
  }
  // Fails the device with `why` (the first failure stays); the caller holds ncclMu.
  Status failLocked(const Status& why) {
    if (comm != nullptr) (void)ncclCommAbort(comm);
    comm = nullptr;
    std::lock_guard<std::mutex> lock(mu);
    if (failed.isOk()) failed = why;
    return why;
  }
  // The node's NCCL communicator: local rank 0 makes the unique id and sends it to the others
  // over the node's transport (tags tagBase). The caller holds ncclMu.
  Status join(detail::Context& node, uint32_t tagBase) {
    std::string id(NCCL_UNIQUE_ID_BYTES, '\0');
    if (node.rank() == 0) {
      ncclUniqueId u;
      const ncclResult_t r = ncclGetUniqueId(&u);
      if (r != ncclSuccess) return ncclFailed("ncclGetUniqueId", r, nullptr);
      id.assign(reinterpret_cast<const char*>(&u), sizeof(u));
    }
    std::vector<detail::Pending> ps;
    for (int peer = 1; peer < node.size() && node.rank() == 0; ++peer) {
      ps.push_back(node.isend(peer, tagBase, id.data(), id.size()));
    }
    if (node.rank() != 0) ps.push_back(node.irecv(0, tagBase, id.data(), id.size()));
    NANOCCL_CHECK(node.waitAll(ps));
    ncclUniqueId u;
    std::copy(id.begin(), id.end(), reinterpret_cast<char*>(&u));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t r = ncclCommInitRankConfig(&comm, node.size(), u, node.rank(), &config);
    const std::string what = "ncclCommInitRankConfig (local rank " + std::to_string(node.rank()) +
                             " of " + std::to_string(node.size()) + ", cuda:" +
                             std::to_string(device) + ")";
    if (comm == nullptr) return ncclFailed(what, r, nullptr);
    return settle(comm, what, r, node.deadline());
  }
};

bool CudaDevice::built() { return true; }

bool CudaDevice::reduces(DataType dtype, ReduceOp op) {
  ncclDataType_t nt;
  ncclRedOp_t no;
  if (op == ReduceOp::kNumOps) return true;
  if (!ncclType(dtype, &nt) || !reduceOpSupported(op, dtype)) return false;
  return op == ReduceOp::kPremulSum ? isFloatingPoint(dtype) : ncclOp(op, &no);
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
  NANOCCL_ASSIGN_OR_RETURN(impl->copyMBps, measureCopyMBps(device));
  return std::shared_ptr<CudaDevice>(new CudaDevice(std::move(impl)));
}

double CudaDevice::copyMBps() const { return impl_->copyMBps; }

CudaDevice::~CudaDevice() {
  (void)cudaSetDevice(impl_->device);
  if (impl_->comm != nullptr) (void)ncclCommAbort(impl_->comm);
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
  // NCCL's asynchronous error (a network failure, a peer's abort), where no stage holds NCCL.
  std::unique_lock<std::mutex> lock(impl_->ncclMu, std::try_to_lock);
  if (!lock.owns_lock() || impl_->comm == nullptr) return false;
  ncclResult_t state = ncclSuccess;
  const ncclResult_t asked = ncclCommGetAsyncError(impl_->comm, &state);
  if (asked != ncclSuccess) state = asked;
  if (state == ncclSuccess || state == ncclInProgress) return false;
  return impl_->failLocked(ncclFailed(describe() + " NCCL communicator", state, impl_->comm));
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

// One NCCL collective on the stream, in NCCL's buffer rules: in place (allreduce, reduce,
// broadcast on recv), reduce_scatter from send into this rank's part, allgather from this
// rank's part. Data movement of a type NCCL lacks moves bytes.
Status CudaDevice::nodeStage(detail::Context& node, const detail::CallArgs& call,
                             uint32_t tagBase) {
  NANOCCL_CHECK(impl_->failedStatus());
  NANOCCL_CUDA("cudaSetDevice", cudaSetDevice(impl_->device));
  const bool movement = call.op == OpType::kAllgather || call.op == OpType::kBroadcast;
  ncclDataType_t nt = ncclUint8;
  size_t count = call.count;
  if (!ncclType(call.dtype, &nt)) {
    if (!movement) return invalidArgument(std::string("NCCL has no ") + dataTypeName(call.dtype));
    nt = ncclUint8;
    count *= call.elemSize();
  }
  for (size_t c : call.counts) {
    if (c != call.counts[0]) return invalidArgument("NCCL takes equal counts per rank");
  }
  std::lock_guard<std::mutex> lock(impl_->ncclMu);
  if (impl_->comm == nullptr) {
    const Status joined = impl_->join(node, tagBase);
    if (!joined.isOk()) return impl_->failLocked(joined);
  }
  ncclComm_t comm = impl_->comm;
  ncclRedOp_t op = ncclSum;
  const bool premul = !movement && call.redop == ReduceOp::kPremulSum;
  if (premul) {
    const Status made = makePremulSum(comm, call.dtype, nt, call.premulFactor, &op);
    if (!made.isOk()) return impl_->failLocked(made);
  } else if (!movement && !ncclOp(call.redop, &op)) {
    return invalidArgument(std::string("NCCL has no reduction ") + reduceOpName(call.redop));
  }
  cudaStream_t st = impl_->stream;
  ncclResult_t r = ncclSuccess;
  switch (call.op) {
    case OpType::kAllreduce:
      r = ncclAllReduce(call.recv, call.recv, count, nt, op, comm, st);
      break;
    case OpType::kReduceScatter:
      r = ncclReduceScatter(call.send, call.recv, call.counts[0], nt, op, comm, st);
      break;
    case OpType::kReduce:
      r = ncclReduce(call.recv, call.recv, count, nt, op, call.root, comm, st);
      break;
    case OpType::kAllgather:
      r = ncclAllGather(call.send, call.recv, count, nt, comm, st);
      break;
    case OpType::kBroadcast:
      r = ncclBroadcast(call.recv, call.recv, count, nt, call.root, comm, st);
      break;
    default:
      return invalidArgument(std::string("CUDA device: no node stage for ") + opTypeName(call.op));
  }
  Status s = settle(comm, std::string("NCCL ") + opTypeName(call.op), r, node.deadline());
  if (premul) (void)ncclRedOpDestroy(op, comm);
  bool abortNow = false;
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    abortNow = impl_->abortPending;
    impl_->abortPending = false;
  }
  if (!s.isOk()) return impl_->failLocked(s);
  if (abortNow) (void)impl_->failLocked(impl_->failedStatus());
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
  (void)cudaSetDevice(impl_->device);
  (void)impl_->failLocked(why);
}

void CudaDevice::shutdown(const Deadline& deadline) {
  (void)cudaSetDevice(impl_->device);
  std::lock_guard<std::mutex> lock(impl_->ncclMu);
  if (impl_->comm == nullptr) return;
  if (!impl_->failedStatus().isOk()) {
    (void)impl_->failLocked(impl_->failedStatus());
    return;
  }
  // Finalize waits (settled by polling) until every enqueued operation is done and the peers are
  // quiescent; destroy then only frees local memory.
  const Status s = settle(impl_->comm, "ncclCommFinalize", ncclCommFinalize(impl_->comm), deadline);
  if (!s.isOk()) {
    NANOCCL_WARN(describe() << ": closing NCCL: " << s.toString());
    (void)impl_->failLocked(s);
    return;
  }
  (void)ncclCommDestroy(impl_->comm);
  impl_->comm = nullptr;
}

}  // namespace nanoccl
