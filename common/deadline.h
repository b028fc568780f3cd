// Deadlines: every wait in nanoccl has one (docs/design.md, convention 5).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace nanoccl {

using Clock = std::chrono::steady_clock;

class Deadline {
 public:
  // Saturates: a duration past the clock's range (e.g. Python's timedelta.max) is never().
  static Deadline after(std::chrono::milliseconds d) { return from(Clock::now(), d); }
  static Deadline from(Clock::time_point start, std::chrono::milliseconds d) {
    if (d >= std::chrono::duration_cast<std::chrono::milliseconds>(
                 Clock::time_point::max() - start)) {
      return never();
    }
    return Deadline(start + d);
  }
  static Deadline never() { return Deadline(Clock::time_point::max()); }
  explicit Deadline(Clock::time_point at) : at_(at) {}

  Clock::time_point at() const { return at_; }
  bool expired() const { return Clock::now() >= at_; }
  // Milliseconds left, clamped to [0, cap]; for poll()/epoll_wait() style timeouts.
  int remainingMs(int cap = 1 << 30) const {
    if (at_ == Clock::time_point::max()) return cap;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(at_ - Clock::now()).count();
    if (left <= 0) return 0;
    return left > cap ? cap : static_cast<int>(left);
  }
  // The earlier of the two.
  Deadline min(const Deadline& other) const { return at_ < other.at_ ? *this : other; }

 private:
  Clock::time_point at_;
};

// Waits on `cv` (with `lock` held) until `ready()` or the deadline; false on timeout.
// Deadline::never() waits without a timeout: wait_until(time_point::max()) overflows inside the
// library.
template <typename Pred>
bool waitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
               const Deadline& deadline, Pred ready) {
  if (deadline.at() == Clock::time_point::max()) {
    cv.wait(lock, ready);
    return true;
  }
  return cv.wait_until(lock, deadline.at(), ready);
}

}  // namespace nanoccl
