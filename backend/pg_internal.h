// Internal to backend/: what ProcessGroupNanoccl's two source files share (process_group_nanoccl.cc
// for construction, lifecycle, stats and the reductions; process_group_calls.cc for the other
// calls): the Work type, and turning tensors into the core's buffers. Not installed; torch-only.
//
// Errors (backend/errors.h): the checks here throw CallError (reject(), rejectType()) before
// anything is queued; ProcessGroupNanoccl::run() raises it on the calling thread.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "backend/cuda_work.h"
#include "backend/errors.h"
#include "backend/process_group_nanoccl.h"
#include "backend/work_deadline.h"
#include "collectives/communicator.h"
#include "common/callback_runner.h"
#include "common/dtype.h"
#include "common/status.h"

namespace nanoccl::pg {

using TorchOp = c10d::OpType;

using TaskPtr = std::shared_ptr<Task>;

using CommPtr = std::shared_ptr<Communicator>;

using WorkPtr = c10::intrusive_ptr<c10d::Work>;

// Queues one call on the communicator; built once all checks passed.
using Queue = std::function<TaskPtr()>;

// One torch call: the Tasks it queued, the tensors they use, and what to do once they are all
// done (copy results back into non-contiguous or scattered outputs). Completion path: a
// transport's Request -> the Task that ran the call -> this Work's one Completion (the Task's
// own where the call queued one, Completion::all over its Tasks otherwise) -> the Work's state
// and its future, set together in complete().
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
            c10::ListType::ofTensors())) {}

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
    for (size_t i = 0; i < queue.size(); ++i) {
      if (i + 1 < queue.size()) {
        tasks.push_back(queue[i]());
        continue;
      }
      // The last call's end completes the Work and its future: where the future was handed
      // out, its callbacks get a scope of their own (CallScope), asked for before the call can
      // run.
      ScopeRequest request([weak = c10::weak_intrusive_ptr<WorkNanoccl>(work)] {
        c10::intrusive_ptr<WorkNanoccl> w = weak.lock();
        return w && w->decideScope();
      });
      tasks.push_back(queue[i]());
    }
    if (tasks.empty()) {
      work->complete(Status::ok());
      return;
    }
    std::shared_ptr<Completion> done;
    if (tasks.size() == 1) {
      done = std::shared_ptr<Completion>(tasks[0], &tasks[0]->completion());
    } else {
      std::vector<Completion*> parts;
      for (const TaskPtr& t : tasks) parts.push_back(&t->completion());
      done = Completion::all(parts);
    }
    {
      std::lock_guard<std::mutex> lock(work->tasksMu_);
      work->tasks_ = std::move(tasks);
    }
    // Runs on the thread that ran the last Task, or here if they are all done already.
    done->onComplete([work](const Status& s, int source) { work->tasksDone(s, source); });
  }

  // Deadlines count from the issue (backend/work_deadline.h).
  bool wait(std::chrono::milliseconds timeout) override {
    const Deadline until = workWaitDeadline(issued_, timeout_, timeout);
    runHere(until);
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (!waitUntil(cv_, lock, until, [&] { return completed_; })) {
        raise(ErrorKind::kBackend, "nanoccl rank " + std::to_string(rank_) + ": " + what_ + " " +
                                       waitFailure(issued_, timeout));
      }
    }
    // Set right after the Work is finished (complete()), before any callback runs.
    future_->wait();
    std::lock_guard<std::mutex> lock(mutex_);
    if (exception_) std::rethrow_exception(exception_);
    return true;
  }

  bool isCompleted() override {
    if (c10d::Work::isCompleted() && future_->completed()) return true;
    handOver();  // a caller that polls will not run the call itself (Task::runHere)
    return false;
  }

  void synchronize() override {}
  int sourceRank() const override { return source_.load(); }
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    {
      std::unique_lock<std::mutex> lock(futureMu_);
      futureOut_ = true;  // it may carry callbacks from now on
      // The call ended just before, without a scope for its callbacks: complete() is about to
      // complete the future on its own thread with none. Wait for it, so that callbacks added
      // now run here, at this thread's place in the call order.
      futureCv_.wait(lock, [&] { return !decided_ || hold_ || settled_; });
    }
    handOver();  // a caller that waits on the future will not run the call itself
    return future_;
  }

  void abort() override {
    if (auto comm = comm_.lock()) {
      comm->abort(abortedError("rank " + std::to_string(rank_) + " aborted " + what_));
    }
  }

 private:
  void handOver() {
    if (c10d::Work::isCompleted()) return;
    if (auto comm = comm_.lock()) comm->handOver();
  }

  // A blocking call's tasks run on the waiting thread where they are next and their deadline
  // is not past the wait's (Task::runHere).
  void runHere(const Deadline& until) {
    std::vector<TaskPtr> tasks;
    {
      std::lock_guard<std::mutex> lock(tasksMu_);
      tasks = tasks_;
    }
    for (const TaskPtr& t : tasks) t->runHere(until);
  }

  // Asked by the thread that ran the last call, before any later call can start (ScopeRequest):
  // whether the future's callbacks need a scope, that is, whether it was handed out.
  bool decideScope() {
    std::lock_guard<std::mutex> lock(futureMu_);
    decided_ = true;
    hold_ = futureOut_;
    return hold_;
  }

  // Every Task is done: `s` is the first failure among them, else OK.
  void tasksDone(const Status& s, int source) {
    if (source >= 0) source_.store(source);
    {
      std::lock_guard<std::mutex> lock(tasksMu_);
      for (const TaskPtr& t : tasks_) {
        // The last call's scope (ScopeRequest in start()), set before its Task completed.
        if (t->scope()) {
          std::lock_guard<std::mutex> futureLock(futureMu_);
          scope_ = t->scope();
        }
        if (t->buffersStillInUse()) keepers_.push_back(t.get());
      }
    }
    complete(s);
  }

  // `keepers_`: the Tasks whose buffers aborted transports may still target (tasksDone()).
  void complete(const Status& s) {
    std::exception_ptr error;
    if (s.isOk()) {
      try {
        for (auto& fn : finishers_) fn();
      } catch (const std::exception& e) {
        error = errorOf(ErrorKind::kBackend, "nanoccl rank " + std::to_string(rank_) + ": " +
                                                 what_ + ": copying the result out failed: " +
                                                 e.what());
      }
    } else {
      error = errorOf(s, "nanoccl rank " + std::to_string(rank_) + ": " + what_ + " failed: ");
    }
    finishers_.clear();
    std::vector<Task*> keepers;
    keepers.swap(keepers_);
    if (!keepers.empty()) {
      // A transfer the aborted transports could not end may still target these tensors: the
      // communicator keeps them until its transports are gone (Task::buffersStillInUse()).
      auto keep = std::make_shared<std::vector<at::Tensor>>(std::move(held_));
      keep->insert(keep->end(), outputs_.begin(), outputs_.end());
      for (Task* t : keepers) t->keepBuffers(keep);
    }
    held_.clear();
    {
      std::lock_guard<std::mutex> lock(tasksMu_);
      tasks_.clear();  // a Task's callbacks hold this Work: no cycle left behind
    }
    // The Work first, then the future: wait() and isCompleted() also cover the future, so no
    // one sees one done and not the other. A future nobody has been handed yet has no
    // callbacks and completes here; one handed out may carry callbacks, user code that may
    // issue and wait on another call of this communicator, which this thread (the worker, or a
    // caller running a call) may be the one to run: it completes on the callback runner
    // (common/callback_runner.h), where no wait can block a call.
    finish(error);
    std::shared_ptr<CallScope> scope;
    {
      // Under the lock: a getFuture() racing with this returns the completed future.
      std::lock_guard<std::mutex> lock(futureMu_);
      scope = std::move(scope_);
      if (!futureOut_ || (decided_ && !hold_)) {
        completeFuture(future_, error, outputs_);  // no callback yet: nobody had it
        settled_ = true;
        futureCv_.notify_all();
        return;
      }
    }
    // The scope (null where the call failed) is closed once the callbacks have returned; the
    // calls they issued run first (CallScope).
    CallbackRunner::instance().post([future = future_, error, outputs = outputs_, scope] {
      {
        CallScope::Enter inside(scope);
        completeFuture(future, error, outputs);
      }
      if (scope) scope->close();
    });
  }

  static void completeFuture(const c10::intrusive_ptr<c10::ivalue::Future>& future,
                             const std::exception_ptr& error,
                             const std::vector<at::Tensor>& outputs) {
    if (error) {
      future->setError(error);
    } else {
      future->markCompleted(c10::IValue(outputs));
    }
  }

  const std::string what_;
  const std::vector<at::Tensor> outputs_;
  const std::chrono::milliseconds timeout_;
  const Clock::time_point issued_ = Clock::now();
  const std::weak_ptr<Communicator> comm_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  // Where the future completes, and its callbacks run (complete()). Under futureMu_:
  std::mutex futureMu_;
  std::condition_variable futureCv_;  // settled_
  bool futureOut_ = false;  // getFuture() was called
  bool decided_ = false;    // decideScope() was asked
  bool hold_ = false;       // and answered yes
  bool settled_ = false;    // complete() completed the future on its own thread
  std::shared_ptr<CallScope> scope_;  // the last call's, until complete() takes it
  std::vector<at::Tensor> held_;
  std::vector<std::function<void()>> finishers_;
  std::atomic<int> source_{-1};
  std::vector<Task*> keepers_;  // Tasks that said buffersStillInUse(); alive in tasks_
  std::mutex tasksMu_;
  std::vector<TaskPtr> tasks_;  // for runHere(); cleared once they are all done
};

