#include "backend/process_group_nanoccl.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <functional>
#include <limits>
#include <utility>

#include "backend/c10d_store.h"
#include "backend/cuda_work.h"
#include "collectives/communicator.h"
#include "common/config.h"
#include "common/dtype.h"
#include "common/op.h"
#include "common/status.h"

namespace nanoccl {
namespace {

using TorchOp = c10d::OpType;
using TaskPtr = std::shared_ptr<Task>;
using CommPtr = std::shared_ptr<Communicator>;
using WorkPtr = c10::intrusive_ptr<c10d::Work>;
// Queues one call on the communicator; built once all checks passed.
using Queue = std::function<TaskPtr()>;

// Room past the group timeout before a Work::wait without its own timeout gives up: the
// communicator completes every Task within the timeout, so reaching this is a bug, reported
// instead of a hang.
constexpr std::chrono::milliseconds kWaitGrace{30000};

std::exception_ptr makeError(const std::string& message) {
  try {
    C10_THROW_ERROR(DistBackendError, message);
  } catch (...) {
    return std::current_exception();
  }
}

// One torch call: the Tasks it queued, the tensors they use, and what to do once they are all
// done (copy results back into non-contiguous or scattered outputs).
class WorkNanoccl : public c10d::Work {
 public:
  WorkNanoccl(int rank, TorchOp type, std::string what, std::vector<at::Tensor> outputs,
              std::chrono::milliseconds timeout, std::weak_ptr<Communicator> comm)
      : c10d::Work(rank, type),
        what_(std::move(what)),
        outputs_(std::move(outputs)),
        timeout_(timeout),
        comm_(std::move(comm)),
        future_(c10::make_intrusive<c10::ivalue::Future>(
            c10::ListType::create(c10::TensorType::get()))) {}

  // Keeps `t` alive until the Work completes (the communicator reads or writes it).
  void hold(at::Tensor t) { held_.push_back(std::move(t)); }
  // Runs once every Task succeeded, on the completing thread, before the Work is marked done.
  void atSuccess(std::function<void()> fn) { finishers_.push_back(std::move(fn)); }

  // Queues the calls (nothing may fail after the first is queued: every check is done by
  // then) and registers completion on their Tasks. Call once, after everything above.
  static void start(const c10::intrusive_ptr<WorkNanoccl>& work,
                    const std::vector<std::function<std::shared_ptr<Task>()>>& queue) {
    std::vector<std::shared_ptr<Task>> tasks;
    tasks.reserve(queue.size());
    for (const auto& q : queue) tasks.push_back(q());
    if (tasks.empty()) {
      work->complete(Status::ok());
      return;
    }
    work->pending_.store(static_cast<int>(tasks.size()));
    for (const TaskPtr& task : tasks) {
      Task* raw = task.get();  // valid while it runs its own callback
      task->onComplete([work, raw](const Status& s) { work->taskDone(s, raw->source()); });
    }
  }

  bool wait(std::chrono::milliseconds timeout) override {
    const auto limit =
        timeout == kNoTimeout || timeout.count() < 0 ? timeout_ + kWaitGrace : timeout;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (!cv_.wait_for(lock, limit, [&] { return completed_; })) {
        C10_THROW_ERROR(DistBackendError, "nanoccl rank " + std::to_string(rank_) + ": " + what_ +
                                              " did not complete within " +
                                              std::to_string(limit.count()) + " ms of waiting");
      }
    }
    // Set right after the Work is finished (complete()), before any callback runs.
    future_->wait();
    std::lock_guard<std::mutex> lock(mutex_);
    if (exception_) std::rethrow_exception(exception_);
    return true;
  }

  bool isCompleted() override { return c10d::Work::isCompleted() && future_->completed(); }

  void synchronize() override {}
  int sourceRank() const override { return source_.load(); }
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

  void abort() override {
    if (auto comm = comm_.lock()) {
      comm->abort(abortedError("rank " + std::to_string(rank_) + " aborted " + what_));
    }
  }

 private:
  void taskDone(const Status& s, int source) {
    if (source >= 0) source_.store(source);
    if (!s.isOk()) {
      std::lock_guard<std::mutex> lock(errorMu_);
      if (firstError_.isOk()) firstError_ = s;
    }
    if (pending_.fetch_sub(1) != 1) return;
    Status final;
    {
      std::lock_guard<std::mutex> lock(errorMu_);
      final = firstError_;
    }
    complete(final);
  }

  void complete(const Status& s) {
    std::exception_ptr error;
    if (s.isOk()) {
      try {
        for (auto& fn : finishers_) fn();
      } catch (const std::exception& e) {
        error = makeError("nanoccl rank " + std::to_string(rank_) + ": " + what_ +
                          ": copying the result out failed: " + e.what());
      }
    } else {
      error = makeError("nanoccl rank " + std::to_string(rank_) + ": " + what_ +
                        " failed: " + s.toString());
    }
    finishers_.clear();
    held_.clear();
    // The Work first, then the future (whose callbacks run here): a callback may wait on this
    // Work. wait() and isCompleted() also cover the future, so no one sees one done and not
    // the other.
    finish(error);
    if (error) {
      future_->setError(error);
    } else {
      future_->markCompleted(c10::IValue(outputs_));
    }
  }

