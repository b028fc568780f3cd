// Bounded polling before sleeping, for threads that wait on a call in flight.
//
// Going to sleep and being woken by another thread costs tens of microseconds per hand-over
// on a virtual machine (the waker's futex call, then the sleeper's idle vCPU coming back):
// measured on the project's 2-core VM, a condition-variable ping-pong between two threads
// costs 25 us per wake-up across cores against 5 us on one core. A 4-byte allreduce crosses
// several such hand-overs. So a thread that waits for something already under way (a
// request it posted, a peer's reply) polls for up to NANOCCL_SPIN_US first, yielding its core
// between polls, so that the thread it waits on can run there, and sleeps only after that.
// Nothing spins without a call in flight: an idle communicator's threads sleep.
//
// Spinning pays only where what a thread waits for comes within the budget. A large message
// on a slow link arrives in pieces milliseconds apart; spinning through those gaps takes the
// core from the codec and copies that the call also needs (measured: a 256 MB int8 allreduce
// on the emulated 2x2 cluster, two 1 Gbit/s rails, 4 ranks on 2 cores, ran 5-13% faster with
// NANOCCL_SPIN_US=0). So each thread keeps SpinPolicy: the typical length of its recent
// waits for something in flight, and spins only while that is within the budget.
#pragma once

#include <algorithm>
#include <chrono>
#include <thread>

#include "common/deadline.h"

namespace nanoccl {

inline constexpr std::chrono::microseconds kNoSpin{0};

// Polls `ready()` for up to `budget`, yielding between polls; returns whether it became true.
// A zero budget polls once. Yields, not a pause-instruction loop: polling with `pause` for
// the first 3 us before yielding made a 4-byte allreduce on 2 bound ranks slower on the
// project's VM (results/latency/README.md), likely the hypervisor's pause-loop exits.
template <typename Ready>
bool spinFor(std::chrono::microseconds budget, Ready&& ready) {
  if (ready()) return true;
  if (budget.count() <= 0) return false;
  const Clock::time_point until = Clock::now() + budget;
  do {
    std::this_thread::yield();
    if (ready()) return true;
  } while (Clock::now() < until);
  return false;
}

// The spin budget a thread gives its next wait for something in flight, learned from its
// recent such waits: the budget while their typical length (a moving average of the last few,
// each counted up to twice the budget) is within it, else zero: sleep at once. One thread,
// one history: a thread that waits both on fast and slow things averages them.
class SpinPolicy {
 public:
  // `budget` (NANOCCL_SPIN_US), or zero where this thread's recent waits took longer.
  static std::chrono::microseconds budget(std::chrono::microseconds budget) {
    return typical_ <= budget ? budget : std::chrono::microseconds(0);
  }

  // A wait with `budget` that took `took` from its start until what it waited for came (or
  // it gave up). Counted up to twice the budget, so that a long wait is forgotten after a
  // few short ones: from the cap, three waits of a tenth of the budget bring spinning back.
  static void record(std::chrono::microseconds budget, Clock::duration took) {
    if (budget.count() <= 0) return;
    const auto t = std::min(std::chrono::duration_cast<std::chrono::microseconds>(took),
                            2 * budget);
    typical_ = (3 * typical_ + t) / 4;
  }

 private:
  static inline thread_local std::chrono::microseconds typical_{0};
};

}  // namespace nanoccl
