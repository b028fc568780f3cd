// Completion: the one "done once, waited on, called back" object that nanoccl's asynchronous
// things are built on: a transport's Request (transports/request.h), a communicator's Task
// (collectives/communicator.h) and a CUDA Work's queueing (backend/cuda_work.cc). The
// torch Work inherits c10d::Work's own state and waits on it with the same waitUntil().
//
// - complete(status, source) is called exactly once by whoever finishes the thing; later calls
//   are ignored (the first wins), so a late completion after an abort does no harm.
// - wait(deadline, spin) polls for up to `spin` first (common/spin.h: SpinPolicy), then
//   sleeps until completion or the deadline; Deadline::never() waits without a timeout.
// - onComplete(cb) runs cb(status, source) once: on the completing thread, outside the lock,
//   or at once on the calling thread where it is already complete. Callbacks must not block.
// - all(parts) completes once every part has (a torch Work over its Tasks).
// Thread-safe; done() never blocks.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "common/deadline.h"
#include "common/spin.h"
#include "common/status.h"

namespace nanoccl {

class Completion {
 public:
  using Callback = std::function<void(const Status&, int source)>;

  bool done() const { return done_.load(std::memory_order_acquire); }

  // Whether it completed before the deadline. Polls for up to `spin` before it sleeps, or not
  // at all where this thread's recent waits took longer (SpinPolicy; a wait that finds it
  // done at once is not counted).
  bool wait(const Deadline& deadline, std::chrono::microseconds spin = {}) const {
    if (done()) return true;
    const Clock::time_point start = Clock::now();
    if (spinFor(SpinPolicy::budget(spin), [&] { return done(); })) {
      SpinPolicy::record(spin, Clock::now() - start);
      return true;
    }
    std::unique_lock<std::mutex> lock(mu_);
    const bool ok =
        waitUntil(cv_, lock, deadline, [&] { return done_.load(std::memory_order_relaxed); });
    SpinPolicy::record(spin, Clock::now() - start);
    return ok;
  }

  // The final status and source; meaningful once done().
  Status status() const {
    std::lock_guard<std::mutex> lock(mu_);
    return status_;
  }
  int source() const {
    std::lock_guard<std::mutex> lock(mu_);
    return source_;
  }

  void onComplete(Callback cb) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!done_.load(std::memory_order_relaxed)) {
      callbacks_.push_back(std::move(cb));
      return;
    }
    const Status st = status_;
    const int src = source_;
    lock.unlock();
    cb(st, src);
  }

  // A Completion that completes once every one of `parts` has: with the first failure among
  // them (in the order they complete), else OK; its source is the last non-negative one. The
  // parts must outlive the call; the result lives on in their callbacks until they complete.
  static std::shared_ptr<Completion> all(const std::vector<Completion*>& parts) {
    auto out = std::make_shared<Completion>();
    if (parts.empty()) {
      out->complete(Status::ok());
      return out;
    }
    struct Tally {
      std::mutex mu;
      size_t left;
      Status first;
      int source = -1;
    };
    auto tally = std::make_shared<Tally>();
    tally->left = parts.size();
    for (Completion* p : parts) {
      p->onComplete([out, tally](const Status& s, int source) {
        Status st;
        int src;
        {
          std::lock_guard<std::mutex> lock(tally->mu);
          if (!s.isOk() && tally->first.isOk()) tally->first = s;
          if (source >= 0) tally->source = source;
          if (--tally->left > 0) return;
          st = tally->first;
          src = tally->source;
        }
        out->complete(st, src);
      });
    }
    return out;
  }

  // Sets the result, wakes the waiters and runs the callbacks, in the order they were added.
  // False (and nothing changes) if it had already completed.
  bool complete(const Status& st, int source = -1) {
    std::vector<Callback> callbacks;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (done_.load(std::memory_order_relaxed)) return false;
      status_ = st;
      source_ = source;
      done_.store(true, std::memory_order_release);  // status_ and source_ are set first
      callbacks.swap(callbacks_);
    }
    cv_.notify_all();
    for (auto& cb : callbacks) cb(st, source);
    return true;
  }

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::atomic<bool> done_{false};  // written under mu_; read without it by done() and the spin
  Status status_;
  int source_ = -1;
  std::vector<Callback> callbacks_;
};

}  // namespace nanoccl
