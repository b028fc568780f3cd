// CudaGroup (cuda_staging.h): CudaJob, the executor thread, the communicators and the public
// calls. The plans and the pinned-memory staging are in cuda_staging_plans.cc; CudaGroup::Impl
// is declared in cuda_staging_impl.h.
#include "backend/cuda_staging.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "backend/cuda_staging_impl.h"
#include "common/completion.h"
#include "common/logging.h"
#include "common/reduce.h"
#include "common/thread_name.h"
#include "transports/nccl/nccl_comm.h"

namespace nanoccl {

using cuda_staging::cudaFailed;

namespace {

// How often the executor looks at finished calls' end events while it has nothing to run.
constexpr std::chrono::microseconds kWatchPoll{200};
// Teardown waits at most this long for the internal stream to leave the pinned buffers.
constexpr std::chrono::milliseconds kDrainLimit{10000};

// Event polls start fast (a copy of a chunk takes a fraction of a millisecond) and settle at a
// rate that costs no core.
class Backoff {
 public:
  void pause() {
    std::this_thread::sleep_for(std::chrono::microseconds(us_));
    us_ = std::min(us_ * 2, 200);
  }

 private:
  int us_ = 2;
};

}  // namespace

// ---- CudaJob ----------------------------------------------------------------------------------

CudaJob::CudaJob(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaJob::~CudaJob() = default;

Status CudaJob::waitEnqueued(const Deadline& deadline) const {
  if (!impl_->enqueued.wait(deadline)) {
    return timeoutError("the call's host stages were not over before the caller's deadline");
  }
  return impl_->status();  // a failure since then included
}

Status CudaJob::blockStream(void* stream) const {
  if (Status s = impl_->status(); !s.isOk()) return s;
  if (!impl_->enqueued.done()) return internalError("blockStream() before the call was enqueued");
  NANOCCL_CUDA("cudaStreamWaitEvent",
               cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), impl_->end, 0));
  return Status::ok();
}

bool CudaJob::finished() const { return impl_->finished.done(); }

Status CudaJob::status() const { return impl_->status(); }

void CudaJob::onEnqueued(std::function<void(const Status&)> cb) {
  impl_->enqueued.onComplete([cb = std::move(cb)](const Status& s, int) { cb(s); });
}

void CudaJob::onFinished(std::function<void(const Status&)> cb) {
  impl_->finished.onComplete([cb = std::move(cb)](const Status& s, int) { cb(s); });
}

// ---- CudaGroup::Impl: the executor ------------------------------------------------------------

