#include "common/deadline.h"

#include <gtest/gtest.h>

#include <chrono>

namespace nanoccl {
namespace {

using std::chrono::milliseconds;

TEST(DeadlineTest, ADurationPastTheClocksRangeIsNever) {
  // torch passes timedelta.max as about 9e15 ms; adding it to now() would wrap into the past.
  EXPECT_EQ(Deadline::after(milliseconds::max()).at(), Clock::time_point::max());
  EXPECT_EQ(Deadline::from(Clock::now(), milliseconds::max()).at(), Clock::time_point::max());
  EXPECT_FALSE(Deadline::after(milliseconds::max()).expired());
  EXPECT_EQ(Deadline::after(milliseconds::max()).remainingMs(1000), 1000);
}

TEST(DeadlineTest, CountsFromTheGivenStart) {
  const auto start = Clock::now() - std::chrono::seconds(10);
  EXPECT_TRUE(Deadline::from(start, milliseconds(5000)).expired());
  EXPECT_EQ(Deadline::from(start, milliseconds(5000)).at(), start + milliseconds(5000));
  EXPECT_FALSE(Deadline::from(start, milliseconds(60000)).expired());
}

}  // namespace
}  // namespace nanoccl
