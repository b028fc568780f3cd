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

// Each thread learns from its own waits whether spinning pays (common/spin.h): long waits
// turn it off, a few short ones bring it back, and waits without a budget teach nothing.
TEST(CompletionTest, AllCompletesOnceEveryPartHasWithTheFirstFailure) {
  Completion a, b, c;
  std::shared_ptr<Completion> all = Completion::all({&a, &b, &c});
  int calls = 0;
  all->onComplete([&](const Status&, int) { ++calls; });
  b.complete(peerError("b failed"), 1);
  a.complete(Status::ok(), 0);
  EXPECT_FALSE(all->done());
  c.complete(timeoutError("c timed out"), -1);
  ASSERT_TRUE(all->done());
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(all->status().code(), StatusCode::kPeerError);  // the first failure, not the last
  EXPECT_EQ(all->source(), 0);                               // the last non-negative source

  Completion d;
  d.complete(Status::ok(), 3);  // parts done before all() are counted too
  std::shared_ptr<Completion> done = Completion::all({&d});
  EXPECT_TRUE(done->done());
  EXPECT_TRUE(done->status().isOk());
  EXPECT_EQ(done->source(), 3);
  EXPECT_TRUE(Completion::all({})->done());
}

TEST(SpinPolicyTest, LongWaitsStopSpinningAndShortOnesBringItBack) {
  using std::chrono::microseconds;
  const microseconds budget(100);
  std::thread([&] {
    EXPECT_EQ(SpinPolicy::budget(budget), budget);  // nothing learned yet: spin
    SpinPolicy::record(budget, milliseconds(10));
    SpinPolicy::record(budget, milliseconds(10));
    EXPECT_EQ(SpinPolicy::budget(budget), budget);  // two long waits: not yet
    for (int i = 0; i < 5; ++i) SpinPolicy::record(budget, milliseconds(10));
    EXPECT_EQ(SpinPolicy::budget(budget), microseconds(0));
    EXPECT_EQ(SpinPolicy::budget(milliseconds(1)), milliseconds(1));  // a larger budget
    // Another thread's history is its own.
    std::thread([&] { EXPECT_EQ(SpinPolicy::budget(budget), budget); }).join();
    SpinPolicy::record(microseconds(0), microseconds(1));  // no budget: not counted
    EXPECT_EQ(SpinPolicy::budget(budget), microseconds(0));
    SpinPolicy::record(budget, microseconds(10));
    SpinPolicy::record(budget, microseconds(10));
    EXPECT_EQ(SpinPolicy::budget(budget), microseconds(0));
    SpinPolicy::record(budget, microseconds(10));  // the third short wait
    EXPECT_EQ(SpinPolicy::budget(budget), budget);
  }).join();
}

// A waiter whose waits are long stops polling and still sees the completion.
TEST(SpinPolicyTest, AWaitThatStoppedSpinningStillWakes) {
  std::thread([] {
    const std::chrono::microseconds spin(50);
    for (int i = 0; i < 8; ++i) SpinPolicy::record(spin, milliseconds(5));
    ASSERT_EQ(SpinPolicy::budget(spin).count(), 0);
    Completion c;
    std::thread completer([&] {
      std::this_thread::sleep_for(milliseconds(2));
      c.complete(Status::ok(), 1);
    });
    EXPECT_TRUE(c.wait(Deadline::after(std::chrono::seconds(30)), spin));
    EXPECT_EQ(c.source(), 1);
    completer.join();
  }).join();
}

}  // namespace
}  // namespace nanoccl
