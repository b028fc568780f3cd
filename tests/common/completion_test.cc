#include "common/completion.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

namespace nanoccl {
namespace {

using std::chrono::milliseconds;

TEST(CompletionTest, TheFirstCompletionWins) {
  Completion c;
  EXPECT_FALSE(c.done());
  EXPECT_TRUE(c.complete(abortedError("first"), 3));
  EXPECT_FALSE(c.complete(Status::ok(), 5));
  EXPECT_TRUE(c.done());
  EXPECT_EQ(c.status().code(), StatusCode::kAborted);
  EXPECT_EQ(c.status().message(), "first");
  EXPECT_EQ(c.source(), 3);
}

TEST(CompletionTest, CallbacksRunOnceInOrderAndLateOnesAtOnce) {
  Completion c;
  std::vector<int> order;
  c.onComplete([&](const Status& s, int src) {
    EXPECT_TRUE(s.isOk());
    EXPECT_EQ(src, 7);
    order.push_back(1);
  });
  c.onComplete([&](const Status&, int) { order.push_back(2); });
  EXPECT_TRUE(order.empty());
  c.complete(Status::ok(), 7);
  c.complete(abortedError("late"), 1);  // ignored: runs nothing again
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
  c.onComplete([&](const Status& s, int src) {
    EXPECT_TRUE(s.isOk());
    EXPECT_EQ(src, 7);
    order.push_back(3);
  });
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
}

TEST(CompletionTest, ACallbackMayWaitOnWhatItCompletes) {
  // Callbacks run outside the lock: one that reads the result (or waits) does not deadlock.
  Completion c;
  Status seen = internalError("not called");
  c.onComplete([&](const Status&, int) {
    EXPECT_TRUE(c.wait(Deadline::never()));
    seen = c.status();
  });
  c.complete(Status::ok());
  EXPECT_TRUE(seen.isOk());
}

TEST(CompletionTest, WaitEndsAtTheDeadlineOrAtCompletion) {
  Completion c;
  EXPECT_FALSE(c.wait(Deadline::after(milliseconds(20))));
  EXPECT_FALSE(c.wait(Deadline::after(milliseconds(0)), std::chrono::microseconds(200)));
  std::thread t([&] {
    std::this_thread::sleep_for(milliseconds(20));
    c.complete(Status::ok(), 2);
  });
  EXPECT_TRUE(c.wait(Deadline::never()));  // no timeout: wait_until(max) would overflow
  EXPECT_EQ(c.source(), 2);
  t.join();
  EXPECT_TRUE(c.wait(Deadline::after(milliseconds(0))));
}

TEST(CompletionTest, ManyWaitersAllWake) {
  Completion c;
  std::vector<std::thread> waiters;
  std::atomic<int> woke{0};
  for (int i = 0; i < 4; ++i) {
    waiters.emplace_back([&] {
      if (c.wait(Deadline::after(milliseconds(60000)), std::chrono::microseconds(50))) ++woke;
    });
  }
  c.complete(Status::ok());
  for (auto& t : waiters) t.join();
  EXPECT_EQ(woke.load(), 4);
}

}  // namespace
}  // namespace nanoccl
