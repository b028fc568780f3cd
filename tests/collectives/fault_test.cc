// Bad input and faults: every case ends with a clear Status on every rank, never a hang.
#include <dirent.h>

#include <fstream>
#include <functional>
#include <map>
#include <mutex>

#include "tests/collectives/test_util.h"
#include "transports/request.h"

namespace nanoccl::colltest {
namespace {

using Call = std::function<std::shared_ptr<Task>(int rank, Communicator& comm)>;

std::vector<Status> runCalls(const std::vector<std::shared_ptr<Communicator>>& comms,
                             const Call& call) {
  std::vector<std::shared_ptr<Task>> tasks;
  for (size_t r = 0; r < comms.size(); ++r) tasks.push_back(call(static_cast<int>(r), *comms[r]));
  // Well past the communicators' timeout: a task still running then is a hang.
  return waitAll(tasks, std::chrono::seconds(40));
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Every rank failed (not by the test's own wait running out), and each message names both
// ranks of the disagreement.
void expectAllFailNamingBoth(const std::vector<Status>& st, int a, int b) {
  for (size_t r = 0; r < st.size(); ++r) {
    EXPECT_FALSE(st[r].isOk()) << "rank " << r << " succeeded";
    EXPECT_FALSE(contains(st[r].message(), "caller's deadline")) << "rank " << r << " hung";
    EXPECT_TRUE(contains(st[r].message(), "rank " + std::to_string(a)) &&
                contains(st[r].message(), "rank " + std::to_string(b)))
        << "rank " << r << ": " << st[r].toString();
  }
}

void expectSomeMismatch(const std::vector<Status>& st) {
  bool any = false;
  for (const Status& s : st) any = any || s.code() == StatusCode::kMismatch;
  EXPECT_TRUE(any) << "no rank reported kMismatch; rank 0: " << st[0].toString();
}

WorldOptions worldOf(int size, int timeoutMs = 5000, const std::string& algo = "auto") {
  WorldOptions o;
  o.size = size;
  o.timeout = std::chrono::milliseconds(timeoutMs);
  o.algo = algo;
  return o;
}

// Buffers that outlive the tasks (a failed call may still be unwinding when the test ends
// with the communicators, which own the buffers until then).
struct Buffers {
  std::vector<std::vector<char>> b;
  explicit Buffers(int n, size_t bytes = 64 * 1024) : b(n, std::vector<char>(bytes, 1)) {}
  void* operator[](int r) { return b[r].data(); }
};

TEST(Mismatch, Count) {
  std::vector<std::shared_ptr<Communicator>> comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(worldOf(2), comms);
  Buffers buf(2);
  const auto st = runCalls(comms, [&](int r, Communicator& c) {
    return c.allreduce(buf[r], r == 0 ? 1024 : 1030, DataType::kFloat32, ReduceOp::kSum);
  });
  expectAllFailNamingBoth(st, 0, 1);
  expectSomeMismatch(st);
  EXPECT_TRUE(contains(st[0].toString() + st[1].toString(), "1030"));
}

TEST(Mismatch, DataType) {
  std::vector<std::shared_ptr<Communicator>> comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(worldOf(2), comms);
  Buffers buf(2);
  const auto st = runCalls(comms, [&](int r, Communicator& c) {
    return c.allreduce(buf[r], 1024, r == 0 ? DataType::kFloat32 : DataType::kInt32,
                       ReduceOp::kSum);
  });
  expectAllFailNamingBoth(st, 0, 1);
  expectSomeMismatch(st);
}

TEST(Mismatch, ReductionOp) {
  std::vector<std::shared_ptr<Communicator>> comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(worldOf(2), comms);
  Buffers buf(2);
  const auto st = runCalls(comms, [&](int r, Communicator& c) {
    return c.allreduce(buf[r], 1024, DataType::kFloat32, r == 0 ? ReduceOp::kSum : ReduceOp::kMax);
  });
  expectAllFailNamingBoth(st, 0, 1);
  expectSomeMismatch(st);
}

// Large messages take the ring: the mismatch is seen there too.
TEST(Mismatch, CountOnTheRing) {
  std::vector<std::shared_ptr<Communicator>> comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(worldOf(3), comms);
  Buffers buf(3, 4 << 20);
  const auto st = runCalls(comms, [&](int r, Communicator& c) {
    return c.allreduce(buf[r], r == 2 ? 500000 : 400000, DataType::kFloat32, ReduceOp::kSum);
  });
  for (size_t r = 0; r < st.size(); ++r) EXPECT_FALSE(st[r].isOk()) << "rank " << r;
  expectSomeMismatch(st);
  EXPECT_TRUE(contains(st[2].message(), "rank 2")) << st[2].toString();
}

// Each rooted op with the ranks disagreeing about the root. Where both ranks only send in
// their own view, the confirmation messages make the disagreement visible.
struct RootCase {
  const char* name;
  std::string algo;
  Call call;
};

class MismatchRoot : public ::testing::TestWithParam<int> {};

std::vector<RootCase> rootCases(Buffers& buf) {
  std::vector<size_t> two = {16, 16};
  return {
      {"broadcast_tree", "tree",
       [&](int r, Communicator& c) { return c.broadcast(buf[r], 32, DataType::kFloat32, r); }},
      {"broadcast_ring", "ring",
       [&](int r, Communicator& c) { return c.broadcast(buf[r], 32, DataType::kFloat32, r); }},
      {"reduce_tree", "tree",
       [&](int r, Communicator& c) {
         return c.reduce(buf[r], 32, DataType::kFloat32, ReduceOp::kSum, 1 - r);
       }},
      {"reduce_ring", "ring",
       [&](int r, Communicator& c) {
         return c.reduce(buf[r], 32, DataType::kFloat32, ReduceOp::kSum, r);
       }},
      {"gather", "auto",
       [&, two](int r, Communicator& c) {
         return c.gather(buf[r], 16, static_cast<char*>(buf[r]) + 4096, two, DataType::kFloat32,
                         1 - r);
       }},
      {"scatter", "auto",
       [&, two](int r, Communicator& c) {
         return c.scatter(buf[r], two, static_cast<char*>(buf[r]) + 4096, 16, DataType::kFloat32,
                          r);
       }},
  };
}

TEST_P(MismatchRoot, EveryRankFailsNamingBoth) {
  Buffers buf(2);
  const RootCase rc = rootCases(buf)[GetParam()];
  SCOPED_TRACE(rc.name);
  std::vector<std::shared_ptr<Communicator>> comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(worldOf(2, 5000, rc.algo), comms);
  const auto st = runCalls(comms, rc.call);
  expectAllFailNamingBoth(st, 0, 1);
  expectSomeMismatch(st);
}

INSTANTIATE_TEST_SUITE_P(Ops, MismatchRoot, ::testing::Range(0, 6), [](const auto& info) {
  Buffers b(1);
  return std::string(rootCases(b)[info.param].name);
});

// Different collectives at the same place in the sequence: at worst a timeout, on every rank.
TEST(Mismatch, DifferentCollectives) {
  std::vector<std::shared_ptr<Communicator>> comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(worldOf(2, 3000), comms);
  Buffers buf(2);
  const auto st = runCalls(comms, [&](int r, Communicator& c) {
    if (r == 0) return c.allreduce(buf[r], 256, DataType::kFloat32, ReduceOp::kSum);
    return c.broadcast(buf[r], 256, DataType::kFloat32, 0);
  });
  expectAllFailNamingBoth(st, 0, 1);
}

// After a failure the communicator stays failed: later calls fail at once with the first
// error's code and text.
TEST(Mismatch, CommunicatorStaysFailed) {
  std::vector<std::shared_ptr<Communicator>> comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(worldOf(2), comms);
  Buffers buf(2);
  const auto first = runCalls(comms, [&](int r, Communicator& c) {
    return c.allreduce(buf[r], r == 0 ? 8 : 9, DataType::kInt32, ReduceOp::kSum);
  });
  const auto later = runCalls(comms, [&](int r, Communicator& c) {
    return c.allreduce(buf[r], 8, DataType::kInt32, ReduceOp::kSum);
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_FALSE(first[r].isOk());
    EXPECT_EQ(later[r].code(), first[r].code()) << later[r].toString();
    EXPECT_TRUE(contains(later[r].message(), "failed earlier")) << later[r].toString();
    EXPECT_TRUE(contains(later[r].message(), "allreduce #2")) << later[r].toString();
  }
}

// Rank 2 skips the allreduce and goes straight to the barrier.
TEST(Order, SkippedCall) {
  std::vector<std::shared_ptr<Communicator>> comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(worldOf(3, 3000), comms);
  Buffers buf(3);
  std::vector<std::shared_ptr<Task>> tasks;
  for (int r = 0; r < 2; ++r) {
    tasks.push_back(comms[r]->allreduce(buf[r], 1023, DataType::kFloat32, ReduceOp::kSum));
  }
  for (int r = 0; r < 3; ++r) tasks.push_back(comms[r]->barrier());
  const auto st = waitAll(tasks, std::chrono::seconds(40));
  for (size_t i = 0; i < st.size(); ++i) {
    EXPECT_FALSE(st[i].isOk()) << "task " << i << " succeeded";
    EXPECT_FALSE(contains(st[i].message(), "caller's deadline")) << "task " << i << " hung";
  }
}

// A rank that never makes the call: the others time out; its own next call fails too.
TEST(Order, MissingRankTimesOut) {
  std::vector<std::shared_ptr<Communicator>> comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(worldOf(3, 1500), comms);
  Buffers buf(3, 1 << 20);
  std::vector<std::shared_ptr<Task>> tasks;
  for (int r = 0; r < 2; ++r) {
    tasks.push_back(comms[r]->allreduce(buf[r], 100000, DataType::kFloat32, ReduceOp::kSum));
  }
  const auto st = waitAll(tasks, std::chrono::seconds(40));
  bool timedOut = false;
  for (int r = 0; r < 2; ++r) {
    EXPECT_FALSE(st[r].isOk()) << "rank " << r;
    EXPECT_FALSE(contains(st[r].message(), "caller's deadline")) << "rank " << r << " hung";
    timedOut = timedOut || st[r].code() == StatusCode::kTimeout;
  }
  EXPECT_TRUE(timedOut) << st[0].toString();
  // The waiting ranks aborted, which rank 2 has heard by now or will within its timeout.
  const Status late = comms[2]->barrier()->wait(Deadline::after(std::chrono::seconds(40)));
  EXPECT_FALSE(late.isOk());
}

// A call's deadline counts from its issue, not from when it starts running: rank 0 issues A
// and B at once; rank 1 joins A late (0.5 T) and issues B at 1.25 T. Rank 0's B, queued
// behind A until 0.5 T, fails with kTimeout at T (with a deadline counted from its start at
// 0.5 T it would have run until 1.5 T and succeeded).
TEST(Order, ADeadlineCountsFromTheIssueNotFromTheStart) {
  constexpr int kTimeoutMs = 3000;
  std::vector<std::shared_ptr<Communicator>> comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(worldOf(2, kTimeoutMs), comms);
  float a0 = 1, a1 = 2, b0 = 1, b1 = 2;
  const auto issued = Clock::now();
  auto tA0 = comms[0]->allreduce(&a0, 1, DataType::kFloat32, ReduceOp::kSum);
  auto tB0 = comms[0]->allreduce(&b0, 1, DataType::kFloat32, ReduceOp::kSum);
  std::this_thread::sleep_until(issued + std::chrono::milliseconds(kTimeoutMs / 2));
  auto tA1 = comms[1]->allreduce(&a1, 1, DataType::kFloat32, ReduceOp::kSum);
  ASSERT_TRUE(tA1->wait(Deadline::after(std::chrono::seconds(40))).isOk());
  ASSERT_TRUE(tA0->wait(Deadline::after(std::chrono::seconds(40))).isOk());
  EXPECT_EQ(a0, 3.0f);
  std::this_thread::sleep_until(issued + std::chrono::milliseconds(kTimeoutMs * 5 / 4));
  auto tB1 = comms[1]->allreduce(&b1, 1, DataType::kFloat32, ReduceOp::kSum);
  const auto st = waitAll({tB0, tB1}, std::chrono::seconds(40));
  EXPECT_EQ(st[0].code(), StatusCode::kTimeout) << st[0].toString();
  EXPECT_FALSE(st[1].isOk()) << "rank 1's B cannot complete without rank 0's";
  for (const Status& s : st) EXPECT_FALSE(contains(s.message(), "caller's deadline")) << s.toString();
}

// A failed point-to-point call fails the whole communicator, as a failed collective does: on
// 2 nodes x 2 ranks, rank 0's receive from rank 3 fails when rank 3 goes away, and rank 1,
// waiting for rank 0 in the intra-node stage of an allreduce that rank 0 never joins (its
// program stopped at the error), hears it then instead of timing out. Seen in bench/soak.py.
TEST(PeerDeath, AFailedPointToPointCallFailsTheCommunicator) {
  WorldOptions o = worldOf(4, 20000, "hierarchical");
  o.nodeIds = {"node-a", "node-a", "node-b", "node-b"};
  std::vector<std::shared_ptr<Communicator>> comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(o, comms);
  std::vector<float> in(1 << 16), mine(1 << 16, 1.0f);
  auto recv = comms[0]->recv(in.data(), in.size(), DataType::kFloat32, 3, 0);
  auto reduce = comms[1]->allreduce(mine.data(), mine.size(), DataType::kFloat32, ReduceOp::kSum);
  // Rank 1 is in its intra-node stage once it has sent something there.
  const Deadline until = Deadline::after(std::chrono::seconds(30));
  while (bytesSent(*comms[1]) == 0 && !until.expired()) std::this_thread::yield();
  ASSERT_GT(bytesSent(*comms[1]), 0u);
  comms[3].reset();                         // rank 3 goes away
  const auto st = waitAll({recv, reduce}, std::chrono::seconds(40));
  EXPECT_EQ(st[0].code(), StatusCode::kPeerError) << st[0].toString();
  EXPECT_NE(st[1].code(), StatusCode::kTimeout) << st[1].toString();
  EXPECT_FALSE(st[1].isOk());
  EXPECT_FALSE(contains(st[1].message(), "caller's deadline")) << st[1].toString();
}

// A peer whose communicator is destroyed (its sockets close) while the others wait for it.
TEST(PeerDeath, DestroyedWhileOthersWait) {
  std::vector<std::shared_ptr<Communicator>> comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(worldOf(3, 20000), comms);
  Buffers buf(3, 4 << 20);
  std::vector<std::shared_ptr<Task>> tasks;
  for (int r = 0; r < 2; ++r) {
    tasks.push_back(comms[r]->allreduce(buf[r], 1 << 20, DataType::kFloat32, ReduceOp::kSum));
  }
  ASSERT_TRUE(waitUntilSending(comms, 2)) << "the allreduce never started";
  comms[2].reset();
  const auto st = waitAll(tasks, std::chrono::seconds(40));
  for (int r = 0; r < 2; ++r) {
    EXPECT_FALSE(st[r].isOk()) << "rank " << r;
    // Well before the 20 s timeout: the broken connection is what ended the wait.
    EXPECT_NE(st[r].code(), StatusCode::kTimeout) << st[r].toString();
    EXPECT_TRUE(contains(st[r].message(), "rank 2")) << st[r].toString();
  }
}

// A peer that aborts in the middle of a collective it takes part in.
TEST(PeerDeath, AbortMidCollective) {
  std::vector<std::shared_ptr<Communicator>> comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(worldOf(3, 20000), comms);
  Buffers buf(3, 4 << 20);
  std::vector<std::shared_ptr<Task>> tasks;
  // Ranks 0 and 1 start; rank 2 aborts instead of joining.
  for (int r = 0; r < 2; ++r) {
    tasks.push_back(comms[r]->allreduce(buf[r], 1 << 20, DataType::kFloat32, ReduceOp::kSum));
  }
  ASSERT_TRUE(waitUntilSending(comms, 2)) << "the allreduce never started";
  comms[2]->abort(abortedError("test abort by rank 2"));
  tasks.push_back(comms[2]->allreduce(buf[2], 1 << 20, DataType::kFloat32, ReduceOp::kSum));
  const auto st = waitAll(tasks, std::chrono::seconds(40));
  for (size_t r = 0; r < st.size(); ++r) {
    EXPECT_FALSE(st[r].isOk()) << "rank " << r;
    EXPECT_NE(st[r].code(), StatusCode::kTimeout) << st[r].toString();
    EXPECT_TRUE(contains(st[r].message(), "test abort by rank 2")) << st[r].toString();
  }
}

// Destroying a communicator with calls queued fails them with kAborted.
TEST(PeerDeath, DestroyWithPendingCalls) {
  std::vector<std::shared_ptr<Communicator>> comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(worldOf(2, 20000), comms);
  Buffers buf(2);
  auto t1 = comms[0]->allreduce(buf[0], 100, DataType::kFloat32, ReduceOp::kSum);
  auto t2 = comms[0]->allreduce(buf[0], 100, DataType::kFloat32, ReduceOp::kSum);
  auto rx = comms[0]->recv(buf[0], 4, DataType::kInt32, 1, 0);
  // t1 runs (it has sent to rank 1, which never calls), t2 and rx are still queued.
  ASSERT_TRUE(waitUntilSending(comms, 1)) << "the first allreduce never started";
  comms[0].reset();
  for (const auto& t : {t1, t2, rx}) {
    ASSERT_TRUE(t->test());
    EXPECT_FALSE(t->status().isOk());
    EXPECT_TRUE(contains(t->status().message(), "destroyed")) << t->status().toString();
  }
  // The survivor learns of it by its second call: its first may still complete from what t1
  // had sent before rank 0 went (whether it does is a race with the abort notice), but t2
  // never sent anything.
  const Status first = comms[1]
                           ->allreduce(buf[1], 100, DataType::kFloat32, ReduceOp::kSum)
                           ->wait(Deadline::after(std::chrono::seconds(40)));
  const Status second = comms[1]
                            ->allreduce(buf[1], 100, DataType::kFloat32, ReduceOp::kSum)
                            ->wait(Deadline::after(std::chrono::seconds(40)));
  EXPECT_FALSE(second.isOk());
  EXPECT_NE(second.code(), StatusCode::kTimeout) << second.toString();
  if (!first.isOk()) {
    EXPECT_NE(first.code(), StatusCode::kTimeout) << first.toString();
  }
}

// A receive that no send ever matches fails with kTimeout within the timeout.
TEST(PointToPoint, ReceiveThatNeverMatchesTimesOut) {
  std::vector<std::shared_ptr<Communicator>> comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(worldOf(2, 1000), comms);
  Buffers buf(2);
  const Status s = comms[0]
                       ->recv(buf[0], 16, DataType::kFloat32, 1, 5)
                       ->wait(Deadline::after(std::chrono::seconds(40)));
  EXPECT_EQ(s.code(), StatusCode::kTimeout) << s.toString();
  EXPECT_TRUE(contains(s.message(), "rank 0")) << s.toString();
  EXPECT_TRUE(contains(s.message(), "rank 1")) << s.toString();
}

// Argument errors fail only their own call, on the calling rank, and leave the communicator
// working.
TEST(InvalidArgument, FailsTheCallOnly) {
  std::vector<std::shared_ptr<Communicator>> comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(worldOf(2), comms);
  Buffers buf(2);
  Communicator& c = *comms[0];
  std::vector<std::pair<std::string, std::shared_ptr<Task>>> bad = {
      {"reduce root out of range", c.reduce(buf[0], 4, DataType::kFloat32, ReduceOp::kSum, 2)},
      {"broadcast negative root", c.broadcast(buf[0], 4, DataType::kFloat32, -1)},
      {"allgather counts length", c.allgather(buf[0], 4, buf[1], {4}, DataType::kFloat32)},
      {"allgather own count", c.allgather(buf[0], 4, buf[1], {5, 4}, DataType::kFloat32)},
      {"reduce_scatter counts length",
       c.reduceScatter(buf[0], buf[1], {1, 2, 3}, DataType::kFloat32, ReduceOp::kSum)},
      {"alltoall counts length", c.alltoall(buf[0], {1}, buf[1], {1, 1}, DataType::kFloat32)},
      {"gather root counts", c.gather(buf[0], 4, buf[1], {3, 4}, DataType::kFloat32, 0)},
      {"scatter root counts", c.scatter(buf[0], {1}, buf[1], 1, DataType::kFloat32, 0)},
      {"bxor on float32", c.allreduce(buf[0], 4, DataType::kFloat32, ReduceOp::kBxor)},
      {"max on complex64", c.allreduce(buf[0], 4, DataType::kComplex64, ReduceOp::kMax)},
      {"null buffer", c.allreduce(nullptr, 4, DataType::kFloat32, ReduceOp::kSum)},
      {"send to self", c.send(buf[0], 4, DataType::kFloat32, 0, 0)},
      {"recv from a rank that does not exist", c.recv(buf[0], 4, DataType::kFloat32, 7, 0)},
  };
  for (const auto& [what, task] : bad) {
    ASSERT_TRUE(task->test()) << what << ": not failed at once";
    EXPECT_EQ(task->status().code(), StatusCode::kInvalidArgument)
        << what << ": " << task->status().toString();
    EXPECT_TRUE(contains(task->status().message(), "rank 0")) << task->status().toString();
  }
  // Still usable, and still in step with rank 1 (no sequence number was used up).
  std::vector<int64_t> a(8, 2), b(8, 3);
  expectAllOk({comms[0]->allreduce(a.data(), 8, DataType::kInt64, ReduceOp::kSum),
               comms[1]->allreduce(b.data(), 8, DataType::kInt64, ReduceOp::kSum)});
  EXPECT_EQ(a[7], 5);
  EXPECT_EQ(b[0], 5);
}

// Refused where the communicator is created, on every rank, not at the first call.
TEST(InvalidArgument, UnknownAlgorithmListsValidNames) {
  const std::vector<Result<std::shared_ptr<Communicator>>> made =
      colltest::createEach(worldOf(2, 5000, "bogus"));
  for (int r = 0; r < 2; ++r) {
    ASSERT_FALSE(made[r].isOk()) << "rank " << r;
    const Status& s = made[r].status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.toString();
    EXPECT_TRUE(contains(s.message(), "bogus")) << s.toString();
    EXPECT_TRUE(contains(s.message(), "recursive_doubling")) << s.toString();
    EXPECT_TRUE(contains(s.message(), "ring")) << s.toString();
    EXPECT_TRUE(contains(s.message(), "rank " + std::to_string(r))) << s.toString();
  }
}

// A name that only some ops have applies to those; the others stay on auto.
TEST(InvalidArgument, ForcedNameAppliesWhereItExists) {
  std::vector<std::shared_ptr<Communicator>> comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(worldOf(2, 5000, "recursive_doubling"), comms);
  expectAllOk({comms[0]->barrier(), comms[1]->barrier()});
}

int threadCount() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}

// Threads named "nanoccl-<role>" (common/thread_name.h) of this process, by role.
std::map<std::string, int> nanocclThreads() {
  std::map<std::string, int> roles;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      std::ifstream f(std::string("/proc/self/task/") + e->d_name + "/comm");
      std::string name;
      if (std::getline(f, name) && name.rfind("nanoccl-", 0) == 0) ++roles[name.substr(8)];
    }
    closedir(d);
  }
  return roles;
}

// A transport whose sends, once `hold` is set, it keeps instead of sending: like a provider or
// a progress thread stuck with the caller's buffer. Its abort() aborts the real transport but
// cannot end them; release() at last reads each held buffer, as the stuck operation would,
// and completes it (under ASan a buffer freed early is then an error).
struct HeldSends {
  std::mutex mu;
  bool hold = false;
  std::vector<std::shared_ptr<BasicRequest>> held;

