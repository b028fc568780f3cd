// CallbackRunner (common/callback_runner.h): every posted job starts without waiting for
// another to return, so a job that waits on a job posted after it cannot deadlock.
#include "common/callback_runner.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

namespace nanoccl {
namespace {

using std::chrono::seconds;

// A runner of the test's own, never destroyed (as instance()), and kept reachable so that the
// leak checker does not count it once its threads are gone.
CallbackRunner& freshRunner() {
  static auto* kept = new std::vector<CallbackRunner*>;  // never destroyed either
  kept->push_back(new CallbackRunner);
  return *kept->back();
}

// Jobs nested `depth` deep, each waiting on the one it posts: as a callback that issues a
// collective and waits on its future, whose completion is itself a posted job.
int nest(CallbackRunner& runner, int depth) {
  if (depth == 0) return 0;
  auto inner = std::make_shared<std::promise<int>>();
  std::future<int> got = inner->get_future();
  runner.post([&runner, inner, depth] { inner->set_value(nest(runner, depth - 1) + 1); });
  if (got.wait_for(seconds(30)) != std::future_status::ready) return -1000;
  return got.get();
}

TEST(CallbackRunner, AJobWaitingOnALaterJobDoesNotBlockIt) {
  CallbackRunner& runner = freshRunner();
  auto outer = std::make_shared<std::promise<int>>();
  std::future<int> done = outer->get_future();
  runner.post([&runner, outer] { outer->set_value(nest(runner, 5)); });
  ASSERT_EQ(done.wait_for(seconds(30)), std::future_status::ready);
  EXPECT_EQ(done.get(), 5);
  EXPECT_GE(runner.peakThreads(), 6);  // one thread a level that was blocked at once
}

TEST(CallbackRunner, AThrowingJobLeavesTheRunnerWorking) {
  CallbackRunner& runner = freshRunner();
  runner.post([] { throw std::runtime_error("a callback's error"); });
  runner.post([] { throw 7; });
  std::promise<void> ran;
  std::future<void> f = ran.get_future();
  runner.post([&ran] { ran.set_value(); });
  EXPECT_EQ(f.wait_for(seconds(30)), std::future_status::ready);
}

TEST(CallbackRunner, IdleThreadsExit) {
  CallbackRunner& runner = freshRunner();
  std::promise<void> ran;
  std::future<void> f = ran.get_future();
  runner.post([&ran] { ran.set_value(); });
  ASSERT_EQ(f.wait_for(seconds(30)), std::future_status::ready);
  const auto until = std::chrono::steady_clock::now() + CallbackRunner::kIdle + seconds(20);
  while (runner.threads() > 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(runner.threads(), 0);
}

TEST(CallbackRunner, TheProcessHasOne) {
  EXPECT_EQ(&CallbackRunner::instance(), &CallbackRunner::instance());
}

}  // namespace
}  // namespace nanoccl
