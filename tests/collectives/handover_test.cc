// Who runs a call (collectives/communicator.h): the thread that waits on the next queued call
// runs it itself (Task::runHere); calls nobody waits on run on the worker; the order of calls
// holds either way; and an idle communicator's threads sleep.
#include <gtest/gtest.h>

#include <dirent.h>
#include <time.h>

#include <atomic>
#include <condition_variable>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/collectives/test_util.h"

namespace nanoccl {
namespace {

using colltest::makeWorld;
using colltest::WorldOptions;

WorldOptions world(int size, int spinUs, const std::string& intra = "auto") {
  WorldOptions o;
  o.size = size;
  o.spinUs = spinUs;
  o.intraTransport = intra;
  o.timeout = std::chrono::milliseconds(20000);
  return o;
}

// Records the thread a task completed on. A Task is done() (test() true, wait() returns)
// before its callbacks have run (common/completion.h), so get() waits for the callback, and
// the callback keeps this object alive: a test that returns early leaves it no dangling
// reference on the worker.
struct CompletedOn : std::enable_shared_from_this<CompletedOn> {
  std::mutex mu;
  std::condition_variable cv;
  bool seen = false;
  std::thread::id id;
  void watch(Task& t) {
    t.onComplete([self = shared_from_this()](const Status&) {
      std::lock_guard<std::mutex> lock(self->mu);
      self->id = std::this_thread::get_id();
      self->seen = true;
      self->cv.notify_all();
    });
  }
  // The thread the callback ran on; a default id if it has not run within 30 s.
  std::thread::id get() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, std::chrono::seconds(30), [this] { return seen; });
    return id;
  }
};

std::vector<std::shared_ptr<CompletedOn>> watchers(int n) {
  std::vector<std::shared_ptr<CompletedOn>> on;
  for (int i = 0; i < n; ++i) on.push_back(std::make_shared<CompletedOn>());
  return on;
}

// Polls test() (which runs nothing) until done or 30 s.
bool pollUntilDone(const std::vector<std::shared_ptr<Task>>& tasks) {
  const Deadline until = Deadline::after(std::chrono::seconds(30));
  for (const auto& t : tasks) {
    while (!t->test()) {
      if (until.expired()) return false;
      std::this_thread::yield();
    }
  }
  return true;
}

// With a long hand-over grace, the worker cannot have taken the call: the waiting thread ran it.
TEST(HandOver, AWaitedCallRunsOnTheWaitingThread) {
  for (const char* intra : {"shm", "tcp"}) {
    SCOPED_TRACE(intra);
    std::vector<std::shared_ptr<Communicator>> comms;
    NANOCCL_MAKE_WORLD_OR_SKIP(world(2, 1000000, intra), comms);
    auto on = watchers(2);
    std::vector<std::thread::id> waiter(2);
    std::vector<float> value = {1, 2};
    std::vector<Status> st(2);
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r) {
      ranks.emplace_back([&, r] {
        waiter[r] = std::this_thread::get_id();
        auto task = comms[r]->allreduce(&value[r], 1, DataType::kFloat32, ReduceOp::kSum);
        on[r]->watch(*task);
        st[r] = task->wait(Deadline::after(std::chrono::seconds(30)));
      });
    }
    for (auto& t : ranks) t.join();
    for (int r = 0; r < 2; ++r) {
      EXPECT_TRUE(st[r].isOk()) << st[r].toString();
      EXPECT_EQ(value[r], 3.0f);
      EXPECT_EQ(on[r]->get(), waiter[r]) << "rank " << r << "'s call ran on another thread";
    }
  }
}

// Issues a 2-rank allreduce that nobody waits on (handing it over first where asked), polls
// test() until both ranks finish, and checks the sum and that neither ran on this thread.
void runUnwaited(const std::vector<std::shared_ptr<Communicator>>& comms, bool handOver) {
  std::vector<float> value = {1, 2};
  auto on = watchers(2);
  std::vector<std::shared_ptr<Task>> tasks;
  for (int r = 0; r < 2; ++r) {
    tasks.push_back(comms[r]->allreduce(&value[r], 1, DataType::kFloat32, ReduceOp::kSum));
    on[r]->watch(*tasks.back());
    if (handOver) comms[r]->handOver();
  }
  ASSERT_TRUE(pollUntilDone(tasks));
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(tasks[r]->status().isOk()) << tasks[r]->status().toString();
    EXPECT_EQ(value[r], 3.0f);
    const std::thread::id ranOn = on[r]->get();
    EXPECT_NE(ranOn, std::thread::id()) << "rank " << r << "'s callback did not run";
    EXPECT_NE(ranOn, std::this_thread::get_id());
  }
}