// ---- tensors -> buffers --------------------------------------------------------------------

// Rejects the call being checked (throws CallError): a ValueError, or a TypeError where an
// argument's type is wrong (rejectType).
[[noreturn]] void reject(const std::string& message);
[[noreturn]] void rejectType(const std::string& message);

// A dense CPU tensor (CUDA tensors only where the call takes them: see onCuda()).
void checkTensor(const at::Tensor& t, const char* what);

// The core's type of a torch dtype, if nanoccl reduces it.
std::optional<DataType> mapType(at::ScalarType t);

// How a tensor's elements travel: its own type, or bytes for a type nanoccl does not reduce
// (float8, uint16...), which is fine for calls that only move data.
struct Wire {
  DataType dtype;
  size_t perElement;  // wire elements per tensor element
};

// How `t` travels in calls that only move data.
Wire moveType(const at::Tensor& t);

// `t`'s type for a reduction; rejects the types nanoccl does not reduce.
DataType reduceType(const at::Tensor& t, const char* what);

struct Reduction {
  ReduceOp op;
  double factor = 1.0;
};

// The core's reduction of a torch ReduceOp (PREMUL_SUM with its factor); rejects what the
// dtype cannot do.
Reduction mapReduction(const c10d::ReduceOp& rop, DataType dtype, const char* what);

