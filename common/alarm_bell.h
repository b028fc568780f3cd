// A sleep that other threads end by ringing, and that an alarm ends too, which other threads
// may set and move later without waking the sleeper.
//
// Why not a condition variable's timed wait: the communicator's worker must start a call that
// nobody waits on within a bound of its issue (kTick in call_queue.cc), yet should not wake
// while calls are made back to back and run by their own callers. With a condition variable
// it could only look every kTick (a wake-up every 10 ms while calls were being made, each
// taking the CPU from a caller that spins on a call in flight: in 0.62 s of 4-byte allreduces
// on 2 ranks the worker woke 62-66 times, and the calling thread was preempted 67-104 times;
// 18-33 with the alarm). With the alarm, each call left to its caller moves the alarm on; the
// worker wakes when calls stop (once) or when one is left unstarted.
//
// Not the shm transport's Doorbell (transports/shm/segment.h): that one is a futex word in
// shared memory, rung across processes, with no alarm.
//
// An eventfd (rung) and a timerfd (the alarm, CLOCK_MONOTONIC, which std::chrono::steady_clock
// reads on Linux) waited on by one ppoll. Both are level-triggered: a ring or alarm that comes
// before sleep() is not lost. One sleeper at a time; ring() and setAlarm() from any thread.
#pragma once

#include "common/deadline.h"
#include "common/status.h"

namespace nanoccl {

class AlarmBell {
 public:
  AlarmBell() = default;
  ~AlarmBell();
  AlarmBell(const AlarmBell&) = delete;
  AlarmBell& operator=(const AlarmBell&) = delete;

  // Creates the two descriptors; the other calls need it to have succeeded.
  Status open();

  // Ends the current sleep, or the next one if nobody sleeps now.
  void ring();

  // The sleeper wakes at `at` at the latest: replaces an earlier alarm, later or sooner.
  void setAlarm(Clock::time_point at);

  // Sleeps until rung, the alarm goes off or `until` passes (time_point::max(): no limit), and
  // clears what woke it: the sleeper looks at what changed after this returns. May return
  // early (a signal): callers re-check their condition in a loop, as with a condition variable.
  void sleep(Clock::time_point until = Clock::time_point::max());

 private:
  int ringFd_ = -1;
  int alarmFd_ = -1;
};

}  // namespace nanoccl