void CudaGroup::Impl::loop() {
  Status started = [&]() -> Status {
    NANOCCL_CUDA("cudaSetDevice", cudaSetDevice(o.device));
    for (auto& e : ready) {
      NANOCCL_CUDA("cudaEventCreate", cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
    NANOCCL_CUDA("cudaEventCreate", cudaEventCreateWithFlags(&marker, cudaEventDisableTiming));
    return Status::ok();
  }();
  if (!started.isOk()) failEverything(started);
  for (;;) {
    JobPtr job;
    bool react = false;
    {
      std::unique_lock<std::mutex> lock(mu);
      auto wake = [&] { return !queue.empty() || stopping || aborting.load(); };
      if (watching.empty()) {
        cv.wait(lock, wake);
      } else {
        cv.wait_for(lock, kWatchPoll, wake);
      }
      react = aborting.exchange(false);
      if (!react && failed.isOk() && !queue.empty()) {
        job = std::move(queue.front());
        queue.pop_front();
      }
    }
    if (react) failEverything(failedStatus());
    if (job) {
      const Status s = runJob(*job);
      if (s.isOk()) {
        job->impl().advance(Phase::kEnqueued, Status::ok());
        watching.push_back(std::move(job));
      } else {
        const Status error =
            s.withContext(std::string("CUDA ") + opTypeName(job->impl().call.op) + ": ");
        failEverything(error);
        job->impl().advance(Phase::kFailed, error);
      }
    }
    watch();
    std::lock_guard<std::mutex> lock(mu);
    if (stopping && watching.empty() && (queue.empty() || !failed.isOk())) break;
  }
  teardown();
  std::lock_guard<std::mutex> lock(mu);
  exited = true;
  exitedCv.notify_all();
}

Status CudaGroup::Impl::failedStatus() const {
  std::lock_guard<std::mutex> lock(mu);
  return failed;
}

// The first error fails the group: NCCL aborted (its kernels return), the staging
// communicators aborted, every queued and watched call failed.
void CudaGroup::Impl::failEverything(const Status& why) {
  std::deque<JobPtr> queued;
  std::shared_ptr<Communicator> w, c;
  Status first;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (failed.isOk()) failed = why;
    first = failed;
    queued.swap(queue);
    w = world;
    c = cross;
  }
  if (nccl) nccl->abort(first);
  if (w) w->abort(first);
  if (c) c->abort(first);
  if (!reported) {
    NANOCCL_WARN("rank " << o.rank << ": CUDA collectives failed: " << first.toString());
    reported = true;
  }
  for (auto& job : watching) job->impl().advance(Phase::kFailed, first);
  for (auto& job : queued) job->impl().advance(Phase::kFailed, first);
  watching.clear();
}

// Retires the watched calls the GPU has finished (they finish in order: one stream); fails
// the group if the oldest one is past its deadline or NCCL reports an error.
void CudaGroup::Impl::watch() {
  while (!watching.empty()) {
    CudaJob::Impl& j = watching.front()->impl();
    const cudaError_t q = cudaEventQuery(j.end);
    if (q == cudaSuccess) {
      watching.front()->impl().advance(Phase::kDone, Status::ok());
      watching.erase(watching.begin());
      continue;
    }
    Status problem;
    if (q != cudaErrorNotReady) {
      problem = cudaFailed("cudaEventQuery", q);
    } else if (nccl) {
      problem = nccl->check();
    }
    if (problem.isOk() && j.deadline.expired()) {
      problem = timeoutError(std::string(opTypeName(j.call.op)) +
                             " did not complete on the GPU within the timeout (" +
                             std::to_string(o.timeout.count()) +
                             " ms): a peer died or stopped calling? NCCL communicator aborted");
    }
    if (!problem.isOk()) failEverything(problem);
    return;
  }
}

// Polls `e` until the device reached it, within `deadline`; gives up early when the group
// fails (abort() from another thread) or NCCL reports an error.
Status CudaGroup::Impl::waitEvent(cudaEvent_t e, const Deadline& deadline, const char* what) {
  Backoff backoff;
  for (;;) {
    const cudaError_t q = cudaEventQuery(e);
    if (q == cudaSuccess) return Status::ok();
    if (q != cudaErrorNotReady) return cudaFailed(std::string("waiting for ") + what, q);
    if (aborting.load()) return failedStatus();
    if (nccl) NANOCCL_CHECK(nccl->check());
    if (deadline.expired()) {
      return timeoutError(std::string(what) + " did not complete on the GPU before the deadline");
    }
    backoff.pause();
  }
}

// Waits until the internal stream has run everything queued on it so far.
Status CudaGroup::Impl::drain(const Deadline& deadline) {
  NANOCCL_CUDA("cudaEventRecord", cudaEventRecord(marker, stream));
  return waitEvent(marker, deadline, "the internal stream");
}

void CudaGroup::Impl::teardown() {
  std::shared_ptr<Communicator> w, c;
  Status why;
  {
    std::lock_guard<std::mutex> lock(mu);
    w = std::move(world);
    c = std::move(cross);
    why = failed;
  }
  if (nccl) {
    if (why.isOk()) {
      const Status s = nccl->close(Deadline::after(o.timeout));
      if (!s.isOk()) NANOCCL_WARN("rank " << o.rank << ": closing NCCL: " << s.toString());
    } else {
      nccl->abort(why);
    }
    nccl.reset();
  }
  // The communicators' destructors fail what is pending and join their threads: nothing
  // touches the pinned buffers from the host after this.
  w.reset();
  c.reset();
  const bool drained = marker != nullptr && drain(Deadline::after(kDrainLimit)).isOk();
  for (auto& b : chunks) drained ? b.release() : b.leak();
  drained ? bulk.release() : bulk.leak();
  if (!drained) {
    NANOCCL_WARN("rank " << o.rank << ": the CUDA stream did not drain; its pinned staging "
                            "memory is left allocated");
  }
  for (auto& e : ready) {
    if (e != nullptr) (void)cudaEventDestroy(e);
  }
  if (marker != nullptr) (void)cudaEventDestroy(marker);
}

// ---- CudaGroup::Impl: communicators (created by the executor, when a call first needs them) ---

Result<NcclComm*> CudaGroup::Impl::ensureNccl(const Deadline& deadline) {
  if (nccl) return nccl.get();
  const std::string key = "nanoccl/" + o.commId + ".cuda/nccl/node" + std::to_string(node);
  std::string id;
  if (local == 0) {
    NANOCCL_ASSIGN_OR_RETURN(id, NcclComm::newUniqueId());
    NANOCCL_CHECK(o.store->set(key, id));
  } else {
    NANOCCL_ASSIGN_OR_RETURN(id, o.store->get(key, deadline));
  }
  NANOCCL_ASSIGN_OR_RETURN(nccl, NcclComm::create(id, local, localSize, o.device, deadline));
  NANOCCL_INFO("rank " << o.rank << ": NCCL communicator of node " << node << " ("
                       << localSize << " ranks) on cuda:" << o.device);
  return nccl.get();
}

Result<std::shared_ptr<Communicator>> CudaGroup::Impl::ensureWorld() {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (world) return world;
  }
  CommunicatorOptions co;
  co.rank = o.rank;
  co.size = o.size;
  co.store = o.store;
  co.commId = o.commId + ".cuda";
  co.config = o.config;
  co.timeout = o.timeout;
  co.nodeId = o.topology.nodeIds[o.rank];
  NANOCCL_ASSIGN_OR_RETURN(auto c, Communicator::create(co));
  std::lock_guard<std::mutex> lock(mu);
  world = c;
  return c;
}