// The tensor's data (null when empty), and its element count on the wire.
void* ptr(const at::Tensor& t);

size_t count(const at::Tensor& t, const Wire& w);

// The contiguous tensor a call reads.
at::Tensor input(WorkNanoccl& work, const at::Tensor& t);

// The contiguous tensor a call writes into `t` through. If `t` is not contiguous the result is
// copied back at success; `keep` says whether the call also reads what `t` holds (in place).
at::Tensor output(WorkNanoccl& work, const at::Tensor& t, bool keep);

// A scratch buffer whose pieces land in `outs` (in order, back to back) at success.
at::Tensor gatherBuffer(WorkNanoccl& work, const std::vector<at::Tensor>& outs,
                        const at::TensorOptions& options);

// The tensors of `ins` back to back in one contiguous buffer.
at::Tensor concatInput(WorkNanoccl& work, const std::vector<at::Tensor>& ins);

// Rejects tensors of one call that differ in dtype, or a list that is not one tensor.
void checkSameType(const at::Tensor& a, const at::Tensor& b, const char* what);

void checkOne(const std::vector<at::Tensor>& ts, const char* what);

// The node of this rank as torch knows it: torchrun's node rank. Empty (the core then uses the
// host and network namespace) outside torchrun; NANOCCL_NODE_ID overrides both in the core.
std::string torchNodeId();

// "rank 1 (of 4)", in the prefix of this backend's error messages.
std::string rankLabel(int rank, int size);

// A Work for one call (NANOCCL_WORK below fills in the group's part).
c10::intrusive_ptr<WorkNanoccl> newWork(int rank, TorchOp type, std::string what,
                                        std::vector<at::Tensor> outputs,
                                        std::chrono::milliseconds timeout, const CommPtr& comm);

// A root inside the group, or the call is rejected.
int checkRoot(int64_t root, int size, const char* what);

// Whether the call goes to the CUDA path (ProcessGroupNanoccl::cuda()).
bool onCuda(const at::Tensor& t);

// The Work of a CUDA call; a call its CUDA side rejects is rejected like any other.
c10::intrusive_ptr<c10d::Work> cudaWork(CudaCollectives::WorkResult r, int rank, int size);

// Queues one allgather of `in` into `outs` (one tensor per rank, sizes may differ).
Queue allgatherInto(Communicator& comm, WorkNanoccl& work, const at::Tensor& in,
                    const std::vector<at::Tensor>& outs, int rank, int size, const char* what);

// Queues one allgather of `in` into the flat `out` (size x in.numel() elements).
Queue allgatherFlat(Communicator& comm, WorkNanoccl& work, const at::Tensor& out,
                    const at::Tensor& in, int size, const char* what);

// Queues one reduce-scatter of the flat `in` (size x out.numel() elements) into `out`;
// with `compression`, Communicator::reduceScatterCompressed.
Queue reduceScatterFlat(Communicator& comm, WorkNanoccl& work, const at::Tensor& out,
                        const at::Tensor& in, const c10d::ReduceOp& rop, int size,
                        const char* what, const CompressionRequest* compression = nullptr);

// Inside run()'s lambdas: `comm` stays alive for the call (run() holds `owner`); the Tasks do
// not need it afterwards.
#define NANOCCL_WORK(type, what, outputs) \
  ::nanoccl::pg::newWork(rank_, type, what, outputs, options_->timeout, owner)

}  // namespace nanoccl::pg

namespace nanoccl {

// Every call goes through here (both source files): fn checks the tensors and queues the
// communicator's Tasks; a rejected call (CallError) fails on this rank at once. A rejected
// collective leaves a refused call in its place (Communicator::refusedCall): ranks that all
// refused it stay in step and the group stays usable; a peer that made the call meets a
// mismatch now rather than waiting for the timeout. CUDA calls are calls of the same
// communicator, so this holds for them too (a rejected call queued nothing on the device).
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
  } catch (const pg::CallError& e) {
    const std::string message = "nanoccl " + pg::rankLabel(rank_, size_) + ": " + e.message;
    if (collective) {
      // The peers have queued (or will queue) their side of this call, or refused it too.
      comm->refusedCall();
    }
    pg::raise(e.kind, message);
  }
}

}  // namespace nanoccl