  const std::string what_;
  const std::vector<at::Tensor> outputs_;
  const std::chrono::milliseconds timeout_;
  const std::weak_ptr<Communicator> comm_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::vector<at::Tensor> held_;
  std::vector<std::function<void()>> finishers_;
  std::atomic<int> pending_{0};
  std::atomic<int> source_{-1};
  std::mutex errorMu_;
  Status firstError_;
};

// ---- tensors -> buffers --------------------------------------------------------------------

// A rejected call. Thrown before anything is queued; run() turns it into a c10::Error.
struct CallError {
  std::string message;
};

[[noreturn]] void reject(const std::string& message) { throw CallError{message}; }

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

// How a tensor's elements travel: its own type, or bytes for a type nanoccl does not reduce
// (float8, uint16...), which is fine for calls that only move data.
struct Wire {
  DataType dtype;
  size_t perElement;  // wire elements per tensor element
};

Wire moveType(const at::Tensor& t) {
  if (auto d = mapType(t.scalar_type())) return {*d, 1};
  return {DataType::kUInt8, static_cast<size_t>(t.element_size())};
}

DataType reduceType(const at::Tensor& t, const char* what) {
  auto d = mapType(t.scalar_type());
  if (!d) {
    reject(std::string(what) + ": dtype " + std::string(c10::toString(t.scalar_type())) +
           " is not supported for reductions (float, double, half, bfloat16, int8, uint8, "
           "int16, int32, int64, bool, complex64, complex128)");
  }
  return *d;
}

struct Reduction {
  ReduceOp op;
  double factor = 1.0;
};

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

// The contiguous tensor a call reads.
at::Tensor input(WorkNanoccl& work, const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  work.hold(c);
  return c;
}

// The contiguous tensor a call writes into `t` through. If `t` is not contiguous the result is
// copied back at success; `keep` says whether the call also reads what `t` holds (in place).
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

// A scratch buffer whose pieces land in `outs` (in order, back to back) at success.
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

// The tensors of `ins` back to back in one contiguous buffer.
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
    reject(std::string(what) + ": tensors of different dtypes (" +
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

// The node of this rank as torch knows it: torchrun's node rank. Empty (the core then uses the
// host and network namespace) outside torchrun; NANOCCL_NODE_ID overrides both in the core.
std::string torchNodeId() {
  const char* groupRank = std::getenv("GROUP_RANK");
  if (groupRank == nullptr || *groupRank == '\0') return {};
  return std::string("group_rank:") + groupRank;
}

std::string rankLabel(int rank, int size) {
  return "rank " + std::to_string(rank) + " (of " + std::to_string(size) + ")";
}

}  // namespace

// ---- Options ---------------------------------------------------------------------------------

ProcessGroupNanoccl::Options::Options(std::chrono::milliseconds timeout)
    : c10d::Backend::Options(kBackendName, timeout) {}

c10::intrusive_ptr<ProcessGroupNanoccl::Options> ProcessGroupNanoccl::Options::create(
    std::chrono::milliseconds timeout) {
  return c10::make_intrusive<Options>(timeout);
}

// ---- construction ----------------------------------------------------------------------------

ProcessGroupNanoccl::ProcessGroupNanoccl(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                         int size, c10::intrusive_ptr<Options> options)
    : c10d::Backend(rank, size), options_(std::move(options)) {
  TORCH_CHECK(store, "nanoccl: no store");
  TORCH_CHECK(options_, "nanoccl: no options");
  TORCH_CHECK(size >= 1 && rank >= 0 && rank < size, "nanoccl: rank ", rank,
              " is outside a group of size ", size);
  TORCH_CHECK(options_->timeout.count() > 0, "nanoccl: the timeout must be positive");
  init();
  groupName_ = options_->groupName.empty() ? "default" : options_->groupName;
  const std::string who = rankLabel(rank, size) + " of group '" + groupName_ + "'";

  auto config = Config::fromEnv();
  TORCH_CHECK(config.isOk(), "nanoccl: ", config.status().toString());
  for (const auto& [name, value] : options_->settings) {
    const Status s = config->set(name, value);
    TORCH_CHECK(s.isOk(), "nanoccl: ", s.message());
  }
  config->logOnce();

  auto cstore = std::make_shared<C10dStore>(store);
  // torch gives each group its own PrefixStore; the creation counter also keeps apart several
  // communicators made on one store (a C++ user reusing a store, a group re-created after
  // destroy_process_group). Every rank creates the group's communicators in the same order, so
  // the size-th increments of the counter belong to one creation.
  auto n = cstore->add("nanoccl/creations", 1);
  if (!n.isOk()) {
    C10_THROW_ERROR(DistBackendError,
                    "nanoccl " + who + ": rendezvous failed: " + n.status().toString());
  }
  commId_ = groupName_ + "." + std::to_string((n.value() - 1) / size);

  CommunicatorOptions copts;
  copts.rank = rank;
  copts.size = size;
  copts.store = cstore;
  store_ = cstore;
  copts.commId = commId_;
  copts.config = config.value();
  copts.timeout = options_->timeout;
  copts.nodeId = torchNodeId();
  auto comm = Communicator::create(copts);
  if (!comm.isOk()) {
    C10_THROW_ERROR(DistBackendError, "nanoccl " + who + ": creating the communicator failed: " +
                                          comm.status().toString());
  }
  comm_ = std::move(comm).value();
  nodes_ = comm_->topology().nodeIds;
}

c10::intrusive_ptr<c10d::Backend> ProcessGroupNanoccl::create(
    const c10d::DistributedBackendOptions& dist, c10::intrusive_ptr<Options> options) {
  if (!options) options = Options::create();
  options->timeout = std::chrono::duration_cast<std::chrono::milliseconds>(dist.timeout);
  options->groupName = dist.group_id;
  options->globalRanks = dist.global_ranks_in_group;
  return c10::make_intrusive<ProcessGroupNanoccl>(dist.store, dist.group_rank, dist.group_size,
                                                  std::move(options));
}

ProcessGroupNanoccl::~ProcessGroupNanoccl() {
  std::shared_ptr<Communicator> comm;
  std::shared_ptr<CudaCollectives> cuda;
  {
    std::lock_guard<std::mutex> lock(mu_);
    comm = std::move(comm_);
    cuda = std::move(cuda_);
    pending_.clear();
  }
  // The destructors fail what is pending and join their threads.
  cuda.reset();
  comm.reset();
}

// ---- lifecycle ------------------------------------------------------------------------------

std::shared_ptr<Communicator> ProcessGroupNanoccl::live(const char* what) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!comm_) {
    C10_THROW_ERROR(DistBackendError, "nanoccl " + rankLabel(rank_, size_) + " of group '" +
                                          groupName_ + "': " + what +
                                          " after the process group was " +
                                          (closedReason_.empty() ? "shut down" : closedReason_));
  }
  return comm_;
}

