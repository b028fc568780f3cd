#include "transports/nccl/nccl_comm.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <thread>
#include <vector>

namespace nanoccl {
namespace {

std::optional<ncclDataType_t> ncclType(DataType t) {
  switch (t) {
    case DataType::kFloat32:
      return ncclFloat32;
    case DataType::kFloat64:
      return ncclFloat64;
    case DataType::kFloat16:
      return ncclFloat16;
    case DataType::kBFloat16:
      return ncclBfloat16;
    case DataType::kInt8:
      return ncclInt8;
    case DataType::kUInt8:
      return ncclUint8;
    case DataType::kInt32:
      return ncclInt32;
    case DataType::kInt64:
      return ncclInt64;
    default:
      return std::nullopt;
  }
}

std::optional<ncclRedOp_t> builtinOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kProduct:
      return ncclProd;
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kAvg:
      return ncclAvg;
    default:
      return std::nullopt;
  }
}

Status cudaFailed(const char* what, cudaError_t e) {
  (void)cudaGetLastError();  // clear a non-sticky error so that later calls do not see it
  const std::string message =
      std::string(what) + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e);
  if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ||
      e == cudaErrorInvalidDevice) {
    return unavailableError(message);
  }
  return internalError(message);
}

// Polls get slower the longer a call takes: most settle within microseconds, and a long wait
// (a peer still joining) must not keep a core busy.
class Backoff {
 public:
  void pause() {
    std::this_thread::sleep_for(std::chrono::microseconds(us_));
    us_ = std::min(us_ * 2, 1000);
  }

 private:
  int us_ = 5;
};

}  // namespace

struct NcclComm::Impl {
  ncclComm_t comm = nullptr;
  bool closed = false;
  Status failed;                      // sticky: the first error

  // Aborts and remembers `why`; returns it.
  Status fail(const Status& why) {
    if (comm != nullptr) {
      (void)ncclCommAbort(comm);
      comm = nullptr;
    }
    if (failed.isOk()) failed = why;
    return why;
  }

  Status failNccl(const std::string& what, ncclResult_t r) {
    std::string message = what + ": " + ncclGetErrorString(r);
    const char* last = ncclGetLastError(comm);
    if (last != nullptr && *last != '\0') message += " (" + std::string(last) + ")";
    Status s;
    switch (r) {
      case ncclInvalidArgument:
      case ncclInvalidUsage:
        s = invalidArgument(message);
        break;
      case ncclRemoteError:
      case ncclSystemError:
        s = peerError(message);
        break;
      default:
        s = internalError(message);
    }
    return fail(s);
  }

  // Settles a call that returned `r`: in the non-blocking mode a call may return ncclInProgress,
  // and the communicator takes no other call until its state leaves ncclInProgress.
  Status settle(const std::string& what, ncclResult_t r, const Deadline& deadline) {
    if (r == ncclSuccess) return Status::ok();
    if (r != ncclInProgress) return failNccl(what, r);
    Backoff backoff;
    for (;;) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t q = ncclCommGetAsyncError(comm, &state);
      if (q != ncclSuccess) return failNccl(what + " (ncclCommGetAsyncError)", q);
      if (state == ncclSuccess) return Status::ok();
      if (state != ncclInProgress) return failNccl(what, state);
      if (deadline.expired()) {
        return fail(timeoutError(what + " did not complete within its deadline (a peer that "
                                        "never joined or died?); the NCCL communicator is "
                                        "aborted"));
      }
      backoff.pause();
    }
  }

  // settle() for a reduction, then frees a premul_sum operator NCCL created for it.
  Status settleReduction(const std::string& what, ncclResult_t r, ncclRedOp_t op, bool created,
                         const Deadline& deadline) {
    Status s = settle(what, r, deadline);
    if (created && comm != nullptr) (void)ncclRedOpDestroy(op, comm);
    return s;
  }
};

NcclComm::NcclComm(std::unique_ptr<Impl> impl, int rank, int size, int device)
    : impl_(std::move(impl)), rank_(rank), size_(size), device_(device) {}

NcclComm::~NcclComm() {
  if (impl_->comm != nullptr) {
    (void)cudaSetDevice(device_);
    (void)impl_->fail(abortedError("NCCL communicator destroyed"));
  }
}

bool NcclComm::built() { return true; }

