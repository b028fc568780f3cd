#include "common/callback_runner.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>

#include "common/logging.h"
#include "common/thread_name.h"

namespace nanoccl {

struct CallbackRunner::State {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> jobs;
  // Threads that will take a queued job without finishing another first: those waiting in
  // threadLoop, and those started but not yet there. post() keeps jobs.size() <= available.
  int available = 0;
  int alive = 0;
  int peak = 0;
};

namespace {

std::atomic<CallbackRunner*> gRunner{nullptr};
std::once_flag gOnce;

}  // namespace

CallbackRunner::CallbackRunner() : state_(new State) {}

CallbackRunner& CallbackRunner::instance() {
  std::call_once(gOnce, [] {
    gRunner.store(new CallbackRunner, std::memory_order_release);
    // The child of a fork has none of the parent's threads: give it a runner of its own. The
    // parent's (its mutex possibly held at the fork) is left alone, never used again there.
    pthread_atfork(nullptr, nullptr, [] {
      auto* fresh = new CallbackRunner;
      fresh->replaced_ = gRunner.load(std::memory_order_relaxed);
      gRunner.store(fresh, std::memory_order_release);
    });
  });
  return *gRunner.load(std::memory_order_acquire);
}

void CallbackRunner::post(std::function<void()> job) {
  State& st = *state_;
  bool start = false;
  {
    std::lock_guard<std::mutex> lock(st.mu);
    st.jobs.push_back(std::move(job));
    if (static_cast<int>(st.jobs.size()) > st.available) {
      ++st.available;
      ++st.alive;
      st.peak = std::max(st.peak, st.alive);
      start = true;
    }
  }
  if (start) {
    namedThread("cb", [this] { threadLoop(); }).detach();
  } else {
    st.cv.notify_one();
  }
}

void CallbackRunner::threadLoop() {
  State& st = *state_;
  std::unique_lock<std::mutex> lock(st.mu);
  for (;;) {
    if (!st.cv.wait_for(lock, kIdle, [&] { return !st.jobs.empty(); })) {
      --st.available;
      --st.alive;
      return;
    }
    std::function<void()> job = std::move(st.jobs.front());
    st.jobs.pop_front();
    --st.available;
    lock.unlock();
    try {
      job();
    } catch (const std::exception& e) {
      NANOCCL_WARN("a callback threw: " << e.what());
    } catch (...) {
      NANOCCL_WARN("a callback threw a non-standard exception");
    }
    job = nullptr;  // what the job held goes here, outside the lock
    lock.lock();
    ++st.available;
  }
}

int CallbackRunner::threads() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->alive;
}

int CallbackRunner::peakThreads() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->peak;
}

}  // namespace nanoccl