uint64_t ProcessGroupNanoccl::getSequenceNumberForGroup() {
  std::lock_guard<std::mutex> lock(mu_);
  return seq_;
}

void ProcessGroupNanoccl::abort() {
  std::shared_ptr<Communicator> comm;
  std::shared_ptr<CudaCollectives> cuda;
  {
    std::lock_guard<std::mutex> lock(mu_);
    comm = std::move(comm_);
    cuda = std::move(cuda_);
    closedReason_ = "aborted";
    pending_.clear();
  }
  const Status why = abortedError("rank " + std::to_string(rank_) + " aborted the process group");
  if (cuda) cuda->abort(why);
  if (comm) comm->abort(why);
  cuda.reset();
  comm.reset();
}

void ProcessGroupNanoccl::shutdown() {
  std::vector<c10::weak_intrusive_ptr<c10d::Work>> pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!comm_) return;
    pending = std::move(pending_);
  }
  // Let what was issued finish first, so that peers still receiving from this rank are not
  // cut off; every Task completes within the timeout.
  const auto deadline = std::chrono::steady_clock::now() + options_->timeout;
  for (auto& weak : pending) {
    if (auto work = weak.lock()) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      try {
        work->wait(left);
      } catch (const std::exception&) {
        // Its error belongs to whoever waits on it; shutting down goes on.
      }
    }
  }
  std::shared_ptr<Communicator> comm;
  std::shared_ptr<CudaCollectives> cuda;
  {
    std::lock_guard<std::mutex> lock(mu_);
    comm = std::move(comm_);
    cuda = std::move(cuda_);
    closedReason_ = "shut down";
  }
  // CUDA calls whose Work was waited on may still run on the GPU: let them end first.
  if (cuda) cuda->shutdown(Deadline(deadline));
  cuda.reset();
  comm.reset();
}

// ---- stats ----------------------------------------------------------------------------------

namespace {

// `into` += `from`, peer by peer (both indexed by group rank).
void addStats(CommStats& into, const CommStats& from) {
  if (into.perPeer.size() < from.perPeer.size()) into.perPeer.resize(from.perPeer.size());
  for (size_t r = 0; r < from.perPeer.size(); ++r) {
    into.perPeer[r].bytesSent += from.perPeer[r].bytesSent;
    into.perPeer[r].bytesReceived += from.perPeer[r].bytesReceived;
    into.perPeer[r].messagesSent += from.perPeer[r].messagesSent;
    into.perPeer[r].messagesReceived += from.perPeer[r].messagesReceived;
  }
  auto sum = [](std::vector<uint64_t>& a, const std::vector<uint64_t>& b) {
    if (a.size() < b.size()) a.resize(b.size());
    for (size_t i = 0; i < b.size(); ++i) a[i] += b[i];
  };
  sum(into.bytesSentPerOp, from.bytesSentPerOp);
  sum(into.bytesReceivedPerOp, from.bytesReceivedPerOp);
  into.intraNodeBytesSent += from.intraNodeBytesSent;
  into.intraNodeBytesReceived += from.intraNodeBytesReceived;
  into.interNodeBytesSent += from.interNodeBytesSent;
  into.interNodeBytesReceived += from.interNodeBytesReceived;
  into.callsPerAlgorithm.insert(into.callsPerAlgorithm.end(), from.callsPerAlgorithm.begin(),
                                from.callsPerAlgorithm.end());
}

}  // namespace

BackendStats ProcessGroupNanoccl::stats() const {
  BackendStats out;
  out.rank = rank_;
  out.size = size_;
  out.node = rank_ < static_cast<int>(nodes_.size()) ? nodes_[rank_] : std::string();
  std::shared_ptr<Communicator> comm;
  std::shared_ptr<CudaCollectives> cuda;
  {
    std::lock_guard<std::mutex> lock(mu_);
    comm = comm_;
    cuda = cuda_;
  }
  if (!comm) return out;
  CommStats cs = comm->stats();
  // The CUDA calls' host-staged bytes (their own communicators) count like any other.
  if (cuda) addStats(cs, cuda->stats());
  out.calls = cs.calls;
  for (int r = 0; r < size_; ++r) {
    BackendStats::Peer p;
    p.rank = r;
    p.node = r < static_cast<int>(nodes_.size()) ? nodes_[r] : std::string();
    p.sameNode = p.node == out.node;
    if (r < static_cast<int>(cs.perPeer.size())) {
      const auto& c = cs.perPeer[r];
      p.bytes.sent = c.bytesSent;
      p.bytes.received = c.bytesReceived;
      p.messagesSent = c.messagesSent;
      p.messagesReceived = c.messagesReceived;
    }
    out.peers.push_back(std::move(p));
  }
  out.intraNode = {cs.intraNodeBytesSent, cs.intraNodeBytesReceived};
  out.interNode = {cs.interNodeBytesSent, cs.interNodeBytesReceived};
  out.perAlgorithm = cs.callsPerAlgorithm;
  const size_t nops = std::max(cs.bytesSentPerOp.size(), cs.bytesReceivedPerOp.size());
  for (size_t i = 0; i < nops; ++i) {
    BackendStats::Bytes b;
    if (i < cs.bytesSentPerOp.size()) b.sent = cs.bytesSentPerOp[i];
    if (i < cs.bytesReceivedPerOp.size()) b.received = cs.bytesReceivedPerOp[i];
    if (b.sent == 0 && b.received == 0) continue;
    out.perOp.emplace_back(opTypeName(static_cast<nanoccl::OpType>(i)), b);
  }
  return out;
}