Result<std::shared_ptr<Communicator>> CudaGroup::Impl::ensureCross() {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (cross) return cross;
  }
  std::shared_ptr<Communicator> c;
  if (o.topology.maxLocalSize() == 1) {
    // One rank per node: the cross group is the whole group (node k's rank is rank k).
    NANOCCL_ASSIGN_OR_RETURN(c, ensureWorld());
  } else {
    CommunicatorOptions co;
    co.rank = node;
    co.size = m;
    co.store = o.store;
    co.commId = o.commId + ".cuda.cross" + std::to_string(local);
    co.config = o.config;
    co.timeout = o.timeout;
    co.nodeId = o.topology.nodeIds[o.rank];
    NANOCCL_ASSIGN_OR_RETURN(c, Communicator::create(co));
  }
  std::lock_guard<std::mutex> lock(mu);
  cross = c;
  return c;
}

// ---- CudaGroup --------------------------------------------------------------------------------

bool CudaGroup::built() { return true; }

bool CudaGroup::supports(DataType dtype, ReduceOp op) {
  if (op == ReduceOp::kNumOps) return true;
  return NcclComm::supports(dtype, op) && reduceOpSupported(op, dtype);
}

CudaGroup::CudaGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::shared_ptr<CudaGroup>> CudaGroup::create(const CudaGroupOptions& options) {
  const Topology& t = options.topology;
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size ||
      t.size() != options.size) {
    return invalidArgument("CUDA group: rank " + std::to_string(options.rank) + " of " +
                           std::to_string(options.size) + " with a topology of " +
                           std::to_string(t.size()) + " ranks");
  }
  if (!options.store) return invalidArgument("CUDA group: no store");
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess) return cudaFailed("cudaGetDeviceCount", e);
  if (options.device < 0 || options.device >= devices) {
    return invalidArgument("CUDA group: device cuda:" + std::to_string(options.device) +
                           " of " + std::to_string(devices));
  }
  auto impl = std::make_unique<Impl>();
  impl->o = options;
  impl->stream = static_cast<cudaStream_t>(options.stream);
  impl->m = t.numNodes();
  impl->node = t.nodeOf[options.rank];
  impl->local = t.localRankOf[options.rank];
  impl->localSize = t.localSize(impl->node);
  impl->shards = t.minLocalSize();
  Impl* raw = impl.get();
  std::shared_ptr<CudaGroup> group(new CudaGroup(std::move(impl)));
  raw->executor = namedThread("cuda", [raw] { raw->loop(); });
  return group;
}

CudaGroup::~CudaGroup() {
  if (impl_->executor.joinable()) {
    abort(abortedError("the CUDA group was destroyed with calls pending"));
    {
      std::lock_guard<std::mutex> lock(impl_->mu);
      impl_->stopping = true;
      impl_->cv.notify_all();
    }
    impl_->executor.join();
  }
}

int CudaGroup::device() const { return impl_->o.device; }

