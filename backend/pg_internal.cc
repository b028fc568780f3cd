#include "backend/pg_internal.h"

#include <algorithm>
#include <cstdlib>
#include <utility>

namespace nanoccl::pg {

[[noreturn]] void reject(const std::string& message) { throw CallError{message}; }
[[noreturn]] void rejectType(const std::string& message) {
  throw CallError{message, ErrorKind::kType};
}

void checkTensor(const at::Tensor& t, const char* what) {
  if (!t.defined()) reject(std::string(what) + ": undefined tensor");
  if (t.is_cuda()) {
    reject(std::string(what) +
           ": nanoccl runs allreduce, broadcast, allgather and reduce_scatter (and their _base "
           "forms) on CUDA tensors" +
           (CudaCollectives::built() ? "" : " in a build with CUDA (this one has none)") +
           "; this call takes CPU tensors (use \"cpu:nanoccl,cuda:nccl\" or move the tensor "
           "to the CPU)");
  }
  if (!t.is_cpu()) {
    reject(std::string(what) + ": nanoccl takes CPU tensors, got a tensor on " + t.device().str());
  }
  if (t.layout() != at::kStrided) reject(std::string(what) + ": nanoccl takes dense tensors");
}

std::optional<DataType> mapType(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return DataType::kFloat32;
    case at::kDouble:
      return DataType::kFloat64;
    case at::kHalf:
      return DataType::kFloat16;
    case at::kBFloat16:
      return DataType::kBFloat16;
    case at::kChar:
      return DataType::kInt8;
    case at::kByte:
      return DataType::kUInt8;
    case at::kShort:
      return DataType::kInt16;
    case at::kInt:
      return DataType::kInt32;
    case at::kLong:
      return DataType::kInt64;
    case at::kBool:
      return DataType::kBool;
    case at::kComplexFloat:
      return DataType::kComplex64;
    case at::kComplexDouble:
      return DataType::kComplex128;
    default:
      return std::nullopt;
  }
}

Wire moveType(const at::Tensor& t) {
  if (auto d = mapType(t.scalar_type())) return {*d, 1};
  return {DataType::kUInt8, static_cast<size_t>(t.element_size())};
}

DataType reduceType(const at::Tensor& t, const char* what) {
  auto d = mapType(t.scalar_type());
  if (!d) {
    rejectType(std::string(what) + ": dtype " + std::string(c10::toString(t.scalar_type())) +
           " is not supported for reductions (float, double, half, bfloat16, int8, uint8, "
           "int16, int32, int64, bool, complex64, complex128)");
  }
  return *d;
}

Reduction mapReduction(const c10d::ReduceOp& rop, DataType dtype, const char* what) {
  Reduction r{ReduceOp::kSum};
  switch (rop.op_) {
    case c10d::ReduceOp::SUM:
      r.op = ReduceOp::kSum;
      break;
    case c10d::ReduceOp::AVG:
      r.op = ReduceOp::kAvg;
      break;
    case c10d::ReduceOp::PRODUCT:
      r.op = ReduceOp::kProduct;
      break;
    case c10d::ReduceOp::MIN:
      r.op = ReduceOp::kMin;
      break;
    case c10d::ReduceOp::MAX:
      r.op = ReduceOp::kMax;
      break;
    case c10d::ReduceOp::BAND:
      r.op = ReduceOp::kBand;
      break;
    case c10d::ReduceOp::BOR:
      r.op = ReduceOp::kBor;
      break;
    case c10d::ReduceOp::BXOR:
      r.op = ReduceOp::kBxor;
      break;
    case c10d::ReduceOp::PREMUL_SUM: {
      r.op = ReduceOp::kPremulSum;
      // As ProcessGroupNCCL: the factor travels in the op's supplement, a double or a
      // one-element tensor.
      const auto* sup = dynamic_cast<const c10d::NCCLPreMulSumSupplement*>(rop.supplement_.get());
      if (sup == nullptr) reject(std::string(what) + ": PREMUL_SUM without a factor");
      if (sup->tensor_factor.defined()) {
        if (sup->tensor_factor.numel() != 1) {
          reject(std::string(what) + ": PREMUL_SUM factor tensor must have one element");
        }
        r.factor = sup->tensor_factor.to(at::kCPU).to(at::kDouble).item<double>();
      } else {
        r.factor = sup->double_factor;
      }
      break;
    }
    default:
      reject(std::string(what) + ": unsupported reduce op " + std::to_string(int(rop.op_)));
  }
  if (!reduceOpSupported(r.op, dtype)) {
    reject(std::string(what) + ": reduction " + reduceOpName(r.op) + " is not defined on " +
           dataTypeName(dtype));
  }
  return r;
}