// ---- calls ----------------------------------------------------------------------------------

template <typename Fn>
c10::intrusive_ptr<c10d::Work> ProcessGroupNanoccl::run(const char* what, bool collective,
                                                        Fn&& fn) {
  auto comm = live(what);
  try {
    c10::intrusive_ptr<c10d::Work> work = fn(*comm, comm);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (collective) ++seq_;
      // Collectives complete in call order, so only the last one needs remembering.
      pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                    [](const auto& w) { return w.expired(); }),
                     pending_.end());
      pending_.push_back(c10::weak_intrusive_ptr<c10d::Work>(work));
    }
    return work;
  } catch (const CallError& e) {
    const std::string message = "nanoccl " + rankLabel(rank_, size_) + ": " + e.message;
    if (collective) {
      // The peers have queued (or will queue) their side of this call: fail them now rather
      // than at the timeout.
      comm->abort(invalidArgument(message));
      std::shared_ptr<CudaCollectives> cuda;
      {
        std::lock_guard<std::mutex> lock(mu_);
        cuda = cuda_;
      }
      if (cuda) cuda->abort(invalidArgument(message));
    }
    TORCH_CHECK(false, message);
  }
}

namespace {

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

// The Work of a CUDA call; a call its CUDA side rejects is rejected like any other.
c10::intrusive_ptr<c10d::Work> cudaWork(CudaCollectives::WorkResult r, int rank, int size) {
  if (r.isOk()) return std::move(r).value();
  if (r.status().code() == StatusCode::kInvalidArgument) reject(r.status().message());
  C10_THROW_ERROR(DistBackendError,
                  "nanoccl " + rankLabel(rank, size) + ": " + r.status().toString());
}

}  // namespace

std::shared_ptr<CudaCollectives> ProcessGroupNanoccl::cuda(Communicator& comm,
                                                           const at::Tensor& t,
                                                           const char* what) {
  std::lock_guard<std::mutex> lock(mu_);
  if (cuda_) return cuda_;
  CudaGroupOptions o;
  o.rank = rank_;
  o.size = size_;
  o.topology = comm.topology();
  o.store = store_;
  o.commId = commId_;
  o.config = comm.config();
  o.timeout = options_->timeout;
  auto created = CudaCollectives::create(o, t.device());
  if (!created.isOk()) reject(std::string(what) + ": " + created.status().message());
  cuda_ = std::move(created).value();
  return cuda_;
}

// Inside run()'s lambdas: `comm` stays alive for the call (run() holds `owner`); the Tasks do
// not need it afterwards.
#define NANOCCL_WORK(type, what, outputs) \
  newWork(rank_, type, what, outputs, options_->timeout, owner)