  size_t count() {
    std::lock_guard<std::mutex> lock(mu);
    return held.size();
  }
  void release() {
    std::vector<std::shared_ptr<BasicRequest>> out;
    {
      std::lock_guard<std::mutex> lock(mu);
      out.swap(held);
    }
    uint64_t sum = 0;
    for (const auto& r : out) {
      for (size_t i = 0; i < r->bytes; ++i) sum += static_cast<unsigned char>(r->buf[i]);
      r->complete(abortedError("released by the test"), -1);
    }
    EXPECT_GE(sum, 0u);
  }
};

class HoldingTransport : public Transport {
 public:
  HoldingTransport(std::unique_ptr<Transport> inner, std::shared_ptr<HeldSends> held)
      : inner_(std::move(inner)), held_(std::move(held)) {}
  Result<std::string> listen() override { return inner_->listen(); }
  Status connect(const std::vector<std::string>& a, const Deadline& d) override {
    return inner_->connect(a, d);
  }
  std::shared_ptr<Request> isend(int peer, const Envelope& env, const void* buf,
                                 size_t bytes) override {
    std::lock_guard<std::mutex> lock(held_->mu);
    if (!held_->hold) return inner_->isend(peer, env, buf, bytes);
    auto r = std::make_shared<BasicRequest>(true, peer, env,
                                            static_cast<char*>(const_cast<void*>(buf)), bytes);
    held_->held.push_back(r);
    return r;
  }
  std::shared_ptr<Request> irecv(int peer, const Envelope& env, void* buf,
                                 size_t bytes) override {
    return inner_->irecv(peer, env, buf, bytes);
  }
  void abort(const Status& why) override { inner_->abort(why); }  // the held sends stay
  std::vector<PeerCounters> counters() const override { return inner_->counters(); }
  std::string describe() const override { return "holding " + inner_->describe(); }