void* ptr(const at::Tensor& t) { return t.numel() == 0 ? nullptr : t.data_ptr(); }

size_t count(const at::Tensor& t, const Wire& w) {
  return static_cast<size_t>(t.numel()) * w.perElement;
}

at::Tensor input(WorkNanoccl& work, const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  work.hold(c);
  return c;
}

at::Tensor output(WorkNanoccl& work, const at::Tensor& t, bool keep) {
  if (t.is_contiguous()) {
    work.hold(t);
    return t;
  }
  at::Tensor c = keep ? t.contiguous() : at::empty(t.sizes(), t.options());
  work.hold(c);
  work.hold(t);
  work.atSuccess([dst = t, c]() mutable { dst.copy_(c); });
  return c;
}

at::Tensor gatherBuffer(WorkNanoccl& work, const std::vector<at::Tensor>& outs,
                        const at::TensorOptions& options) {
  int64_t total = 0;
  for (const auto& o : outs) total += o.numel();
  at::Tensor flat = at::empty({total}, options);
  work.hold(flat);
  for (const auto& o : outs) work.hold(o);
  work.atSuccess([outs, flat]() mutable {
    int64_t off = 0;
    for (auto& o : outs) {
      const int64_t n = o.numel();
      o.copy_(flat.narrow(0, off, n).view(o.sizes()));
      off += n;
    }
  });
  return flat;
}

at::Tensor concatInput(WorkNanoccl& work, const std::vector<at::Tensor>& ins) {
  std::vector<at::Tensor> flat;
  flat.reserve(ins.size());
  for (const auto& t : ins) flat.push_back(t.reshape({-1}));
  at::Tensor c = flat.empty() ? at::empty({0}) : at::cat(flat);
  work.hold(c);
  return c;
}

void checkSameType(const at::Tensor& a, const at::Tensor& b, const char* what) {
  if (a.scalar_type() != b.scalar_type()) {
    rejectType(std::string(what) + ": tensors of different dtypes (" +
           std::string(c10::toString(a.scalar_type())) + " and " +
           std::string(c10::toString(b.scalar_type())) + ")");
  }
}

void checkOne(const std::vector<at::Tensor>& ts, const char* what) {
  if (ts.size() != 1) {
    reject(std::string(what) + ": takes one tensor per rank, got " + std::to_string(ts.size()));
  }
  checkTensor(ts[0], what);
}

std::string torchNodeId() {
  const char* groupRank = std::getenv("GROUP_RANK");
  if (groupRank == nullptr || *groupRank == '\0') return {};
  return std::string("group_rank:") + groupRank;
}

std::string rankLabel(int rank, int size) {
  return "rank " + std::to_string(rank) + " (of " + std::to_string(size) + ")";
}

c10::intrusive_ptr<WorkNanoccl> newWork(int rank, TorchOp type, std::string what,
                                        std::vector<at::Tensor> outputs,
                                        std::chrono::milliseconds timeout, const CommPtr& comm) {
  return c10::make_intrusive<WorkNanoccl>(rank, type, std::move(what), std::move(outputs), timeout,
                                          comm);
}

