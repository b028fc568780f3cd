#include "backend/cuda_work.h"
#include "backend/errors.h"
#include "common/completion.h"
#include "backend/work_deadline.h"
#include "common/callback_runner.h"

#include <ATen/core/ivalue.h>
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <exception>
#include <utility>

namespace nanoccl {
namespace {

const c10::impl::DeviceGuardImplInterface* cudaImpl() {
  return c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
}

// One CUDA call (see cuda_work.h for the semantics).
class WorkCuda : public c10d::Work {
 public:
  WorkCuda(int rank, c10d::OpType type, std::string what, std::vector<at::Tensor> outputs,
           c10::Device device, c10::Stream stream, std::shared_ptr<CudaDevice> cuda,
           std::weak_ptr<Communicator> comm, std::function<void()> copyOut,
           std::chrono::milliseconds timeout)
      : c10d::Work(rank, type),
        what_(std::move(what)),
        outputs_(std::move(outputs)),
        device_(device),
        stream_(stream),
        cuda_(std::move(cuda)),
        comm_(std::move(comm)),
        copyOut_(std::move(copyOut)),
        timeout_(timeout),
        future_(c10::make_intrusive<c10::ivalue::Future>(
            c10::ListType::ofTensors(), std::vector<c10::Device>{device})) {}

  // Host stages over (or the error), then the caller's current stream waits for the call.
  bool wait(std::chrono::milliseconds timeout) override {
    if (!queued_.wait(pg::workWaitDeadline(issued_, timeout_, timeout))) {
      pg::raise(pg::ErrorKind::kBackend, "nanoccl rank " + std::to_string(rank_) + ": " + what_ +
                                             ": timed out waiting for the call");
    }
    blockCurrentStream();
    return true;
  }

  void synchronize() override { wait(kNoTimeout); }

  void blockCurrentStream() override {
    Status s = queued_.status();
    if (s.isOk()) s = cuda_->blockStream(*end_, cudaImpl()->getStream(device_).native_handle());
    if (!s.isOk()) pg::raise(s, context());
  }

  bool isCompleted() override {
    if (!queued_.done()) return false;
    if (!queued_.status().isOk()) return true;
    Result<bool> passed = cuda_->passed(*end_);
    return !passed.isOk() || passed.value();
  }
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

  void abort() override {
    if (auto comm = comm_.lock()) {
      comm->abort(abortedError("rank " + std::to_string(rank_) + " aborted " + what_));
    }
  }

  // On the thread that ran the call, once its work is queued (or it failed): the list
  // outputs' copies queued behind it, the end fence after them; then the future completes on
  // the callback runner (user code), with events recorded on the internal stream (the
  // StreamGuard makes it the current stream), so whoever uses the future's value waits for the
  // call on the GPU, not on the host.
  void queued(const Status& status, const std::shared_ptr<Fence>& callEnd) {
    Status s = status;
    if (s.isOk()) s = finishOnStream(callEnd);
    queued_.complete(s);
    finish(s.isOk() ? nullptr : pg::errorOf(s, context()));
    c10::intrusive_ptr<WorkCuda> self = c10::intrusive_ptr<WorkCuda>::unsafe_reclaim_from_nonowning(this);
    CallbackRunner::instance().post([self, s] {
      try {
        if (s.isOk()) {
          c10::StreamGuard guard(self->stream_);
          self->future_->markCompleted(c10::IValue(self->outputs_));
        } else {
          self->future_->setErrorIfNeeded(pg::errorOf(s, self->context()));
        }
      } catch (...) {
        self->future_->setErrorIfNeeded(std::current_exception());
      }
    });
  }

 private:
  // What the errors of this call start with (backend/errors.h).
  std::string context() const {
    return "nanoccl rank " + std::to_string(rank_) + ": " + what_ + " failed: ";
  }

  // Torch work on the internal stream, outside autograd (the thread's grad mode is its own);
  // no exception crosses into the engine.
  Status finishOnStream(const std::shared_ptr<Fence>& callEnd) {
    if (!copyOut_) {
      end_ = callEnd;
      return Status::ok();
    }
    try {
      c10::StreamGuard guard(stream_);
      c10::AutoGradMode noGrad(false);
      copyOut_();
    } catch (const std::exception& e) {
      return internalError(std::string("copying the result out failed: ") + e.what());
    }
    copyOut_ = nullptr;
    NANOCCL_ASSIGN_OR_RETURN(end_, cuda_->recordOn(stream_.native_handle()));
    return Status::ok();
  }

