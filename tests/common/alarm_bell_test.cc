// AlarmBell (common/alarm_bell.h): a ring or an alarm ends a sleep, neither is lost when it comes
// before the sleep, and an alarm moved later does not go off at its first time. The bounds
// below tell which of the ring, the alarm or the limit ended a sleep, not how fast: a sleep
// never ends before its alarm or limit, and "at once" is within 10 s against a 20-s limit.
#include "common/alarm_bell.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

namespace nanoccl {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

void openBell(AlarmBell& bell) {
  const Status s = bell.open();
  ASSERT_TRUE(s.isOk()) << s.toString();
}

// How long bell.sleep() took, with a limit of `limit` from its start (none by default).
Clock::duration sleepTook(AlarmBell& bell, Clock::duration limit = Clock::duration::max()) {
  const auto start = Clock::now();
  bell.sleep(limit == Clock::duration::max() ? Clock::time_point::max() : start + limit);
  return Clock::now() - start;
}

// "At once": far from the 20-s limits the sleeps below are given where they must end early.
constexpr auto kAtOnce = seconds(10);

TEST(AlarmBell, ARingBeforeTheSleepEndsIt) {
  AlarmBell bell;
  openBell(bell);
  bell.ring();
  bell.ring();  // two rings, one sleep: both are cleared by it
  EXPECT_LT(sleepTook(bell, seconds(20)), kAtOnce);
  EXPECT_GE(sleepTook(bell, milliseconds(50)), milliseconds(50));  // cleared: to its limit
}

TEST(AlarmBell, ARingFromAnotherThreadEndsASleepWithoutLimit) {
  AlarmBell bell;
  openBell(bell);
  std::thread ringer([&] {
    std::this_thread::sleep_for(milliseconds(50));
    bell.ring();
  });
  bell.sleep();  // would hang without the ring: ctest's timeout names this test
  ringer.join();
}

// The alarm ends a sleep at its time, not before; set again later, not at its first time.
TEST(AlarmBell, TheAlarmEndsASleepAtItsLastTimeNotBefore) {
  AlarmBell bell;
  openBell(bell);
  for (const std::vector<milliseconds>& times :
       {std::vector<milliseconds>{milliseconds(100)}, {milliseconds(50), milliseconds(400)}}) {
    const auto start = Clock::now();
    for (const milliseconds t : times) bell.setAlarm(start + t);
    bell.sleep();
    EXPECT_GE(Clock::now() - start, times.back());
  }
}

TEST(AlarmBell, AnAlarmInThePastGoesOffAtOnce) {
  AlarmBell bell;
  openBell(bell);
  bell.setAlarm(Clock::now() - seconds(1));
  EXPECT_LT(sleepTook(bell, seconds(20)), kAtOnce);
  // A time before the clock's epoch (a zero would disarm the timer) goes off at once too.
  bell.setAlarm(Clock::time_point{});
  EXPECT_LT(sleepTook(bell, seconds(20)), kAtOnce);
}

TEST(AlarmBell, TheLimitEndsASleepNobodyEnds) {
  AlarmBell bell;
  openBell(bell);
  EXPECT_GE(sleepTook(bell, milliseconds(80)), milliseconds(80));
  // A limit already past returns at once.
  const auto start = Clock::now();
  bell.sleep(start - seconds(1));
  EXPECT_LT(Clock::now() - start, kAtOnce);
}

}  // namespace
}  // namespace nanoccl
