// AlarmBell (common/alarm_bell.h): a ring or an alarm ends a sleep, neither is lost when it comes
// before the sleep, and an alarm moved later does not go off at its first time. The bounds
// below are what ended a sleep (the ring, the alarm or the limit), not speed: each is seconds
// away from the time it checks.
#include "common/alarm_bell.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace nanoccl {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

void openBell(AlarmBell& bell) {
  const Status s = bell.open();
  ASSERT_TRUE(s.isOk()) << s.toString();
}

TEST(AlarmBell, ARingBeforeTheSleepEndsIt) {
  AlarmBell bell;
  openBell(bell);
  bell.ring();
  bell.ring();  // two rings, one sleep: both are cleared by it
  const auto start = Clock::now();
  bell.sleep(start + seconds(20));
  EXPECT_LT(Clock::now() - start, seconds(10));
  // Cleared: the next sleep lasts until its limit.
  const auto second = Clock::now();
  bell.sleep(second + milliseconds(50));
  EXPECT_GE(Clock::now() - second, milliseconds(50));
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

TEST(AlarmBell, TheAlarmEndsASleepAtItsTimeNotBefore) {
  AlarmBell bell;
  openBell(bell);
  const auto start = Clock::now();
  bell.setAlarm(start + milliseconds(100));
  bell.sleep();
  EXPECT_GE(Clock::now() - start, milliseconds(100));
}

TEST(AlarmBell, AnAlarmInThePastGoesOffAtOnce) {
  AlarmBell bell;
  openBell(bell);
  bell.setAlarm(Clock::now() - seconds(1));
  const auto start = Clock::now();
  bell.sleep(start + seconds(20));
  EXPECT_LT(Clock::now() - start, seconds(10));
  // A time before the clock's epoch (a zero would disarm the timer) goes off at once too.
  bell.setAlarm(Clock::time_point{});
  const auto again = Clock::now();
  bell.sleep(again + seconds(20));
  EXPECT_LT(Clock::now() - again, seconds(10));
}

TEST(AlarmBell, AnAlarmMovedLaterDoesNotGoOffAtItsFirstTime) {
  AlarmBell bell;
  openBell(bell);
  const auto start = Clock::now();
  bell.setAlarm(start + milliseconds(50));
  bell.setAlarm(start + milliseconds(400));
  bell.sleep();
  EXPECT_GE(Clock::now() - start, milliseconds(400));
}

TEST(AlarmBell, TheLimitEndsASleepNobodyEnds) {
  AlarmBell bell;
  openBell(bell);
  const auto start = Clock::now();
  bell.sleep(start + milliseconds(80));
  EXPECT_GE(Clock::now() - start, milliseconds(80));
  // A limit already past returns at once.
  const auto again = Clock::now();
  bell.sleep(again - seconds(1));
  EXPECT_LT(Clock::now() - again, seconds(10));
}

}  // namespace
}  // namespace nanoccl
