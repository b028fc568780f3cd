// CudaGroup (cuda_staging.h): the executor thread, the plans, and the pinned-memory staging.
#include "backend/cuda_staging.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "common/completion.h"
#include "common/logging.h"
#include "common/reduce.h"
#include "common/thread_name.h"
#include "transports/nccl/nccl_comm.h"

namespace nanoccl {
namespace {

// The staging unit: large enough that a chunk's network allreduce dwarfs its fixed costs, small
// enough that the copies of the neighbouring chunks hide behind it. Two pinned buffers of it.
constexpr size_t kChunkBytes = size_t{4} << 20;
constexpr int kChunkBuffers = 2;
// How often the executor looks at finished calls' end events while it has nothing to run.
constexpr std::chrono::microseconds kWatchPoll{200};
// Teardown waits at most this long for the internal stream to leave the pinned buffers.
constexpr std::chrono::milliseconds kDrainLimit{10000};

Status cudaFailed(const std::string& what, cudaError_t e) {
  (void)cudaGetLastError();  // clear a non-sticky error so that later calls do not see it
  const std::string message = what + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e);
  if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ||
      e == cudaErrorInvalidDevice) {
    return unavailableError(message);
  }
  return internalError(message);
}

#define NANOCCL_CUDA(what, expr)                                        \
  do {                                                                  \
    const cudaError_t nanoccl_cuda_error_ = (expr);                     \
    if (nanoccl_cuda_error_ != cudaSuccess) {                           \
      return cudaFailed(what, nanoccl_cuda_error_);                     \
    }                                                                   \
  } while (0)

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

std::vector<size_t> splitEvenly(size_t count, int parts) {
  std::vector<size_t> out(static_cast<size_t>(parts), count / parts);
  for (size_t i = 0; i < count % parts; ++i) ++out[i];
  return out;
}

}  // namespace

// ---- CudaJob ----------------------------------------------------------------------------------

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

// ---- CudaGroup --------------------------------------------------------------------------------

using Phase = CudaJob::Impl::Phase;
using JobPtr = std::shared_ptr<CudaJob>;

struct CudaGroup::Impl {
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
  PinnedBuffer chunks[kChunkBuffers];
  PinnedBuffer bulk;
  cudaEvent_t ready[kChunkBuffers] = {};
  cudaEvent_t marker = nullptr;
  bool reported = false;  // the failure was logged

  // ---- executor --------------------------------------------------------------------------