bool NcclComm::supports(DataType t, ReduceOp op) {
  if (!ncclType(t)) return false;
  if (op == ReduceOp::kNumOps) return true;
  if (op == ReduceOp::kPremulSum) return isFloatingPoint(t);
  return builtinOp(op).has_value();
}

Result<std::string> NcclComm::newUniqueId() {
  ncclUniqueId id;
  const ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) {
    return internalError(std::string("ncclGetUniqueId: ") + ncclGetErrorString(r) + " (" +
                         ncclGetLastError(nullptr) + ")");
  }
  return std::string(reinterpret_cast<const char*>(&id), sizeof(id));
}

Result<std::unique_ptr<NcclComm>> NcclComm::create(const std::string& uniqueId, int rank,
                                                   int size, int device,
                                                   const Deadline& deadline) {
  if (uniqueId.size() != sizeof(ncclUniqueId)) {
    return invalidArgument("NCCL unique id of " + std::to_string(uniqueId.size()) +
                           " bytes, expected " + std::to_string(sizeof(ncclUniqueId)));
  }
  if (size < 1 || rank < 0 || rank >= size) {
    return invalidArgument("NCCL rank " + std::to_string(rank) + " of " + std::to_string(size));
  }
  const cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) return cudaFailed("cudaSetDevice", e);
  ncclUniqueId id;
  std::memcpy(&id, uniqueId.data(), sizeof(id));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every call returns at once; settle() polls against the deadline
  auto impl = std::make_unique<Impl>();
  const ncclResult_t r = ncclCommInitRankConfig(&impl->comm, size, id, rank, &config);
  std::unique_ptr<NcclComm> comm(new NcclComm(std::move(impl), rank, size, device));
  const std::string what = "ncclCommInitRankConfig (rank " + std::to_string(rank) + " of " +
                           std::to_string(size) + ", cuda:" + std::to_string(device) + ")";
  NANOCCL_CHECK(comm->impl_->settle(what, r, deadline));
  return comm;
}

// Every call starts here: the communicator must be usable, and NCCL launches on the current
// device.
#define NANOCCL_NCCL_BEGIN()                                                    \
  do {                                                                          \
    if (!impl_->failed.isOk()) return impl_->failed;                            \
    if (impl_->comm == nullptr) return abortedError("NCCL communicator closed"); \
    const cudaError_t device_error = cudaSetDevice(device_);                    \
    if (device_error != cudaSuccess) {                                          \
      return impl_->fail(cudaFailed("cudaSetDevice", device_error));            \
    }                                                                           \
  } while (0)

namespace {

// The reduction operator of a call: a built-in one, or a premul_sum NCCL creates for it.
struct RedOp {
  ncclRedOp_t op = ncclSum;
  bool created = false;
};

Result<RedOp> redOpFor(ncclComm_t comm, ReduceOp op, DataType t, ncclDataType_t nt,
                       double factor) {
  if (op != ReduceOp::kPremulSum) {
    auto b = builtinOp(op);
    if (!b) {
      return invalidArgument(std::string("NCCL has no reduction ") + reduceOpName(op));
    }
    return RedOp{*b, false};
  }
  if (!isFloatingPoint(t)) {
    return invalidArgument(std::string("NCCL premul_sum takes floating point, not ") +
                           dataTypeName(t));
  }
  // The scalar has the data's type; ncclScalarHostImmediate reads it before returning.
  float f = static_cast<float>(factor);
  double d = factor;
  uint16_t h = 0;
  void* scalar = &f;
  if (t == DataType::kFloat64) {
    scalar = &d;
  } else if (t == DataType::kFloat16) {
    h = floatToHalf(f);
    scalar = &h;
  } else if (t == DataType::kBFloat16) {
    h = floatToBFloat16(f);
    scalar = &h;
  }
  RedOp out{ncclSum, true};
  const ncclResult_t r = ncclRedOpCreatePreMulSum(&out.op, scalar, nt, ncclScalarHostImmediate,
                                                  comm);
  if (r != ncclSuccess) {
    return internalError(std::string("ncclRedOpCreatePreMulSum: ") + ncclGetErrorString(r));
  }
  return out;
}

}  // namespace

