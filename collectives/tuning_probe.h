// Tuning, the measurements of the links (collectives/tuning_probe.cc) that agreeOnProfile
// (collectives/tuning.cc) combines into a link profile: every rank takes part in the probes,
// rank 0 collects what they timed.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "collectives/store.h"
#include "collectives/tuning.h"
#include "common/deadline.h"
#include "common/status.h"

namespace nanoccl::tuning_probe {

inline double secondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The link classes of `t`'s topology, probed on its transports as their call #0 by every rank
// at once; rank 0 returns them, the others empty classes. On failure the group's transports
// are aborted: what the probe left in flight ends before its scratch memory goes.
Result<LinkProfile> probeLinks(Store& store, const TuningTarget& t, const Deadline& deadline);

// A node probe's transfer: `timed` from one barrier to the next, less the fastest of the empty
// barriers timed just before (what the closing barrier itself costs; a slow one is the
// machine's hiccup, not the barrier's cost). At least 1 us.
double transferSeconds(double timed, const std::vector<double>& emptyBarriers);

// This host's name, "?" where the system does not say.
std::string hostName();

// Cores this process may run on over the ranks that published rank 0's host name under
// "tune/host/<rank>", at most 1.
Result<double> cpuShareOfRankZero(Store& store, int size, const Deadline& deadline);

}  // namespace nanoccl::tuning_probe
