// When a wait on a Work gives up. Shared by WorkNanoccl (pg_internal.h) and WorkCuda.
//
// Every deadline of a call counts from when it was issued (the torch call returned its Work),
// never from when it started running or from when someone waits on it:
// - the communicator fails the call by issue time + the group timeout, whether it spent that
//   time queued behind other calls or on the wire (collectives, p2p and CUDA calls alike);
// - Work::wait(timeout) with a timeout gives up at issue time + that timeout (as
//   ProcessGroupNCCL measures it, from the Work's start), throwing "did not complete";
// - Work::wait() without one waits until issue time + the group timeout + kWaitGrace. The call
//   has failed by itself before then; reaching the grace's end is an internal error, reported,
//   not a hang. waitFailure() words both.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "common/deadline.h"

namespace nanoccl::pg {

constexpr std::chrono::milliseconds kWaitGrace{30000};

// `waitTimeout` <= 0 is torch's kNoTimeout: the group timeout applies.
inline Deadline workWaitDeadline(Clock::time_point issued, std::chrono::milliseconds groupTimeout,
                                 std::chrono::milliseconds waitTimeout) {
  const bool none = waitTimeout.count() <= 0;
  const auto grace = groupTimeout < std::chrono::milliseconds::max() - kWaitGrace
                         ? groupTimeout + kWaitGrace
                         : std::chrono::milliseconds::max();
  return Deadline::from(issued, none ? grace : waitTimeout);
}

// What a wait that gave up says, after "<what> ".
inline std::string waitFailure(Clock::time_point issued, std::chrono::milliseconds waitTimeout) {
  const auto ago =
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - issued).count();
  if (waitTimeout.count() > 0) {
    return "did not complete within the wait's timeout of " +
           std::to_string(waitTimeout.count()) + " ms, counted from its issue " +
           std::to_string(ago) + " ms ago";
  }
  return "did not complete " + std::to_string(ago) +
         " ms after its issue, past the group timeout and a grace: an internal error (every "
         "call fails by itself within the timeout)";
}

}  // namespace nanoccl::pg
