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
#pragma once

#include <chrono>
#include <thread>

#include "common/deadline.h"

namespace nanoccl {

// Polls `ready()` for up to `budget`, yielding between polls; returns whether it became true.
// A zero budget polls once.
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

}  // namespace nanoccl