Result<std::shared_ptr<CudaJob>> CudaGroup::submit(const CudaCall& call, void* callerStream) {
  const std::string what = std::string("CUDA ") + opTypeName(call.op);
  const bool reduces = call.op == OpType::kAllreduce || call.op == OpType::kReduceScatter;
  switch (call.op) {
    case OpType::kAllreduce:
    case OpType::kBroadcast:
    case OpType::kAllgather:
    case OpType::kReduceScatter:
      break;
    default:
      return invalidArgument(what + ": not a CUDA collective");
  }
  if (reduces && !supports(call.dtype, call.redop)) {
    return invalidArgument(what + ": " + reduceOpName(call.redop) + " on " +
                           dataTypeName(call.dtype) + " is not supported on CUDA tensors");
  }
  if (call.op == OpType::kBroadcast && (call.root < 0 || call.root >= impl_->o.size)) {
    return invalidArgument(what + ": root " + std::to_string(call.root) + " outside the group");
  }
  const bool needsSend = call.op == OpType::kAllgather || call.op == OpType::kReduceScatter;
  if (call.count > 0 && (call.recv == nullptr || (needsSend && call.send == nullptr))) {
    return invalidArgument(what + ": null buffer");
  }
  auto j = std::make_unique<CudaJob::Impl>();
  j->call = call;
  j->deadline = Deadline::after(impl_->o.timeout);
  {
    // The events belong to the group's device; the caller's current device is left as it was.
    int previous = 0;
    NANOCCL_CUDA("cudaGetDevice", cudaGetDevice(&previous));
    const Status s = [&]() -> Status {
      NANOCCL_CUDA("cudaSetDevice", cudaSetDevice(impl_->o.device));
      NANOCCL_CUDA("cudaEventCreate", cudaEventCreateWithFlags(&j->start, cudaEventDisableTiming));
      NANOCCL_CUDA("cudaEventCreate", cudaEventCreateWithFlags(&j->end, cudaEventDisableTiming));
      NANOCCL_CUDA("cudaEventRecord on the caller's stream",
                   cudaEventRecord(j->start, static_cast<cudaStream_t>(callerStream)));
      return Status::ok();
    }();
    (void)cudaSetDevice(previous);
    if (!s.isOk()) return s.withContext(what + ": ");
  }
  auto job = std::make_shared<CudaJob>(std::move(j));
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (!impl_->failed.isOk()) return impl_->failed;
  if (impl_->stopping) return abortedError(what + " after the CUDA group was shut down");
  impl_->queue.push_back(job);
  impl_->cv.notify_all();
  return job;
}

void CudaGroup::abort(const Status& why) {
  std::shared_ptr<Communicator> w, c;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (!impl_->failed.isOk()) return;
    impl_->failed = why;
    impl_->aborting.store(true);
    w = impl_->world;
    c = impl_->cross;
    impl_->cv.notify_all();
  }
  // A host stage waiting on one of these fails at once; the executor aborts NCCL itself.
  if (w) w->abort(why);
  if (c) c->abort(why);
}

void CudaGroup::shutdown(const Deadline& deadline) {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopping = true;
    impl_->cv.notify_all();
  }
  if (!impl_->executor.joinable()) return;
  {
    std::unique_lock<std::mutex> lock(impl_->mu);
    while (!impl_->exited && !deadline.expired()) {
      impl_->exitedCv.wait_for(lock, std::chrono::milliseconds(deadline.remainingMs(100)));
    }
  }
  bool exited = false;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    exited = impl_->exited;
  }
  // Past the deadline: fail what is left, which ends the executor's waits at once.
  if (!exited) abort(timeoutError("the CUDA calls did not finish before the shutdown deadline"));
  impl_->executor.join();
}

CommStats CudaGroup::stats() const {
  CommStats out;
  std::shared_ptr<Communicator> w, c;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    w = impl_->world;
    c = impl_->cross;
    for (const auto& [plan, calls] : impl_->plans) out.callsPerAlgorithm.emplace_back(plan, calls);
  }
  out.perPeer.resize(static_cast<size_t>(impl_->o.size));
  auto add = [&](const CommStats& s, const std::function<int(int)>& groupRank) {
    for (size_t r = 0; r < s.perPeer.size(); ++r) {
      PeerCounters& p = out.perPeer[static_cast<size_t>(groupRank(static_cast<int>(r)))];
      p.bytesSent += s.perPeer[r].bytesSent;
      p.bytesReceived += s.perPeer[r].bytesReceived;
      p.messagesSent += s.perPeer[r].messagesSent;
      p.messagesReceived += s.perPeer[r].messagesReceived;
    }
    auto sum = [](std::vector<uint64_t>& into, const std::vector<uint64_t>& from) {
      if (into.size() < from.size()) into.resize(from.size());
      for (size_t i = 0; i < from.size(); ++i) into[i] += from[i];
    };
    sum(out.bytesSentPerOp, s.bytesSentPerOp);
    sum(out.bytesReceivedPerOp, s.bytesReceivedPerOp);
    out.intraNodeBytesSent += s.intraNodeBytesSent;
    out.intraNodeBytesReceived += s.intraNodeBytesReceived;
    out.interNodeBytesSent += s.interNodeBytesSent;
    out.interNodeBytesReceived += s.interNodeBytesReceived;
  };
  if (w) add(w->stats(), [](int r) { return r; });
  if (c && c != w) {
    const Topology& t = impl_->o.topology;
    const int local = impl_->local;
    add(c->stats(), [&](int k) { return t.nodeRanks[static_cast<size_t>(k)][local]; });
  }
  return out;
}

}  // namespace nanoccl
