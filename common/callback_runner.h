// CallbackRunner: where user code that hangs off a finished call runs (a torch Future's `then`
// and `add_done_callback` callbacks), away from the threads that finish calls.
//
// Why: a callback may legally issue another collective and wait on it (PyTorch's PowerSGD hook
// does, inside the allreduce future's `then`). Run on the communicator's worker, that wait
// blocks the only thread that could run the new call: a deadlock no deadline can end, since the
// thread that would fail the call at its deadline is the one waiting. So the threads that run
// calls (the worker, a transport's progress thread, the CUDA side's executor) never run user
// code; they post() it here instead.
//
// Guarantee: every posted job starts without waiting for any other job to return. post() hands
// the job to an idle thread of the runner where one is free and starts a new thread where none
// is, so a job that blocks (on a collective whose own completion is posted after it) can never
// keep that completion from running. In steady use one thread serves every job; a nested wait
// adds one thread per level while it lasts. A thread left idle for kIdle exits.
//
// Threads are named "nanoccl-cb" and detached; the runner is process-wide and never destroyed
// (a job may drop the last reference to whatever posted it). A forked child starts with an
// empty runner (its parent's threads do not exist there). Thread-safe.
#pragma once

#include <chrono>
#include <functional>

namespace nanoccl {

class CallbackRunner {
 public:
  // How long an idle thread waits for a job before it exits.
  static constexpr std::chrono::milliseconds kIdle{2000};

  // The process's runner.
  static CallbackRunner& instance();

  // Runs `job` on one of the runner's threads, soon, whatever the other jobs are doing.
  // Exceptions a job throws are caught and logged (a callback's error belongs to its future).
  void post(std::function<void()> job);

  // Threads alive now, and the most alive at once so far (for tests).
  int threads() const;
  int peakThreads() const;

  CallbackRunner();
  ~CallbackRunner() = delete;  // never destroyed (see above)
  CallbackRunner(const CallbackRunner&) = delete;
  CallbackRunner& operator=(const CallbackRunner&) = delete;

 private:
  struct State;
  void threadLoop();
  State* state_;
  // In a forked child, the parent's runner that this one replaced: kept reachable (never freed,
  // as any runner).
  CallbackRunner* replaced_ = nullptr;
};

}  // namespace nanoccl