// Calls that nobody waits on (only test() is polled) still run, on the worker: its alarm starts
// each (kTick in call_queue.cc), on a fresh communicator and on one that has just run one.
TEST(HandOver, ACallNobodyWaitsOnStillRuns) {
  std::vector<std::shared_ptr<Communicator>> comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(world(2, -1), comms);
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(round);
    runUnwaited(comms, false);
  }
}

// The voluntary context switches of this process's worker threads ("nanoccl-worker"): one per
// sleep after a wake-up.
long workerSwitches() {
  long total = 0;
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    const std::string task = std::string("/proc/self/task/") + e->d_name;
    std::ifstream comm(task + "/comm");
    std::string name;
    if (!std::getline(comm, name) || name != "nanoccl-worker") continue;
    std::ifstream status(task + "/status");
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("voluntary_ctxt_switches:", 0) == 0) total += std::stol(line.substr(24));
    }
  }
  closedir(dir);
  return total;
}

// Calls made back to back and waited on by their callers leave the worker asleep: each moves
// its alarm on instead of waking it. It may wake only where a rank's calls stopped for half a
// tick (5 ms, a rank descheduled on a loaded machine): at most once for each such gap. (Before,
// it woke every 10 ms while calls were being made: 40 times in these 200 ms.)
TEST(HandOver, CallsMadeBackToBackLeaveTheWorkerAsleep) {
  std::vector<std::shared_ptr<Communicator>> comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(world(2, -1), comms);
  constexpr auto kFor = std::chrono::milliseconds(200);
  constexpr auto kGap = std::chrono::milliseconds(5);  // kTick / 2
  std::vector<int> gaps(2, 0);
  std::vector<Status> st(2);
  std::atomic<bool> stop{false};
  auto loop = [&](int r, bool counted) {
    float v = 1;
    Clock::time_point last = Clock::now();
    for (;;) {
      // Rank 0 says when to stop (the max of 1 and 0), so both ranks make the same calls.
      float more = r == 0 && !stop.load() ? 1.0f : 0.0f;
      for (float* x : {&v, &more}) {
        st[r] = comms[r]->allreduce(x, 1, DataType::kFloat32, ReduceOp::kMax)
                    ->wait(Deadline::after(std::chrono::seconds(30)));
        if (!st[r].isOk()) return;
      }
      const Clock::time_point now = Clock::now();
      if (counted && now - last >= kGap) ++gaps[r];
      last = now;
      if (more == 0.0f) return;
    }
  };
  auto run = [&](bool counted) {
    stop = false;
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r) ranks.emplace_back(loop, r, counted);
    std::this_thread::sleep_for(counted ? kFor : std::chrono::milliseconds(20));
    stop = true;
    for (auto& t : ranks) t.join();
  };
  run(false);  // warm: the first calls set up the rings and the board
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the warm-up's alarm goes off
  const long before = workerSwitches();
  ASSERT_GE(before, 0);
  run(true);
  const long woke = workerSwitches() - before;
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(st[r].isOk()) << st[r].toString();
  std::printf("[ worker ] %ld wake-up(s) in %lld ms of calls, %d and %d gap(s) of 5 ms\n", woke,
              static_cast<long long>(kFor.count()), gaps[0], gaps[1]);
  // One for each gap, one for each rank's last calls (their alarm may go off before the count).
  EXPECT_LE(woke, gaps[0] + gaps[1] + 2);
}

// handOver() gives queued calls to the worker, which runs them without anyone waiting.
TEST(HandOver, HandOverStartsQueuedCallsOnTheWorker) {
  std::vector<std::shared_ptr<Communicator>> comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(world(2, 1000000), comms);
  runUnwaited(comms, true);
}