c10::intrusive_ptr<c10d::Work> ProcessGroupNanoccl::broadcast(std::vector<at::Tensor>& tensors,
                                                              const c10d::BroadcastOptions& opts) {
  return run("broadcast", true, [&](Communicator& comm, const CommPtr& owner) -> WorkPtr {
    if (tensors.size() == 1 && onCuda(tensors[0])) {
      const int root = checkRoot(opts.rootRank, size_, "broadcast");
      if (opts.rootTensor != 0) reject("broadcast: rootTensor must be 0");
      return cudaWork(cuda(comm, tensors[0], "broadcast")->broadcast(tensors[0], root), rank_,
                      size_);
    }
    checkOne(tensors, "broadcast");
    const int root = checkRoot(opts.rootRank, size_, "broadcast");
    if (opts.rootTensor != 0) reject("broadcast: rootTensor must be 0");
    auto work = NANOCCL_WORK(c10d::OpType::BROADCAST, "broadcast", tensors);
    const Wire w = moveType(tensors[0]);
    at::Tensor buf = output(*work, tensors[0], /*keep=*/true);
    WorkNanoccl::start(work,
                       {[&] { return comm.broadcast(ptr(buf), count(buf, w), w.dtype, root); }});
    return work;
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNanoccl::allreduce(std::vector<at::Tensor>& tensors,
                                                              const c10d::AllreduceOptions& opts) {
  return run("allreduce", true, [&](Communicator& comm, const CommPtr& owner) -> WorkPtr {
    if (tensors.size() == 1 && onCuda(tensors[0])) {
      const DataType dt = reduceType(tensors[0], "allreduce");
      const Reduction red = mapReduction(opts.reduceOp, dt, "allreduce");
      return cudaWork(
          cuda(comm, tensors[0], "allreduce")->allreduce(tensors[0], dt, red.op, red.factor),
          rank_, size_);
    }
    checkOne(tensors, "allreduce");
    const DataType dt = reduceType(tensors[0], "allreduce");
    const Reduction red = mapReduction(opts.reduceOp, dt, "allreduce");
    auto work = NANOCCL_WORK(c10d::OpType::ALLREDUCE, "allreduce", tensors);
    at::Tensor buf = output(*work, tensors[0], true);
    WorkNanoccl::start(work, {[&] {
                         return comm.allreduce(ptr(buf), static_cast<size_t>(buf.numel()), dt,
                                               red.op, red.factor);
                       }});
    return work;
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNanoccl::allreduceCompressed(
    at::Tensor& tensor, at::Tensor& residual, const std::string& codec, int64_t blockSize,
    const c10d::ReduceOp& op) {
  return run("allreduce_compressed", true, [&](Communicator& comm, const CommPtr& owner) {
    const char* what = "allreduce_compressed";
    checkTensor(tensor, what);
    if (tensor.scalar_type() != at::kFloat) {
      reject(std::string(what) + ": takes float32 tensors, got " +
             std::string(c10::toString(tensor.scalar_type())));
    }
    if (residual.defined()) {
      checkTensor(residual, what);
      if (residual.scalar_type() != at::kFloat || !residual.is_contiguous() ||
          residual.numel() != tensor.numel()) {
        reject(std::string(what) + ": the residual must be a contiguous float32 tensor of " +
               std::to_string(tensor.numel()) + " elements, got " +
               std::string(c10::toString(residual.scalar_type())) + " x " +
               std::to_string(residual.numel()));
      }
      if (residual.data_ptr() == tensor.data_ptr()) {
        reject(std::string(what) + ": the residual must not share memory with the tensor");
      }
    }
    if (blockSize < 0 || blockSize > std::numeric_limits<uint32_t>::max()) {
      reject(std::string(what) + ": block_size " + std::to_string(blockSize) + " out of range");
    }
    const Reduction red = mapReduction(op, DataType::kFloat32, what);
    std::vector<at::Tensor> tensors{tensor};
    auto work = NANOCCL_WORK(c10d::OpType::ALLREDUCE, what, tensors);
    at::Tensor buf = output(*work, tensor, true);
    CompressionRequest request;
    request.codec = codec;
    request.blockSize = static_cast<uint32_t>(blockSize);
    if (residual.defined()) {
      work->hold(residual);
      request.residual = residual.data_ptr<float>();
    }
    WorkNanoccl::start(work, {[&] {
                         return comm.allreduceCompressed(ptr(buf),
                                                         static_cast<size_t>(buf.numel()),
                                                         DataType::kFloat32, red.op, request,
                                                         red.factor);
                       }});
    return work;
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNanoccl::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  return run("allreduce_coalesced", true, [&](Communicator& comm, const CommPtr& owner) {
    if (tensors.empty()) reject("allreduce_coalesced: no tensors");
    for (const auto& t : tensors) {
      checkTensor(t, "allreduce_coalesced");
      checkSameType(tensors[0], t, "allreduce_coalesced");
    }
    const DataType dt = reduceType(tensors[0], "allreduce_coalesced");
    const Reduction red = mapReduction(opts.reduceOp, dt, "allreduce_coalesced");
    auto work = NANOCCL_WORK(c10d::OpType::ALLREDUCE_COALESCED, "allreduce_coalesced", tensors);
    // One call on the tensors back to back: one message per step instead of one per tensor.
    at::Tensor flat = concatInput(*work, tensors);
    work->atSuccess([outs = tensors, flat]() mutable {
      int64_t off = 0;
      for (auto& o : outs) {
        const int64_t n = o.numel();
        o.copy_(flat.narrow(0, off, n).view(o.sizes()));
        off += n;
      }
    });
    for (const auto& t : tensors) work->hold(t);
    WorkNanoccl::start(work, {[&] {
                         return comm.allreduce(ptr(flat), static_cast<size_t>(flat.numel()), dt,
                                               red.op, red.factor);
                       }});
    return work;
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNanoccl::reduce(std::vector<at::Tensor>& tensors,
                                                           const c10d::ReduceOptions& opts) {
  return run("reduce", true, [&](Communicator& comm, const CommPtr& owner) {
    checkOne(tensors, "reduce");
    const int root = checkRoot(opts.rootRank, size_, "reduce");
    if (opts.rootTensor != 0) reject("reduce: rootTensor must be 0");
    const DataType dt = reduceType(tensors[0], "reduce");
    const Reduction red = mapReduction(opts.reduceOp, dt, "reduce");
    auto work = NANOCCL_WORK(c10d::OpType::REDUCE, "reduce", tensors);
    at::Tensor buf = output(*work, tensors[0], true);
    WorkNanoccl::start(work, {[&] {
                         return comm.reduce(ptr(buf), static_cast<size_t>(buf.numel()), dt, red.op,
                                            root, red.factor);
                       }});
    return work;
  });
}

namespace {

// Queues one allgather of `in` into `outs` (one tensor per rank, sizes may differ).
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

// Queues one allgather of `in` into the flat `out` (size x in.numel() elements).
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

// Queues one reduce-scatter of the flat `in` (size x out.numel() elements) into `out`.
Queue reduceScatterFlat(Communicator& comm, WorkNanoccl& work, const at::Tensor& out,
                        const at::Tensor& in, const c10d::ReduceOp& rop, int size,
                        const char* what) {
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
  return [&comm, send, recv, counts, dt, red] {
    return comm.reduceScatter(ptr(send), ptr(recv), counts, dt, red.op, red.factor);
  };
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupNanoccl::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return run("allgather", true, [&](Communicator& comm, const CommPtr& owner) -> WorkPtr {
    if (inputs.size() == 1 && onCuda(inputs[0])) {
      if (outputs.size() != 1) reject("allgather: takes one output list per rank");
      return cudaWork(cuda(comm, inputs[0], "allgather")->allgather(outputs[0], inputs[0]), rank_,
                      size_);
    }
    checkOne(inputs, "allgather");
    if (outputs.size() != 1) reject("allgather: takes one output list per rank");
    auto work = NANOCCL_WORK(c10d::OpType::ALLGATHER, "allgather", outputs[0]);
    WorkNanoccl::start(
        work, {allgatherInto(comm, *work, inputs[0], outputs[0], rank_, size_, "allgather")});
    return work;
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNanoccl::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  return run("_allgather_base", true, [&](Communicator& comm, const CommPtr& owner) -> WorkPtr {
    if (onCuda(input) || onCuda(output)) {
      const at::Tensor& any = onCuda(input) ? input : output;
      return cudaWork(cuda(comm, any, "_allgather_base")->allgatherBase(output, input), rank_,
                      size_);
    }
    auto work = NANOCCL_WORK(c10d::OpType::_ALLGATHER_BASE, "_allgather_base", {output});
    WorkNanoccl::start(work, {allgatherFlat(comm, *work, output, input, size_, "_allgather_base")});
    return work;
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNanoccl::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return run("allgather_coalesced", true, [&](Communicator& comm, const CommPtr& owner) {
    if (outputLists.size() != static_cast<size_t>(size_)) {
      reject("allgather_coalesced: expected " + std::to_string(size_) +
             " output lists (one per rank), got " + std::to_string(outputLists.size()));
    }
    std::vector<at::Tensor> flatOutputs;
    for (const auto& list : outputLists) {
      if (list.size() != inputs.size()) {
        reject("allgather_coalesced: each output list needs one tensor per input (" +
               std::to_string(inputs.size()) + "), got " + std::to_string(list.size()));
      }
      flatOutputs.insert(flatOutputs.end(), list.begin(), list.end());
    }
    auto work = NANOCCL_WORK(c10d::OpType::ALLGATHER_COALESCED, "allgather_coalesced", flatOutputs);
    std::vector<Queue> tasks;
    // outputLists[r][i] is input i of rank r.
    for (size_t i = 0; i < inputs.size(); ++i) {
      std::vector<at::Tensor> outs;
      for (int r = 0; r < size_; ++r) outs.push_back(outputLists[r][i]);
      tasks.push_back(
          allgatherInto(comm, *work, inputs[i], outs, rank_, size_, "allgather_coalesced"));
    }
    WorkNanoccl::start(work, std::move(tasks));
    return work;
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNanoccl::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return run("allgather_into_tensor_coalesced", true,
             [&](Communicator& comm, const CommPtr& owner) {
               if (outputs.size() != inputs.size()) {
                 reject("allgather_into_tensor_coalesced: " + std::to_string(outputs.size()) +
                        " outputs for " + std::to_string(inputs.size()) + " inputs");
               }
               auto work = NANOCCL_WORK(c10d::OpType::ALLGATHER_COALESCED,
                                        "allgather_into_tensor_coalesced", outputs);
               std::vector<Queue> tasks;
               for (size_t i = 0; i < inputs.size(); ++i) {
                 tasks.push_back(allgatherFlat(comm, *work, outputs[i], inputs[i], size_,
                                               "allgather_into_tensor_coalesced"));
               }
               WorkNanoccl::start(work, std::move(tasks));
               return work;
             });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNanoccl::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  return run("gather", true, [&](Communicator& comm, const CommPtr& owner) {
    checkOne(inputs, "gather");
    const int root = checkRoot(opts.rootRank, size_, "gather");
    const at::Tensor& in = inputs[0];
    const Wire w = moveType(in);
    std::vector<at::Tensor> outs;
    if (rank_ == root) {
      if (outputs.size() != 1 || static_cast<int>(outputs[0].size()) != size_) {
        reject("gather: the root needs one output list of " + std::to_string(size_) + " tensors");
      }
      outs = outputs[0];
      for (const auto& o : outs) {
        checkTensor(o, "gather");
        checkSameType(in, o, "gather");
      }
      if (outs[rank_].numel() != in.numel()) {
        reject("gather: the root's output for itself has " + std::to_string(outs[rank_].numel()) +
               " elements, its input " + std::to_string(in.numel()));
      }
    } else if (!outputs.empty() && !(outputs.size() == 1 && outputs[0].empty())) {
      reject("gather: only the root (rank " + std::to_string(root) + ") takes output tensors");
    }
    auto work = NANOCCL_WORK(c10d::OpType::GATHER, "gather", outs);
    at::Tensor send = input(*work, in);
    std::vector<size_t> counts;
    void* recv = nullptr;
    if (rank_ == root) {
      at::Tensor flat = gatherBuffer(*work, outs, in.options());
      recv = ptr(flat);
      for (const auto& o : outs) counts.push_back(count(o, w));
    } else {
      counts.assign(static_cast<size_t>(size_), count(send, w));
    }
    WorkNanoccl::start(work, {[&] {
                         return comm.gather(ptr(send), count(send, w), recv, counts, w.dtype, root);
                       }});
    return work;
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNanoccl::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  return run("scatter", true, [&](Communicator& comm, const CommPtr& owner) {
    checkOne(outputs, "scatter");
    const int root = checkRoot(opts.rootRank, size_, "scatter");
    const at::Tensor& out = outputs[0];
    const Wire w = moveType(out);
    auto work = NANOCCL_WORK(c10d::OpType::SCATTER, "scatter", outputs);
    std::vector<size_t> counts;
    const void* send = nullptr;
    if (rank_ == root) {
      if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != size_) {
        reject("scatter: the root needs one input list of " + std::to_string(size_) + " tensors");
      }
      for (const auto& t : inputs[0]) {
        checkTensor(t, "scatter");
        checkSameType(out, t, "scatter");
        counts.push_back(count(t, w));
      }
      if (inputs[0][rank_].numel() != out.numel()) {
        reject("scatter: the root's input for itself has " +
               std::to_string(inputs[0][rank_].numel()) + " elements, its output " +
               std::to_string(out.numel()));
      }
      send = ptr(concatInput(*work, inputs[0]));
    } else {
      if (!inputs.empty() && !(inputs.size() == 1 && inputs[0].empty())) {
        reject("scatter: only the root (rank " + std::to_string(root) + ") takes input tensors");
      }
      counts.assign(static_cast<size_t>(size_), count(out, w));
    }
    at::Tensor recv = output(*work, out, false);
    WorkNanoccl::start(
        work,
        {[&] { return comm.scatter(send, counts, ptr(recv), count(recv, w), w.dtype, root); }});
    return work;
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNanoccl::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  return run("reduce_scatter", true, [&](Communicator& comm, const CommPtr& owner) -> WorkPtr {
    if (outputs.size() == 1 && onCuda(outputs[0])) {
      if (inputs.size() != 1) reject("reduce_scatter: needs one input list");
      const DataType dt = reduceType(outputs[0], "reduce_scatter");
      const Reduction red = mapReduction(opts.reduceOp, dt, "reduce_scatter");
      return cudaWork(cuda(comm, outputs[0], "reduce_scatter")
                          ->reduceScatter(outputs[0], inputs[0], dt, red.op, red.factor),
                      rank_, size_);
    }
    checkOne(outputs, "reduce_scatter");
    if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != size_) {
      reject("reduce_scatter: needs one input list of " + std::to_string(size_) + " tensors");
    }
    const at::Tensor& out = outputs[0];
    std::vector<size_t> counts;
    for (const auto& t : inputs[0]) {
      checkTensor(t, "reduce_scatter");
      checkSameType(out, t, "reduce_scatter");
      counts.push_back(static_cast<size_t>(t.numel()));
    }
    if (inputs[0][rank_].numel() != out.numel()) {
      reject("reduce_scatter: this rank's input part has " +
             std::to_string(inputs[0][rank_].numel()) + " elements, its output " +
             std::to_string(out.numel()));
    }
    const DataType dt = reduceType(out, "reduce_scatter");
    const Reduction red = mapReduction(opts.reduceOp, dt, "reduce_scatter");
    auto work = NANOCCL_WORK(c10d::OpType::REDUCE_SCATTER, "reduce_scatter", outputs);
    at::Tensor send = concatInput(*work, inputs[0]);
    at::Tensor recv = output(*work, out, false);
    WorkNanoccl::start(
        work,
        {[&] { return comm.reduceScatter(ptr(send), ptr(recv), counts, dt, red.op, red.factor); }});
    return work;
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNanoccl::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  return run(
      "_reduce_scatter_base", true, [&](Communicator& comm, const CommPtr& owner) -> WorkPtr {
        if (onCuda(input) || onCuda(output)) {
          const at::Tensor& any = onCuda(input) ? input : output;
          const DataType dt = reduceType(any, "_reduce_scatter_base");
          const Reduction red = mapReduction(opts.reduceOp, dt, "_reduce_scatter_base");
          return cudaWork(cuda(comm, any, "_reduce_scatter_base")
                              ->reduceScatterBase(output, input, dt, red.op, red.factor),
                          rank_, size_);
        }
        auto work =
            NANOCCL_WORK(c10d::OpType::_REDUCE_SCATTER_BASE, "_reduce_scatter_base", {output});
        WorkNanoccl::start(work, {reduceScatterFlat(comm, *work, output, input, opts.reduceOp,
                                                    size_, "_reduce_scatter_base")});
        return work;
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNanoccl::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  return run(
      "reduce_scatter_tensor_coalesced", true, [&](Communicator& comm, const CommPtr& owner) {
        if (outputs.size() != inputs.size()) {
          reject("reduce_scatter_tensor_coalesced: " + std::to_string(outputs.size()) +
                 " outputs for " + std::to_string(inputs.size()) + " inputs");
        }
        auto work = NANOCCL_WORK(c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED,
                                 "reduce_scatter_tensor_coalesced", outputs);
        std::vector<Queue> tasks;
        for (size_t i = 0; i < inputs.size(); ++i) {
          tasks.push_back(reduceScatterFlat(comm, *work, outputs[i], inputs[i], opts.reduceOp,
                                            size_, "reduce_scatter_tensor_coalesced"));
        }
        WorkNanoccl::start(work, std::move(tasks));
        return work;
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNanoccl::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& outputSplitSizes,
    std::vector<int64_t>& inputSplitSizes, const c10d::AllToAllOptions& opts) {
  return run("alltoall_base", true, [&](Communicator& comm, const CommPtr& owner) {
    checkTensor(input, "alltoall_base");
    checkTensor(output, "alltoall_base");
    checkSameType(input, output, "alltoall_base");
    const Wire w = moveType(input);
    // Split sizes count rows (the first dimension); empty means equal parts.
    auto counts = [&](const at::Tensor& t, const std::vector<int64_t>& splits, const char* side) {
      std::vector<size_t> c;
      if (splits.empty()) {
        if (t.numel() % size_ != 0) {
          reject(std::string("alltoall_base: ") + side + " of " + std::to_string(t.numel()) +
                 " elements does not split into " + std::to_string(size_) + " equal parts");
        }
        c.assign(static_cast<size_t>(size_), count(t, w) / size_);
        return c;
      }
      if (static_cast<int>(splits.size()) != size_) {
        reject(std::string("alltoall_base: ") + side + " split sizes has " +
               std::to_string(splits.size()) + " entries for a group of " + std::to_string(size_));
      }
      const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
      const size_t perRow = rows == 0 ? 0 : count(t, w) / static_cast<size_t>(rows);
      int64_t sum = 0;
      for (int64_t s : splits) {
        if (s < 0) reject(std::string("alltoall_base: negative ") + side + " split size");
        sum += s;
        c.push_back(static_cast<size_t>(s) * perRow);
      }
      if (sum != rows) {
        reject(std::string("alltoall_base: ") + side + " split sizes add up to " +
               std::to_string(sum) + " rows, the tensor has " + std::to_string(rows));
      }
      return c;
    };
    const auto sendCounts = counts(input, inputSplitSizes, "input");
    const auto recvCounts = counts(output, outputSplitSizes, "output");
    auto work = NANOCCL_WORK(c10d::OpType::ALLTOALL_BASE, "alltoall_base", {output});
    at::Tensor send = input.is_contiguous() ? input : input.contiguous();
    work->hold(send);
    at::Tensor recv = nanoccl::output(*work, output, false);
    WorkNanoccl::start(
        work,
        {[&] { return comm.alltoall(ptr(send), sendCounts, ptr(recv), recvCounts, w.dtype); }});
    return work;
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNanoccl::alltoall(std::vector<at::Tensor>& outputs,
                                                             std::vector<at::Tensor>& inputs,
                                                             const c10d::AllToAllOptions& opts) {
  return run("alltoall", true, [&](Communicator& comm, const CommPtr& owner) {
    if (static_cast<int>(outputs.size()) != size_ || static_cast<int>(inputs.size()) != size_) {
      reject("alltoall: needs " + std::to_string(size_) + " input and output tensors, got " +
             std::to_string(inputs.size()) + " and " + std::to_string(outputs.size()));
    }
    for (const auto& t : inputs) {
      checkTensor(t, "alltoall");
      checkSameType(inputs[0], t, "alltoall");
    }
    for (const auto& t : outputs) {
      checkTensor(t, "alltoall");
      checkSameType(inputs[0], t, "alltoall");
    }
    const Wire w = moveType(inputs[0]);
    auto work = NANOCCL_WORK(c10d::OpType::ALLTOALL, "alltoall", outputs);
    std::vector<size_t> sendCounts, recvCounts;
    for (const auto& t : inputs) sendCounts.push_back(count(t, w));
    for (const auto& t : outputs) recvCounts.push_back(count(t, w));
    at::Tensor send = concatInput(*work, inputs);
    at::Tensor recv = gatherBuffer(*work, outputs, inputs[0].options());
    WorkNanoccl::start(
        work,
        {[&] { return comm.alltoall(ptr(send), sendCounts, ptr(recv), recvCounts, w.dtype); }});
    return work;
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNanoccl::send(std::vector<at::Tensor>& tensors,
                                                         int dstRank, int tag) {
  return run("send", false, [&](Communicator& comm, const CommPtr& owner) {
    checkOne(tensors, "send");
    if (dstRank == rank_) {
      reject("send: rank " + std::to_string(rank_) + " cannot send to itself (destination rank " +
             std::to_string(dstRank) + ")");
    }
    if (dstRank < 0 || dstRank >= size_) {
      reject("send: destination rank " + std::to_string(dstRank) + " is outside the group [0, " +
             std::to_string(size_) + ")");
    }
    const Wire w = moveType(tensors[0]);
    auto work =
        NANOCCL_WORK(c10d::OpType::SEND, "send to rank " + std::to_string(dstRank), tensors);
    at::Tensor buf = input(*work, tensors[0]);
    WorkNanoccl::start(work, {[&] {
                         return comm.send(ptr(buf), count(buf, w), w.dtype, dstRank,
                                          static_cast<uint32_t>(tag));
                       }});
    return work;
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNanoccl::recv(std::vector<at::Tensor>& tensors,
                                                         int srcRank, int tag) {
  return run("recv", false, [&](Communicator& comm, const CommPtr& owner) {
    checkOne(tensors, "recv");
    if (srcRank == rank_) {
      reject("recv: rank " + std::to_string(rank_) + " cannot receive from itself (source rank " +
             std::to_string(srcRank) + ")");
    }
    if (srcRank < 0 || srcRank >= size_) {
      reject("recv: source rank " + std::to_string(srcRank) + " is outside the group [0, " +
             std::to_string(size_) + ")");
    }
    const Wire w = moveType(tensors[0]);
    auto work =
        NANOCCL_WORK(c10d::OpType::RECV, "recv from rank " + std::to_string(srcRank), tensors);
    at::Tensor buf = output(*work, tensors[0], false);
    WorkNanoccl::start(work, {[&] {
                         return comm.recv(ptr(buf), count(buf, w), w.dtype, srcRank,
                                          static_cast<uint32_t>(tag));
                       }});
    return work;
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNanoccl::recvAnysource(std::vector<at::Tensor>& tensors,
                                                                  int tag) {
  return run("recvAnysource", false, [&](Communicator& comm, const CommPtr& owner) {
    checkOne(tensors, "recvAnysource");
    const Wire w = moveType(tensors[0]);
    auto work = NANOCCL_WORK(c10d::OpType::RECVANYSOURCE, "recv from any rank", tensors);
    at::Tensor buf = output(*work, tensors[0], false);
    WorkNanoccl::start(work, {[&] {
                         return comm.recv(ptr(buf), count(buf, w), w.dtype, kAnySource,
                                          static_cast<uint32_t>(tag));
                       }});
    return work;
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNanoccl::barrier(const c10d::BarrierOptions& opts) {
  return run("barrier", true, [&](Communicator& comm, const CommPtr& owner) {
    auto work = NANOCCL_WORK(c10d::OpType::BARRIER, "barrier", {});
    WorkNanoccl::start(work, {[&] { return comm.barrier(); }});
    return work;
  });
}

#undef NANOCCL_WORK

}  // namespace nanoccl