Status NcclComm::allreduce(const void* send, void* recv, size_t count, DataType dtype,
                           ReduceOp op, double premulFactor, void* stream,
                           const Deadline& deadline) {
  NANOCCL_NCCL_BEGIN();
  auto nt = ncclType(dtype);
  if (!nt) return invalidArgument(std::string("NCCL has no ") + dataTypeName(dtype));
  auto red = redOpFor(impl_->comm, op, dtype, *nt, premulFactor);
  if (!red.isOk()) return red.status();
  const ncclResult_t r = ncclAllReduce(send, recv, count, *nt, red->op, impl_->comm,
                                       static_cast<cudaStream_t>(stream));
  return impl_->settleReduction("ncclAllReduce", r, red->op, red->created, deadline);
}

Status NcclComm::reduceScatter(const void* send, void* recv, size_t recvCount, DataType dtype,
                               ReduceOp op, double premulFactor, void* stream,
                               const Deadline& deadline) {
  NANOCCL_NCCL_BEGIN();
  auto nt = ncclType(dtype);
  if (!nt) return invalidArgument(std::string("NCCL has no ") + dataTypeName(dtype));
  auto red = redOpFor(impl_->comm, op, dtype, *nt, premulFactor);
  if (!red.isOk()) return red.status();
  const ncclResult_t r = ncclReduceScatter(send, recv, recvCount, *nt, red->op, impl_->comm,
                                           static_cast<cudaStream_t>(stream));
  return impl_->settleReduction("ncclReduceScatter", r, red->op, red->created, deadline);
}

Status NcclComm::reduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                        double premulFactor, int root, void* stream, const Deadline& deadline) {
  NANOCCL_NCCL_BEGIN();
  auto nt = ncclType(dtype);
  if (!nt) return invalidArgument(std::string("NCCL has no ") + dataTypeName(dtype));
  auto red = redOpFor(impl_->comm, op, dtype, *nt, premulFactor);
  if (!red.isOk()) return red.status();
  const ncclResult_t r = ncclReduce(send, recv, count, *nt, red->op, root, impl_->comm,
                                    static_cast<cudaStream_t>(stream));
  return impl_->settleReduction("ncclReduce", r, red->op, red->created, deadline);
}

Status NcclComm::allgather(const void* send, void* recv, size_t sendCount, DataType dtype,
                           void* stream, const Deadline& deadline) {
  NANOCCL_NCCL_BEGIN();
  auto nt = ncclType(dtype);
  if (!nt) return invalidArgument(std::string("NCCL has no ") + dataTypeName(dtype));
  const ncclResult_t r = ncclAllGather(send, recv, sendCount, *nt, impl_->comm,
                                       static_cast<cudaStream_t>(stream));
  return impl_->settle("ncclAllGather", r, deadline);
}

Status NcclComm::broadcast(const void* send, void* recv, size_t count, DataType dtype, int root,
                           void* stream, const Deadline& deadline) {
  NANOCCL_NCCL_BEGIN();
  auto nt = ncclType(dtype);
  if (!nt) return invalidArgument(std::string("NCCL has no ") + dataTypeName(dtype));
  const ncclResult_t r = ncclBroadcast(send, recv, count, *nt, root, impl_->comm,
                                       static_cast<cudaStream_t>(stream));
  return impl_->settle("ncclBroadcast", r, deadline);
}

Status NcclComm::check() {
  if (!impl_->failed.isOk()) return impl_->failed;
  if (impl_->comm == nullptr) return Status::ok();
  ncclResult_t state = ncclSuccess;
  const ncclResult_t q = ncclCommGetAsyncError(impl_->comm, &state);
  if (q != ncclSuccess) return impl_->failNccl("ncclCommGetAsyncError", q);
  if (state != ncclSuccess && state != ncclInProgress) {
    return impl_->failNccl("NCCL communicator", state);
  }
  return Status::ok();
}

void NcclComm::abort(const Status& why) {
  if (impl_->comm != nullptr) (void)cudaSetDevice(device_);
  (void)impl_->fail(why);
}

Status NcclComm::close(const Deadline& deadline) {
  if (impl_->closed) return Status::ok();
  NANOCCL_NCCL_BEGIN();
  // Finalize waits (in the non-blocking mode: settle() polls) until every enqueued operation
  // is done and the peers are quiescent; destroy then only frees local memory.
  const ncclResult_t r = ncclCommFinalize(impl_->comm);
  NANOCCL_CHECK(impl_->settle("ncclCommFinalize", r, deadline));
  (void)ncclCommDestroy(impl_->comm);
  impl_->comm = nullptr;
  impl_->closed = true;
  return Status::ok();
}

#undef NANOCCL_NCCL_BEGIN

}  // namespace nanoccl