// A collective left queued while the caller moves on to point-to-point is handed to the
// worker: rank 0 issues an allreduce, then waits on a receive that rank 1 sends only after the
// allreduce, which rank 1 waits on.
TEST(HandOver, PointToPointAfterAQueuedCallDoesNotWaitForIt) {
  std::vector<std::shared_ptr<Communicator>> comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(world(2, 1000000), comms);
  float v0 = 1, v1 = 2, got = 0, sent = 42;
  std::thread rank1([&] {
    auto reduce = comms[1]->allreduce(&v1, 1, DataType::kFloat32, ReduceOp::kSum);
    ASSERT_TRUE(reduce->wait(Deadline::after(std::chrono::seconds(30))).isOk());
    auto send = comms[1]->send(&sent, 1, DataType::kFloat32, 0, 7);
    EXPECT_TRUE(send->wait(Deadline::after(std::chrono::seconds(30))).isOk());
  });
  auto reduce = comms[0]->allreduce(&v0, 1, DataType::kFloat32, ReduceOp::kSum);
  auto recv = comms[0]->recv(&got, 1, DataType::kFloat32, 1, 7);
  EXPECT_TRUE(recv->wait(Deadline::after(std::chrono::seconds(30))).isOk());
  rank1.join();
  EXPECT_TRUE(reduce->wait(Deadline::after(std::chrono::seconds(30))).isOk());
  EXPECT_EQ(got, 42.0f);
  EXPECT_EQ(v0, 3.0f);
  EXPECT_EQ(v1, 3.0f);
}

// Waiting on the last of several queued calls first neither runs it out of turn nor hangs.
TEST(HandOver, CallsWaitedOutOfOrderKeepTheirOrder) {
  std::vector<std::shared_ptr<Communicator>> comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(world(2, -1), comms);
  constexpr int kCalls = 4;
  std::vector<std::vector<float>> value(2, std::vector<float>(kCalls));
  std::vector<std::thread> ranks;
  std::vector<std::vector<Status>> st(2, std::vector<Status>(kCalls));
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      std::vector<std::shared_ptr<Task>> tasks;
      for (int k = 0; k < kCalls; ++k) {
        value[r][k] = static_cast<float>(k * 10 + r);
        // Alternating ops: a call run out of turn would meet a different call on the peer.
        tasks.push_back(k % 2 == 0
                            ? comms[r]->allreduce(&value[r][k], 1, DataType::kFloat32,
                                                  ReduceOp::kSum)
                            : comms[r]->broadcast(&value[r][k], 1, DataType::kFloat32, 1));
      }
      for (int k = kCalls - 1; k >= 0; --k) {
        st[r][k] = tasks[k]->wait(Deadline::after(std::chrono::seconds(30)));
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 2; ++r) {
    for (int k = 0; k < kCalls; ++k) {
      EXPECT_TRUE(st[r][k].isOk()) << st[r][k].toString();
      const float want = k % 2 == 0 ? static_cast<float>(2 * k * 10 + 1) : k * 10.0f + 1;
      EXPECT_EQ(value[r][k], want) << "rank " << r << " call " << k;
    }
  }
}

double processCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Threads poll only while calls are made (common/spin.h): a communicator that has gone idle
// sleeps. A thread left polling would use a whole core here, against the few per cent that
// wake-ups to check on peers cost.
TEST(HandOver, AnIdleCommunicatorDoesNotSpin) {
  for (const char* intra : {"shm", "tcp"}) {
    SCOPED_TRACE(intra);
    std::vector<std::shared_ptr<Communicator>> comms;
    NANOCCL_MAKE_WORLD_OR_SKIP(world(2, -1, intra), comms);
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r) {
      ranks.emplace_back([&, r] {
        float v = 1;
        for (int k = 0; k < 200; ++k) {
          ASSERT_TRUE(comms[r]->allreduce(&v, 1, DataType::kFloat32, ReduceOp::kSum)
                          ->wait(Deadline::after(std::chrono::seconds(30)))
                          .isOk());
        }
      });
    }
    for (auto& t : ranks) t.join();
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // past every linger
    const double cpu0 = processCpuSeconds();
    const auto wall0 = Clock::now();
    std::this_thread::sleep_for(std::chrono::seconds(1));
    const double cpu = processCpuSeconds() - cpu0;
    const double wall = std::chrono::duration<double>(Clock::now() - wall0).count();
    EXPECT_LT(cpu / wall, 0.10) << "idle communicators used " << 100 * cpu / wall
                                << "% of a core";
    std::printf("[ %s ] idle: %.2f%% of a core over %.1f s (2 ranks)\n", intra,
                100 * cpu / wall, wall);
  }
}

}  // namespace
}  // namespace nanoccl
