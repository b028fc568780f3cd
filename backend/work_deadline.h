// When a wait on a Work gives up. Shared by WorkNanoccl (pg_internal.h) and WorkCuda.
//
// Every deadline of a call counts from when it was issued (the torch call returned its Work),
// never from when it started running or from when someone waits on it:
// - the communicator fails the call by issue time + the group timeout, whether it spent that
//   time queued behind other calls or on the wire (collectives, p2p and CUDA calls alike);
// - Work::wait(timeout) with a timeout gives up at issue time + that timeout (as
//   ProcessGroupNCCL measures it, from the Work's start), throwing "did not complete";
// - Work::wait() without one waits until issue time + the group timeout + kWaitGrace. The call
//   has failed by itself before then; reaching the grace's end is a bug, reported, not a hang.
#pragma once

#include <chrono>
#include <cstdint>

#include "common/deadline.h"

namespace nanoccl::pg {

constexpr std::chrono::milliseconds kWaitGrace{30000};

// `waitTimeout` <= 0 is torch's kNoTimeout: the group timeout applies.
inline Deadline workWaitDeadline(Clock::time_point issued, std::chrono::milliseconds groupTimeout,
                                 std::chrono::milliseconds waitTimeout) {
  return Deadline(issued + (waitTimeout.count() <= 0 ? groupTimeout + kWaitGrace : waitTimeout));
}

inline int64_t msSince(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
}

}  // namespace nanoccl::pg