  const std::string what_;
  const std::vector<at::Tensor> outputs_;
  const c10::Device device_;
  const c10::Stream stream_;
  const std::shared_ptr<CudaDevice> cuda_;
  const std::weak_ptr<Communicator> comm_;
  std::function<void()> copyOut_;
  std::shared_ptr<Fence> end_;  // set before queued_ completes
  Completion queued_;
  const std::chrono::milliseconds timeout_;
  const Clock::time_point issued_ = Clock::now();
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace

CudaCollectives::CudaCollectives(std::shared_ptr<Communicator> comm,
                                 std::shared_ptr<CudaDevice> cudaDevice, c10::Device device,
                                 c10::Stream stream, std::chrono::milliseconds timeout)
    : comm_(std::move(comm)),
      cuda_(std::move(cudaDevice)),
      rank_(comm_->rank()),
      size_(comm_->size()),
      timeout_(timeout),
      device_(device),
      stream_(stream) {}

CudaCollectives::~CudaCollectives() = default;

Result<std::unique_ptr<CudaCollectives>> CudaCollectives::create(
    std::shared_ptr<Communicator> comm, const c10::Device& device,
    std::chrono::milliseconds timeout) {
  if (!CudaDevice::built()) return CudaDevice::create(0, nullptr).status();  // says why not
  if (!device.is_cuda() || !device.has_index()) {
    return invalidArgument("CUDA collectives on " + device.str());
  }
  if (!c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA) || cudaImpl()->deviceCount() == 0) {
    return unavailableError("this torch has no CUDA device (torch.cuda.is_available() is False)");
  }
  std::optional<c10::Stream> stream;
  try {
    // As ProcessGroupNCCL: a stream from torch's pool (normal priority), not the caller's.
    stream = cudaImpl()->getStreamFromGlobalPool(device, /*isHighPriority=*/false);
  } catch (const std::exception& e) {
    return unavailableError(std::string("no CUDA stream for ") + device.str() + ": " + e.what());
  }
  NANOCCL_ASSIGN_OR_RETURN(auto cuda, CudaDevice::create(device.index(), stream->native_handle()));
  return std::unique_ptr<CudaCollectives>(
      new CudaCollectives(std::move(comm), std::move(cuda), device, *stream, timeout));
}

Status CudaCollectives::check(const at::Tensor& t, const char* what, bool contiguous) const {
  if (!t.defined()) return invalidArgument(std::string(what) + ": undefined tensor");
  if (t.device() != device_) {
    return invalidArgument(std::string(what) + ": a tensor on " + t.device().str() +
                           ", but this process group runs its CUDA calls on " + device_.str() +
                           " (one CUDA device per rank, that of its first CUDA call)");
  }
  if (t.layout() != at::kStrided) {
    return invalidArgument(std::string(what) + ": nanoccl takes dense tensors");
  }
  if (contiguous && !t.is_contiguous()) {
    return invalidArgument(std::string(what) +
                           ": CUDA tensors must be contiguous here (call .contiguous())");
  }
  return Status::ok();
}

namespace {

Status sameType(const at::Tensor& a, const at::Tensor& b, const char* what) {
  if (a.scalar_type() == b.scalar_type()) return Status::ok();
  return invalidArgument(std::string(what) + ": tensors of different dtypes (" +
                         std::string(c10::toString(a.scalar_type())) + " and " +
                         std::string(c10::toString(b.scalar_type())) + ")");
}

size_t bytesOf(const at::Tensor& t) {
  return static_cast<size_t>(t.numel()) * static_cast<size_t>(t.element_size());
}

void* address(const at::Tensor& t) { return t.numel() == 0 ? nullptr : t.data_ptr(); }

}  // namespace

CudaCollectives::WorkResult CudaCollectives::allreduce(const at::Tensor& tensor, DataType dtype,
                                                       ReduceOp op, double factor) {
  NANOCCL_CHECK(check(tensor, "allreduce", true));
  DeviceCall call;
  call.op = OpType::kAllreduce;
  call.dtype = dtype;
  call.redop = op;
  call.premulFactor = factor;
  call.recv = address(tensor);
  call.count = static_cast<size_t>(tensor.numel());
  return run(call, c10d::OpType::ALLREDUCE, "allreduce", {tensor}, {tensor});
}

CudaCollectives::WorkResult CudaCollectives::allreduceCompressed(
    const at::Tensor& tensor, const at::Tensor& residual,
    std::shared_ptr<CompressionRequest> request, DataType dtype, ReduceOp op, double factor) {
  NANOCCL_CHECK(check(tensor, "allreduce_compressed", true));
  DeviceCall call;
  call.dtype = dtype;
  call.redop = op;
  call.premulFactor = factor;
  call.recv = address(tensor);
  call.count = static_cast<size_t>(tensor.numel());
  std::vector<at::Tensor> held{tensor};
  if (residual.defined()) {
    request->residual = residual.data_ptr<float>();
    held.push_back(residual);
  }
  call.compression = std::move(request);
  return run(call, c10d::OpType::ALLREDUCE, "allreduce_compressed", std::move(held), {tensor});
}

CudaCollectives::WorkResult CudaCollectives::broadcast(const at::Tensor& tensor, int root) {
  NANOCCL_CHECK(check(tensor, "broadcast", true));
  DeviceCall call;
  call.op = OpType::kBroadcast;
  call.dtype = DataType::kUInt8;  // only moves bytes: every dtype goes
  call.root = root;
  call.recv = address(tensor);
  call.count = bytesOf(tensor);
  return run(call, c10d::OpType::BROADCAST, "broadcast", {tensor}, {tensor});
}

CudaCollectives::WorkResult CudaCollectives::allgather(const std::vector<at::Tensor>& outputs,
                                                       const at::Tensor& input) {
  const char* what = "allgather";
  NANOCCL_CHECK(check(input, what, false));
  if (static_cast<int>(outputs.size()) != size_) {
    return invalidArgument(std::string(what) + ": expected " + std::to_string(size_) +
                           " output tensors (one per rank), got " +
                           std::to_string(outputs.size()));
  }
  for (const auto& o : outputs) {
    NANOCCL_CHECK(check(o, what, false));
    NANOCCL_CHECK(sameType(input, o, what));
    if (o.numel() != input.numel()) {
      return invalidArgument(std::string(what) + ": CUDA tensors need outputs of the input's " +
                             std::to_string(input.numel()) + " elements, got one of " +
                             std::to_string(o.numel()));
    }
  }
  // Gathered into one buffer, then copied into the outputs on the internal stream.
  const at::Tensor in = input.contiguous();
  const at::Tensor flat =
      at::empty({static_cast<int64_t>(size_) * input.numel()}, input.options());
  DeviceCall call;
  call.op = OpType::kAllgather;
  call.dtype = DataType::kUInt8;
  call.send = address(in);
  call.recv = address(flat);
  call.count = bytesOf(in);
  std::vector<at::Tensor> tensors = outputs;
  tensors.push_back(in);
  tensors.push_back(flat);
  auto copyOut = [outs = outputs, flat, n = input.numel()]() mutable {
    for (size_t r = 0; r < outs.size(); ++r) {
      outs[r].copy_(flat.narrow(0, static_cast<int64_t>(r) * n, n).view(outs[r].sizes()));
    }
  };
  return run(call, c10d::OpType::ALLGATHER, what, std::move(tensors), outputs, copyOut);
}

CudaCollectives::WorkResult CudaCollectives::allgatherBase(const at::Tensor& output,
                                                           const at::Tensor& input) {
  const char* what = "_allgather_base";
  NANOCCL_CHECK(check(input, what, false));
  NANOCCL_CHECK(check(output, what, true));
  NANOCCL_CHECK(sameType(input, output, what));
  if (output.numel() != input.numel() * size_) {
    return invalidArgument(std::string(what) + ": output has " + std::to_string(output.numel()) +
                           " elements, expected " + std::to_string(size_) + " x " +
                           std::to_string(input.numel()));
  }
  const at::Tensor in = input.contiguous();
  DeviceCall call;
  call.op = OpType::kAllgather;
  call.dtype = DataType::kUInt8;
  call.send = address(in);
  call.recv = address(output);
  call.count = bytesOf(in);
  return run(call, c10d::OpType::_ALLGATHER_BASE, what, {in, output}, {output});
}

CudaCollectives::WorkResult CudaCollectives::reduceScatter(const at::Tensor& output,
                                                           const std::vector<at::Tensor>& inputs,
                                                           DataType dtype, ReduceOp op,
                                                           double factor) {
  const char* what = "reduce_scatter";
  NANOCCL_CHECK(check(output, what, false));
  if (static_cast<int>(inputs.size()) != size_) {
    return invalidArgument(std::string(what) + ": needs one input list of " +
                           std::to_string(size_) + " tensors");
  }
  std::vector<at::Tensor> flat;
  for (const auto& t : inputs) {
    NANOCCL_CHECK(check(t, what, false));
    NANOCCL_CHECK(sameType(output, t, what));
    if (t.numel() != output.numel()) {
      return invalidArgument(std::string(what) + ": CUDA tensors need inputs of the output's " +
                             std::to_string(output.numel()) + " elements, got one of " +
                             std::to_string(t.numel()));
    }
    flat.push_back(t.reshape({-1}));
  }
  // The inputs back to back, by a copy on the caller's stream (the call waits for it).
  const at::Tensor send = at::cat(flat);
  const bool direct = output.is_contiguous();
  const at::Tensor recv = direct ? output : at::empty(output.sizes(), output.options());
  DeviceCall call;
  call.op = OpType::kReduceScatter;
  call.dtype = dtype;
  call.redop = op;
  call.premulFactor = factor;
  call.send = address(send);
  call.recv = address(recv);
  call.count = static_cast<size_t>(output.numel());
  std::function<void()> copyOut;
  if (!direct) copyOut = [out = output, recv]() mutable { out.copy_(recv); };
  return run(call, c10d::OpType::REDUCE_SCATTER, what, {send, recv, output}, {output}, copyOut);
}

CudaCollectives::WorkResult CudaCollectives::reduceScatterBase(const at::Tensor& output,
                                                               const at::Tensor& input,
                                                               DataType dtype, ReduceOp op,
                                                               double factor) {
  const char* what = "_reduce_scatter_base";
  NANOCCL_CHECK(check(input, what, false));
  NANOCCL_CHECK(check(output, what, true));
  NANOCCL_CHECK(sameType(input, output, what));
  if (input.numel() != output.numel() * size_) {
    return invalidArgument(std::string(what) + ": input has " + std::to_string(input.numel()) +
                           " elements, expected " + std::to_string(size_) + " x " +
                           std::to_string(output.numel()));
  }
  const at::Tensor in = input.contiguous();
  DeviceCall call;
  call.op = OpType::kReduceScatter;
  call.dtype = dtype;
  call.redop = op;
  call.premulFactor = factor;
  call.send = address(in);
  call.recv = address(output);
  call.count = static_cast<size_t>(output.numel());
  return run(call, c10d::OpType::_REDUCE_SCATTER_BASE, what, {in, output}, {output});
}

CudaCollectives::WorkResult CudaCollectives::run(DeviceCall call, c10d::OpType type,
                                                 const char* what,
                                                 std::vector<at::Tensor> tensors,
                                                 std::vector<at::Tensor> outputs,
                                                 std::function<void()> copyOut) {
  const auto* impl = cudaImpl();
  for (const auto& t : tensors) {
    if (t.defined() && t.has_storage() && t.is_cuda()) {  // not a host residual
      impl->recordDataPtrOnStream(t.storage().data_ptr(), stream_);
    }
  }
  const c10::Stream current = impl->getStream(device_);
  NANOCCL_ASSIGN_OR_RETURN(call.after, cuda_->recordOn(current.native_handle()));
  call.device = cuda_;
  auto work = c10::make_intrusive<WorkCuda>(rank_, type, what, std::move(outputs), device_,
                                            stream_, cuda_, comm_, std::move(copyOut), timeout_);
  std::shared_ptr<Task> task = comm_->deviceCall(call);
  // Refused on this rank before it was queued: the caller's error now, as for host calls.
  if (task->test() && task->status().code() == StatusCode::kInvalidArgument) {
    return task->status();
  }
  // The tensors go once the call's work is queued (recordStream covers the rest).
  task->onComplete([work, task = std::weak_ptr<Task>(task), held = std::move(tensors)](
                       const Status& s) mutable {
    std::shared_ptr<Fence> end;
    if (auto t = task.lock()) end = t->deviceEnd();
    work->queued(s, end);
    held.clear();
  });
  // Its caller waits on the Work, not on the Task: the worker runs it now.
  comm_->handOver();
  return c10::intrusive_ptr<c10d::Work>(std::move(work));
}

}  // namespace nanoccl