 private:
  std::unique_ptr<Transport> inner_;
  std::shared_ptr<HeldSends> held_;
};

// Two nodes with int8 between them: the held sends are then the encoded data in the call's
// scratch memory, which the communicator must keep.
WorldOptions holdingWorld(const std::shared_ptr<HeldSends>& held) {
  WorldOptions o = worldOf(2, 1500);
  o.nodeIds = {"node-a", "node-b"};
  o.compression = "int8";
  o.wrapTransport = [held](int rank, std::unique_ptr<Transport> t) -> std::unique_ptr<Transport> {
    if (rank != 0) return t;
    return std::make_unique<HoldingTransport>(std::move(t), held);
  };
  return o;
}

// A world whose rank 0 holds every send from now on (HoldingTransport). The test's buffers
// outlive the communicators, as Task::buffersStillInUse() asks.
class Abort : public ::testing::Test {
 protected:
  void SetUp() override {
    NANOCCL_MAKE_WORLD_OR_SKIP(holdingWorld(held), comms);
    std::lock_guard<std::mutex> lock(held->mu);
    held->hold = true;
  }
  std::shared_ptr<HeldSends> held = std::make_shared<HeldSends>();
  Buffers buf{2};
  std::vector<std::shared_ptr<Communicator>> comms;
};

// A failed call whose transfers the abort could not end: the Task says so, the communicator
// keeps the call's memory until it is destroyed, and the caller is told to keep its buffers.
TEST_F(Abort, TransfersItCannotEndKeepTheirBuffersUntilDestruction) {
  std::vector<std::shared_ptr<Task>> tasks;
  for (int r = 0; r < 2; ++r) {
    tasks.push_back(comms[r]->allreduce(buf[r], 16 * 1024, DataType::kFloat32, ReduceOp::kSum));
  }
  const auto st = waitAll(tasks, std::chrono::seconds(40));
  EXPECT_FALSE(st[0].isOk());
  EXPECT_FALSE(st[1].isOk());
  ASSERT_GT(held->count(), 0u) << "rank 0 sent nothing";
  EXPECT_TRUE(tasks[0]->buffersStillInUse());
  EXPECT_TRUE(contains(st[0].message(), "could not be stopped")) << st[0].toString();
  // What the caller hands over stays alive until the communicator's transports are gone.
  auto mine = std::make_shared<int>(7);
  const std::weak_ptr<int> watch = mine;
  tasks[0]->keepBuffers(std::move(mine));
  EXPECT_FALSE(watch.expired());
  EXPECT_EQ(comms[0]->stats().callsWithKeptBuffers, 1u);
  // Rank 1's transfers all ended with its abort: nothing is kept there.
  EXPECT_FALSE(tasks[1]->buffersStillInUse()) << st[1].toString();
  EXPECT_EQ(comms[1]->stats().callsWithKeptBuffers, 0u);

  // A point-to-point send that times out the same way is kept as well.
  auto p2p = comms[0]->send(buf[0], 1024, DataType::kFloat32, 1, 7);
  const Status ps = p2p->wait(Deadline::after(std::chrono::seconds(40)));
  EXPECT_FALSE(ps.isOk());
  // (The communicator failed already: a later call fails at once, with nothing in flight.)
  EXPECT_FALSE(p2p->buffersStillInUse()) << ps.toString();

  // The stuck operations finally read what they hold (the call's scratch memory included),
  // then the communicators go; the test's buffers outlive them, as the Task asked.
  held->release();
  EXPECT_FALSE(watch.expired());
  comms.clear();
  EXPECT_TRUE(watch.expired());  // released once the transports were destroyed
}

// The same for a point-to-point call that outlives its timeout.
TEST_F(Abort, APointToPointSendItCannotEndKeepsItsBuffer) {
  auto p2p = comms[0]->send(buf[0], 1024, DataType::kFloat32, 1, 7);
  const Status ps = p2p->wait(Deadline::after(std::chrono::seconds(40)));
  EXPECT_EQ(ps.code(), StatusCode::kTimeout) << ps.toString();
  EXPECT_TRUE(p2p->buffersStillInUse()) << ps.toString();
  EXPECT_TRUE(contains(ps.message(), "could not be stopped")) << ps.toString();
  EXPECT_EQ(comms[0]->stats().callsWithKeptBuffers, 1u);
  held->release();
  comms.clear();
}

// Destroying communicators, healthy or failed, leaves no thread behind.
TEST(Lifecycle, NoThreadsLeft) {
  const int before = threadCount();
  {
    std::vector<std::shared_ptr<Communicator>> comms;
    NANOCCL_MAKE_WORLD_OR_SKIP(worldOf(3), comms);
    // Every rank's threads carry nanoccl's names: a worker and a progress thread; the
    // watchdog comes with the first point-to-point call, on the ranks that make one.
    const auto count = [](const char* role) {
      const auto roles = nanocclThreads();
      return roles.count(role) ? roles.at(role) : 0;
    };
    EXPECT_EQ(count("worker"), 3);
    EXPECT_EQ(count("tcp"), 3);
    EXPECT_EQ(count("watch"), 0);
    Buffers buf(3);
    expectAllOk({comms[0]->send(buf[0], 10, DataType::kFloat32, 2, 0),
                 comms[2]->recv(buf[2], 10, DataType::kFloat32, 0, 0)});
    EXPECT_EQ(count("watch"), 2);
    runCalls(comms, [&](int r, Communicator& c) {
      return c.allreduce(buf[r], 1000, DataType::kFloat32, ReduceOp::kSum);
    });
    runCalls(comms, [&](int r, Communicator& c) {
      return c.allreduce(buf[r], r == 0 ? 10 : 11, DataType::kFloat32, ReduceOp::kSum);
    });
  }
  EXPECT_EQ(threadCount(), before);
  EXPECT_TRUE(nanocclThreads().empty());
}

}  // namespace
}  // namespace nanoccl::colltest