int checkRoot(int64_t root, int size, const char* what) {
  if (root < 0 || root >= size) {
    reject(std::string(what) + ": root " + std::to_string(root) + " is outside the group [0, " +
           std::to_string(size) + ")");
  }
  return static_cast<int>(root);
}

bool onCuda(const at::Tensor& t) { return t.defined() && t.is_cuda(); }

c10::intrusive_ptr<c10d::Work> cudaWork(CudaCollectives::WorkResult r, int rank, int size) {
  if (r.isOk()) return std::move(r).value();
  if (r.status().code() == StatusCode::kInvalidArgument) reject(r.status().message());
  raise(r.status(), "nanoccl " + rankLabel(rank, size) + ": ");
}

Queue allgatherInto(Communicator& comm, WorkNanoccl& work, const at::Tensor& in,
                    const std::vector<at::Tensor>& outs, int rank, int size, const char* what) {
  checkTensor(in, what);
  if (static_cast<int>(outs.size()) != size) {
    reject(std::string(what) + ": expected " + std::to_string(size) +
           " output tensors (one per rank), got " + std::to_string(outs.size()));
  }
  for (const auto& o : outs) {
    checkTensor(o, what);
    checkSameType(in, o, what);
  }
  if (outs[rank].numel() != in.numel()) {
    reject(std::string(what) + ": this rank's output has " + std::to_string(outs[rank].numel()) +
           " elements but its input has " + std::to_string(in.numel()));
  }
  const Wire w = moveType(in);
  at::Tensor send = input(work, in);
  at::Tensor flat = gatherBuffer(work, outs, in.options());
  std::vector<size_t> counts;
  for (const auto& o : outs) counts.push_back(count(o, w));
  return [&comm, send, flat, counts, w] {
    return comm.allgather(ptr(send), count(send, w), ptr(flat), counts, w.dtype);
  };
}

Queue allgatherFlat(Communicator& comm, WorkNanoccl& work, const at::Tensor& out,
                    const at::Tensor& in, int size, const char* what) {
  checkTensor(in, what);
  checkTensor(out, what);
  checkSameType(in, out, what);
  if (out.numel() != in.numel() * size) {
    reject(std::string(what) + ": output has " + std::to_string(out.numel()) +
           " elements, expected " + std::to_string(size) + " x " + std::to_string(in.numel()));
  }
  const Wire w = moveType(in);
  at::Tensor send = input(work, in);
  at::Tensor recv = output(work, out, false);
  std::vector<size_t> counts(static_cast<size_t>(size), count(send, w));
  return [&comm, send, recv, counts, w] {
    return comm.allgather(ptr(send), count(send, w), ptr(recv), counts, w.dtype);
  };
}

Queue reduceScatterFlat(Communicator& comm, WorkNanoccl& work, const at::Tensor& out,
                        const at::Tensor& in, const c10d::ReduceOp& rop, int size,
                        const char* what, const CompressionRequest* compression) {
  checkTensor(in, what);
  checkTensor(out, what);
  checkSameType(in, out, what);
  if (in.numel() != out.numel() * size) {
    reject(std::string(what) + ": input has " + std::to_string(in.numel()) +
           " elements, expected " + std::to_string(size) + " x " + std::to_string(out.numel()));
  }
  const DataType dt = reduceType(in, what);
  const Reduction red = mapReduction(rop, dt, what);
  at::Tensor send = input(work, in);
  at::Tensor recv = output(work, out, false);
  std::vector<size_t> counts(static_cast<size_t>(size), static_cast<size_t>(out.numel()));
  if (compression != nullptr) {
    return [&comm, send, recv, counts, dt, red, request = *compression] {
      return comm.reduceScatterCompressed(ptr(send), ptr(recv), counts, dt, red.op, request,
                                          red.factor);
    };
  }
  return [&comm, send, recv, counts, dt, red] {
    return comm.reduceScatter(ptr(send), ptr(recv), counts, dt, red.op, red.factor);
  };
}

}  // namespace nanoccl::pg