  void loop() {
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

  Status failedStatus() const {
    std::lock_guard<std::mutex> lock(mu);
    return failed;
  }

  // The first error fails the group: NCCL aborted (its kernels return), the staging
  // communicators aborted, every queued and watched call failed.
  void failEverything(const Status& why) {
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
  void watch() {
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
  Status waitEvent(cudaEvent_t e, const Deadline& deadline, const char* what) {
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
  Status drain(const Deadline& deadline) {
    NANOCCL_CUDA("cudaEventRecord", cudaEventRecord(marker, stream));
    return waitEvent(marker, deadline, "the internal stream");
  }

  void teardown() {
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

  // ---- communicators (created by the executor, when a call first needs them) ---------------

  Result<NcclComm*> ensureNccl(const Deadline& deadline) {
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

  Result<std::shared_ptr<Communicator>> ensureWorld() {
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

  Result<std::shared_ptr<Communicator>> ensureCross() {
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

  // ---- plans ---------------------------------------------------------------------------------

  Status runJob(CudaJob& job) {
    CudaJob::Impl& j = job.impl();
    const CudaCall& c = j.call;
    NANOCCL_CUDA("cudaStreamWaitEvent", cudaStreamWaitEvent(stream, j.start, 0));
    const char* plan = m == 1 ? "cuda_nccl" : "cuda_staged";
    if (c.count > 0) {
      if (m == 1) {
        NANOCCL_CHECK(singleNode(c, j.deadline));
      } else if (c.op == OpType::kAllreduce) {
        NANOCCL_CHECK(hierarchicalAllreduce(c, j.deadline));
      } else if (c.op == OpType::kBroadcast) {
        NANOCCL_CHECK(stagedBroadcast(c, j.deadline));
      } else {
        NANOCCL_CHECK(stagedGather(c, j.deadline));
      }
    }
    if (c.epilogue) NANOCCL_CHECK(c.epilogue());
    NANOCCL_CUDA("cudaEventRecord", cudaEventRecord(j.end, stream));
    std::lock_guard<std::mutex> lock(mu);
    ++plans[std::string(opTypeName(c.op)) + "/" + plan];
    return Status::ok();
  }

  // All ranks on one node: one NCCL collective (NCCL rank = local rank = group rank).
  Status singleNode(const CudaCall& c, const Deadline& d) {
    NANOCCL_ASSIGN_OR_RETURN(NcclComm * nc, ensureNccl(d));
    const size_t es = dataTypeSize(c.dtype);
    const void* send = c.send != nullptr ? c.send : c.recv;
    switch (c.op) {
      case OpType::kAllreduce:
        return nc->allreduce(send, c.recv, c.count, c.dtype, c.redop, c.premulFactor, stream, d);
      case OpType::kBroadcast:  // data movement: as bytes, so that every dtype goes
        return nc->broadcast(send, c.recv, c.count * es, DataType::kUInt8, c.root, stream, d);
      case OpType::kAllgather:
        return nc->allgather(c.send, c.recv, c.count * es, DataType::kUInt8, stream, d);
      case OpType::kReduceScatter:
        return nc->reduceScatter(c.send, c.recv, c.count, c.dtype, c.redop, c.premulFactor,
                                 stream, d);
      default:
        return invalidArgument(std::string("no CUDA plan for ") + opTypeName(c.op));
    }
  }

  // Intra-node reduce into shards (NCCL), each shard staged across nodes by its local rank,
  // intra-node gather of the shards (NCCL).
  Status hierarchicalAllreduce(const CudaCall& c, const Deadline& d) {
    const size_t es = dataTypeSize(c.dtype);
    const size_t n = c.count;
    char* buf = static_cast<char*>(c.recv);
    if (c.send != nullptr && c.send != c.recv) {
      NANOCCL_CUDA("cudaMemcpyAsync", cudaMemcpyAsync(buf, c.send, n * es,
                                                      cudaMemcpyDeviceToDevice, stream));
    }
    // Where each rank's input first meets a reduction, PREMUL_SUM scales it: in NCCL if the
    // node has several ranks, else across nodes. AVG sums and divides once at the end.
    const bool intra = localSize > 1;
    const ReduceOp sumOrOp = c.redop == ReduceOp::kAvg ? ReduceOp::kSum : c.redop;
    ReduceOp crossOp = sumOrOp;
    if (c.redop == ReduceOp::kPremulSum && intra) crossOp = ReduceOp::kSum;
    const std::vector<size_t> shard = splitEvenly(n, shards);
    std::vector<size_t> at(shard.size(), 0);
    for (size_t s = 1; s < shard.size(); ++s) at[s] = at[s - 1] + shard[s - 1];
    // Equal shards, one per local rank: NCCL's in-place reduce-scatter and allgather.
    const bool even = shards == localSize && n % localSize == 0;
    NcclComm* nc = nullptr;
    if (intra) {
      NANOCCL_ASSIGN_OR_RETURN(nc, ensureNccl(d));
      if (even) {
        NANOCCL_CHECK(nc->reduceScatter(buf, buf + at[local] * es, shard[local], c.dtype, sumOrOp,
                                        c.premulFactor, stream, d));
      } else {
        NANOCCL_CHECK(nc->groupStart());
        for (int s = 0; s < shards; ++s) {
          if (shard[s] == 0) continue;
          char* p = buf + at[s] * es;
          const Status st = nc->reduce(p, p, shard[s], c.dtype, sumOrOp, c.premulFactor, s,
                                       stream, d);
          if (!st.isOk()) {
            (void)nc->groupEnd(d);
            return st;
          }
        }
        NANOCCL_CHECK(nc->groupEnd(d));
      }
    }
    if (local < shards && shard[local] > 0) {
      NANOCCL_ASSIGN_OR_RETURN(auto x, ensureCross());
      const double factor = crossOp == ReduceOp::kPremulSum ? c.premulFactor : 1.0;
      const bool divide = c.redop == ReduceOp::kAvg;
      NANOCCL_CHECK(stage(buf + at[local] * es, shard[local], es, true, true,
                          [&](void* host, size_t count) -> Status {
                            auto task = x->allreduce(host, count, c.dtype, crossOp, factor);
                            NANOCCL_CHECK(task->wait(d));
                            if (divide) {
                              NANOCCL_CHECK(divideInPlace(host, count, c.dtype, o.size));
                            }
                            return Status::ok();
                          },
                          d));
    }
    if (intra) {
      if (even) {
        NANOCCL_CHECK(nc->allgather(buf + at[local] * es, buf, shard[local], c.dtype, stream, d));
      } else {
        NANOCCL_CHECK(nc->groupStart());
        for (int s = 0; s < shards; ++s) {
          if (shard[s] == 0) continue;
          char* p = buf + at[s] * es;
          const Status st = nc->broadcast(p, p, shard[s], c.dtype, s, stream, d);
          if (!st.isOk()) {
            (void)nc->groupEnd(d);
            return st;
          }
        }
        NANOCCL_CHECK(nc->groupEnd(d));
      }
    }
    return Status::ok();
  }

  // The root's bytes to the host, the group's CPU broadcast, back to the device elsewhere.
  Status stagedBroadcast(const CudaCall& c, const Deadline& d) {
    NANOCCL_ASSIGN_OR_RETURN(auto w, ensureWorld());
    const bool root = o.rank == c.root;
    const size_t bytes = c.count * dataTypeSize(c.dtype);
    if (c.send != nullptr && c.send != c.recv && root) {
      NANOCCL_CUDA("cudaMemcpyAsync", cudaMemcpyAsync(c.recv, c.send, bytes,
                                                      cudaMemcpyDeviceToDevice, stream));
    }
    return stage(static_cast<char*>(c.recv), bytes, 1, root, !root,
                 [&](void* host, size_t count) -> Status {
                   return w->broadcast(host, count, DataType::kUInt8, c.root)->wait(d);
                 },
                 d);
  }

  // allgather / reduce_scatter: the whole input to the host, the group's CPU call, the result
  // back (not chunked: the CPU call needs every rank's part at once).
  Status stagedGather(const CudaCall& c, const Deadline& d) {
    NANOCCL_ASSIGN_OR_RETURN(auto w, ensureWorld());
    const size_t es = dataTypeSize(c.dtype);
    const size_t part = c.count * es;
    const size_t all = part * static_cast<size_t>(o.size);
    // The bulk buffer may be read by the previous call's copy back: wait before regrowing it.
    if (bulk.bytes() < all + part) {
      NANOCCL_CHECK(drain(d));
      NANOCCL_CHECK(bulk.ensure(all + part));
    }
    char* host = bulk.data();
    const bool gather = c.op == OpType::kAllgather;
    char* in = gather ? host + part * static_cast<size_t>(o.rank) : host;
    char* out = gather ? host : host + all;
    NANOCCL_CUDA("cudaMemcpyAsync", cudaMemcpyAsync(in, c.send, gather ? part : all,
                                                    cudaMemcpyDeviceToHost, stream));
    NANOCCL_CUDA("cudaEventRecord", cudaEventRecord(ready[0], stream));
    NANOCCL_CHECK(waitEvent(ready[0], d, "the copy to the host"));
    std::shared_ptr<Task> task;
    if (gather) {
      const std::vector<size_t> counts(static_cast<size_t>(o.size), part);
      task = w->allgather(in, part, out, counts, DataType::kUInt8);
    } else {
      const std::vector<size_t> counts(static_cast<size_t>(o.size), c.count);
      task = w->reduceScatter(in, out, counts, c.dtype, c.redop, c.premulFactor);
    }
    NANOCCL_CHECK(task->wait(d));
    NANOCCL_CUDA("cudaMemcpyAsync", cudaMemcpyAsync(c.recv, out, gather ? all : part,
                                                    cudaMemcpyHostToDevice, stream));
    return Status::ok();
  }

  // Moves `n` elements (`es` bytes each) at `dev` through the pinned chunk buffers: for each
  // chunk the copy to the host (download), `hostOp` on the host copy, the copy back (upload).
  // The copies run on the internal stream ahead of the host: while hostOp works on chunk c,
  // chunk c + 1 is already coming down and chunk c - 1 going up. A buffer is reused for chunk
  // c + 2 only after chunk c's copy back (stream order, and its ready event).
  Status stage(char* dev, size_t n, size_t es, bool download, bool upload,
               const std::function<Status(void*, size_t)>& hostOp, const Deadline& d) {
    if (n == 0) return Status::ok();
    for (auto& b : chunks) NANOCCL_CHECK(b.ensure(kChunkBytes));
    const size_t per = std::max<size_t>(1, kChunkBytes / es);
    const size_t count = (n + per - 1) / per;
    auto ahead = [&](size_t c) -> Status {
      const int b = static_cast<int>(c % kChunkBuffers);
      if (download) {
        const size_t first = c * per;
        NANOCCL_CUDA("cudaMemcpyAsync",
                     cudaMemcpyAsync(chunks[b].data(), dev + first * es,
                                     std::min(per, n - first) * es, cudaMemcpyDeviceToHost,
                                     stream));
      }
      NANOCCL_CUDA("cudaEventRecord", cudaEventRecord(ready[b], stream));
      return Status::ok();
    };
    for (size_t c = 0; c < std::min<size_t>(count, kChunkBuffers); ++c) NANOCCL_CHECK(ahead(c));
    for (size_t c = 0; c < count; ++c) {
      const int b = static_cast<int>(c % kChunkBuffers);
      const size_t first = c * per;
      const size_t len = std::min(per, n - first);
      NANOCCL_CHECK(waitEvent(ready[b], d, download ? "the copy to the host" : "the copy back"));
      NANOCCL_CHECK(hostOp(chunks[b].data(), len));
      if (upload) {
        NANOCCL_CUDA("cudaMemcpyAsync", cudaMemcpyAsync(dev + first * es, chunks[b].data(),
                                                        len * es, cudaMemcpyHostToDevice, stream));
      }
      if (c + kChunkBuffers < count) NANOCCL_CHECK(ahead(c + kChunkBuffers));
    }
    return Status::ok();
  }
};

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