namespace nanoccl::colltest {
namespace {

// The last reference dropped inside a Task callback (on the communicator's own worker
// thread): no self-join, and the teardown still finishes and leaves no thread behind.
TEST(Lifecycle, DestroyedFromItsOwnCallback) {
  const int before = threadCount();
  {
    std::vector<std::shared_ptr<Communicator>> comms;
    NANOCCL_MAKE_WORLD_OR_SKIP(worldOf(2), comms);
    std::vector<float> a(64, 1.0f), b(64, 2.0f);
    auto* last = new std::shared_ptr<Communicator>(std::move(comms[0]));
    auto t0 = (*last)->allreduce(a.data(), a.size(), DataType::kFloat32, ReduceOp::kSum);
    std::atomic<bool> released{false};
    t0->onComplete([last, &released](const Status&) {
      delete last;
      released = true;
    });
    auto t1 = comms[1]->allreduce(b.data(), b.size(), DataType::kFloat32, ReduceOp::kSum);
    expectAllOk({t0, t1});
    for (int i = 0; i < 5000 && !released; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_TRUE(released.load());
    EXPECT_EQ(a[0], 3.0f);
  }
  for (int i = 0; i < 5000 && threadCount() != before; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(threadCount(), before);
}

}  // namespace
}  // namespace nanoccl::colltest
