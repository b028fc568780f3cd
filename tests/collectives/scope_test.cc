// CallScope (collectives/communicator.h): calls issued from a call's completion (a torch
// future's callbacks) take the same place in the call order on every rank, whenever the
// callback runs; a callback that waits on a call held behind it fails at the deadline.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/callback_runner.h"
#include "tests/collectives/test_util.h"

namespace nanoccl {
namespace {

using colltest::makeWorld;
using colltest::WorldOptions;
using std::chrono::milliseconds;

WorldOptions world(const std::string& intra, milliseconds timeout) {
  WorldOptions o;
  o.size = 2;
  o.intraTransport = intra;
  o.timeout = timeout;
  return o;
}

// An allreduce of `n` floats of value rank + 1 (sum 3 over two ranks), kept alive by the caller.
struct Call {
  explicit Call(size_t n, int rank) : buf(n, static_cast<float>(rank + 1)) {}
  std::vector<float> buf;
  std::shared_ptr<Task> task;
  bool summed() const {
    for (float v : buf) {
      if (v != 3.0f) return false;
    }
    return true;
  }
};

// Queues `call` with a scope for its completion, and posts that completion (as the torch Work
// does) to the callback runner: `inside` runs in the scope, which is closed after it.
void issueWithCallback(Communicator& comm, Call& call, std::function<void()> inside) {
  {
    ScopeRequest request([] { return true; });
    call.task = comm.allreduce(call.buf.data(), call.buf.size(), DataType::kFloat32,
                               ReduceOp::kSum);
  }
  Task* task = call.task.get();
  call.task->onComplete([task, inside = std::move(inside)](const Status& s) {
    std::shared_ptr<CallScope> scope = task->scope();
    CallbackRunner::instance().post([scope, inside, ok = s.isOk()] {
      {
        CallScope::Enter enter(scope);
        if (ok) inside();
      }
      if (scope) scope->close();
    });
  });
}

// Rank 0's callback issues its call at once and its main thread issues the next call 150 ms
// later; rank 1 the other way round. In issue order rank 0 makes X, Z, Y and rank 1 X, Y, Z
// (a mismatch: the calls differ in size); the scope puts Z before Y on both.
TEST(CallScope, ACallbacksCallKeepsItsPlaceOnEveryRank) {
  for (const char* intra : {"shm", "tcp"}) {
    SCOPED_TRACE(intra);
    std::vector<std::shared_ptr<Communicator>> comms;
    NANOCCL_MAKE_WORLD_OR_SKIP(world(intra, milliseconds(10000)), comms);
    std::vector<std::thread> ranks;
    std::vector<Status> xs(2), ys(2), zs(2);
    std::vector<int> okZ(2, 0), okY(2, 0);
    for (int r = 0; r < 2; ++r) {
      ranks.emplace_back([&, r] {
        Call x(4, r), y(64, r), z(16, r);
        std::promise<Status> zDone;
        std::future<Status> zStatus = zDone.get_future();
        issueWithCallback(*comms[r], x, [&, r] {
          if (r == 1) std::this_thread::sleep_for(milliseconds(150));
          z.task = comms[r]->allreduce(z.buf.data(), z.buf.size(), DataType::kFloat32,
                                       ReduceOp::kSum);
          zDone.set_value(z.task->wait(Deadline::after(std::chrono::seconds(30))));
        });
        comms[r]->handOver();
        if (r == 0) std::this_thread::sleep_for(milliseconds(150));
        y.task = comms[r]->allreduce(y.buf.data(), y.buf.size(), DataType::kFloat32,
                                     ReduceOp::kSum);
        const Deadline until = Deadline::after(std::chrono::seconds(30));
        xs[r] = x.task->wait(until);
        ys[r] = y.task->wait(until);
        zs[r] = zStatus.wait_until(until.at()) == std::future_status::ready
                    ? zStatus.get()
                    : timeoutError("the callback's call never completed");
        okZ[r] = z.summed();
        okY[r] = y.summed();
      });
    }
    for (auto& t : ranks) t.join();
    for (int r = 0; r < 2; ++r) {
      EXPECT_TRUE(xs[r].isOk()) << "rank " << r << ": " << xs[r].toString();
      EXPECT_TRUE(zs[r].isOk()) << "rank " << r << ": " << zs[r].toString();
      EXPECT_TRUE(ys[r].isOk()) << "rank " << r << ": " << ys[r].toString();
      EXPECT_TRUE(okZ[r]) << "rank " << r;
      EXPECT_TRUE(okY[r]) << "rank " << r;
    }
  }
}

// A callback that waits on a call issued after its own call, outside the scope, waits on a call
// held behind itself: that call fails at its deadline saying why, and nothing hangs.
TEST(CallScope, ACallbackWaitingOnACallHeldBehindItFailsAtTheDeadline) {
  std::vector<std::shared_ptr<Communicator>> comms;
  const milliseconds timeout(1500);
  NANOCCL_MAKE_WORLD_OR_SKIP(world("shm", timeout), comms);
  std::vector<std::thread> ranks;
  std::vector<Status> inCallback(2), ys(2);
  std::vector<double> took(2, 0);
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      Call x(4, r), y(4, r);
      std::promise<Status> seen;
      std::future<Status> seenStatus = seen.get_future();
      std::shared_ptr<Task>* yTask = &y.task;
      std::atomic<bool> yIssued{false};
      issueWithCallback(*comms[r], x, [&] {
        while (!yIssued.load()) std::this_thread::yield();
        seen.set_value((*yTask)->wait(Deadline::after(std::chrono::seconds(30))));
      });
      comms[r]->handOver();
      const auto start = std::chrono::steady_clock::now();
      y.task = comms[r]->allreduce(y.buf.data(), y.buf.size(), DataType::kFloat32,
                                   ReduceOp::kSum);
      yIssued.store(true);
      ys[r] = y.task->wait(Deadline::after(std::chrono::seconds(30)));
      took[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      inCallback[r] = seenStatus.wait_for(std::chrono::seconds(30)) == std::future_status::ready
                          ? seenStatus.get()
                          : timeoutError("the callback never returned");
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_FALSE(ys[r].isOk()) << "rank " << r;
    EXPECT_NE(ys[r].message().find("did not start within the timeout"), std::string::npos)
        << ys[r].toString();
    EXPECT_NE(ys[r].message().find("callbacks of call #1"), std::string::npos)
        << ys[r].toString();
    EXPECT_FALSE(inCallback[r].isOk()) << "rank " << r;
    EXPECT_LT(took[r], 25.0) << "rank " << r;  // not the 30-s wait: the deadline ended it
  }
}

}  // namespace
}  // namespace nanoccl
