// The board rows (collectives/board.cc): small calls of a one-node communicator in one round
// on shared memory. Ranks as threads on one emulated node; the shm transport's board is the
// same code whether its ranks are threads or processes (tests/transports/shm_transport_test.cc
// kills a process mid-round). Results, that the board (not messages) carried the call, and
// every way the ranks can disagree or fail: an error on every rank, never a hang.
#include <algorithm>
#include <numeric>

#include "tests/collectives/test_util.h"

namespace nanoccl::colltest {
namespace {

using Comms = std::vector<std::shared_ptr<Communicator>>;

bool shmBuiltIn() {
  for (const TransportInfo& t : builtInTransports()) {
    if (t.name == "shm") return true;
  }
  return false;
}

WorldOptions oneNode(int size, const std::string& algo = "auto") {
  WorldOptions o;
  o.size = size;
  o.algo = algo;
  o.nodeIds.assign(static_cast<size_t>(size), "board-test-node");
  return o;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// An allreduce of one float on a world of 4 reaches every peer of every rank in one round:
// recursive doubling would have rank 0 talk to ranks 1 and 2 only.
TEST(Board, ASmallAllreduceIsOneRoundWithEveryPeer) {
  if (!shmBuiltIn()) GTEST_SKIP() << "no shm in this build";
  Comms comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(oneNode(4), comms);
  std::vector<float> v = {1, 2, 3, 4};
  std::vector<std::shared_ptr<Task>> tasks;
  for (int r = 0; r < 4; ++r) {
    tasks.push_back(comms[r]->allreduce(&v[r], 1, DataType::kFloat32, ReduceOp::kSum));
  }
  expectAllOk(tasks);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(v[r], 10.0f) << "rank " << r;
  for (int r = 0; r < 4; ++r) {
    const CommStats st = comms[r]->stats();
    for (int p = 0; p < 4; ++p) {
      if (p == r) continue;
      EXPECT_EQ(st.perPeer[p].bytesSent, 4u) << "rank " << r << " to " << p;
      EXPECT_EQ(st.perPeer[p].bytesReceived, 4u) << "rank " << r << " from " << p;
    }
    EXPECT_EQ(st.intraNodeBytesSent, 12u);
  }
}

// Many rounds back to back (the two slots are reused every other round), with values that
// change every round, and sizes up to the board's capacity and one element past it (which
// runs with messages), mixed with broadcasts from every root and barriers.
TEST(Board, RoundsBackToBackKeepEveryResult) {
  if (!shmBuiltIn()) GTEST_SKIP() << "no shm in this build";
  constexpr int n = 3;
  Comms comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(oneNode(n), comms);
  const size_t full = kBoardMessageBytes / sizeof(int32_t);
  const std::vector<size_t> counts = {1, 7, 1000, full, full + 1};
  for (int round = 0; round < 60; ++round) {
    const size_t count = counts[static_cast<size_t>(round) % counts.size()];
    std::vector<std::vector<int32_t>> b(n, std::vector<int32_t>(count));
    std::vector<std::vector<int32_t>> bc(n, std::vector<int32_t>(count, -1));
    const int root = round % n;
    for (size_t i = 0; i < count; ++i) bc[root][i] = round * 7 + static_cast<int32_t>(i);
    std::vector<std::shared_ptr<Task>> tasks;
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < count; ++i) b[r][i] = round * 100 + r + static_cast<int32_t>(i % 3);
      tasks.push_back(comms[r]->allreduce(b[r].data(), count, DataType::kInt32, ReduceOp::kSum));
      tasks.push_back(comms[r]->broadcast(bc[r].data(), count, DataType::kInt32, root));
      tasks.push_back(comms[r]->barrier());
    }
    expectAllOk(tasks);
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < count; i += 1 + count / 50) {
        ASSERT_EQ(b[r][i], n * (round * 100 + static_cast<int32_t>(i % 3)) + 3)
            << "round " << round << " rank " << r << " element " << i;
      }
      ASSERT_TRUE(bc[r] == bc[root]) << "round " << round << " rank " << r;
    }
  }
}

// Forcing the board on a call it cannot hold is an error of that call that says why.
TEST(Board, ForcedOnALargeCallSaysWhy) {
  if (!shmBuiltIn()) GTEST_SKIP() << "no shm in this build";
  Comms comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(oneNode(2, "board"), comms);
  std::vector<std::vector<float>> b(2, std::vector<float>(kBoardMessageBytes));
  std::vector<std::shared_ptr<Task>> tasks;
  for (int r = 0; r < 2; ++r) {
    tasks.push_back(
        comms[r]->allreduce(b[r].data(), b[r].size(), DataType::kFloat32, ReduceOp::kSum));
  }
  for (const Status& st : waitAll(tasks)) {
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.toString();
    EXPECT_TRUE(contains(st.message(), "the board holds")) << st.toString();
  }
}

// Without shm inside the node (NANOCCL_INTRA_TRANSPORT=tcp) the board rows run the next row's
// algorithm, on every rank alike.
TEST(Board, WithoutShmTheNextAlgorithmRuns) {
  WorldOptions o = oneNode(3, "board");
  o.intraTransport = "tcp";
  Comms comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(o, comms);
  std::vector<double> v = {1.5, 2.5, 3.5};
  std::vector<int64_t> x = {0, 0, 99};
  std::vector<std::shared_ptr<Task>> tasks;
  for (int r = 0; r < 3; ++r) {
    tasks.push_back(comms[r]->allreduce(&v[r], 1, DataType::kFloat64, ReduceOp::kMax));
    tasks.push_back(comms[r]->broadcast(&x[r], 1, DataType::kInt64, 2));
    tasks.push_back(comms[r]->barrier());
  }
  expectAllOk(tasks);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(v[r], 3.5);
    EXPECT_EQ(x[r], 99);
  }
}

// Runs one allreduce per rank with rank r's count counts[r] (floats), on a world of one node
// with a short timeout; returns each rank's status.
std::vector<Status> disagree(const std::vector<size_t>& counts, bool broadcastRoots = false) {
  const int n = static_cast<int>(counts.size());
  WorldOptions o = oneNode(n);
  o.timeout = std::chrono::milliseconds(5000);
  Comms comms;
  const Status made = makeWorld(o, &comms);
  EXPECT_TRUE(made.isOk()) << made.toString();
  if (!made.isOk()) return {};
  std::vector<std::vector<float>> b(n);
  std::vector<std::shared_ptr<Task>> tasks;
  for (int r = 0; r < n; ++r) {
    b[r].assign(counts[r], 1.0f);
    tasks.push_back(broadcastRoots
                        ? comms[r]->broadcast(b[r].data(), counts[r], DataType::kFloat32, r)
                        : comms[r]->allreduce(b[r].data(), counts[r], DataType::kFloat32,
                                              ReduceOp::kSum));
  }
  return waitAll(tasks, std::chrono::seconds(30));
}

// Ranks that disagree fail on every rank, each naming both calls, well before the timeout: a
// mismatch where the rank saw the other call on the board, or the error of a peer that saw it
// where that peer's failure reached the rank first (the ranks here are threads of one process).
TEST(Board, DifferentCountsFailEveryRankNamingBothCalls) {
  if (!shmBuiltIn()) GTEST_SKIP() << "no shm in this build";
  const auto start = std::chrono::steady_clock::now();
  const std::vector<Status> st = disagree({4, 8, 8, 8});
  ASSERT_EQ(st.size(), 4u);
  int mismatches = 0;
  for (int r = 0; r < 4; ++r) {
    EXPECT_TRUE(st[r].code() == StatusCode::kMismatch || st[r].code() == StatusCode::kPeerError)
        << "rank " << r << ": " << st[r].toString();
    mismatches += st[r].code() == StatusCode::kMismatch ? 1 : 0;
    EXPECT_TRUE(contains(st[r].message(), "x 4") && contains(st[r].message(), "x 8"))
        << st[r].toString();
  }
  EXPECT_GE(mismatches, 1);  // someone saw both calls itself
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(4));
}

TEST(Board, DifferentRootsFailEveryRank) {
  if (!shmBuiltIn()) GTEST_SKIP() << "no shm in this build";
  const std::vector<Status> st = disagree({16, 16}, /*broadcastRoots=*/true);
  ASSERT_EQ(st.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(st[r].code(), StatusCode::kMismatch) << st[r].toString();
    EXPECT_TRUE(contains(st[r].message(), "root 0") && contains(st[r].message(), "root 1"))
        << st[r].toString();
  }
}

// One rank's call fits the board, the others' do not (they run the ring, with messages): the
// board rank sees its peers' messages of that call, and every rank fails before the timeout.
TEST(Board, ARankOnTheBoardAndOthersOnMessagesFailEveryRank) {
  if (!shmBuiltIn()) GTEST_SKIP() << "no shm in this build";
  const size_t large = 4 * kBoardMessageBytes / sizeof(float);
  const auto start = std::chrono::steady_clock::now();
  const std::vector<Status> st = disagree({8, large, large});
  ASSERT_EQ(st.size(), 3u);
  bool named = false;
  for (int r = 0; r < 3; ++r) {
    EXPECT_FALSE(st[r].isOk()) << "rank " << r;
    EXPECT_NE(st[r].code(), StatusCode::kTimeout) << "rank " << r << ": " << st[r].toString();
    named = named || contains(st[r].message(), "with messages");
  }
  EXPECT_TRUE(named);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(4));
}

// A rank that never makes the call: the others time out naming it.
TEST(Board, ARankThatNeverCallsTimesOutNamingIt) {
  if (!shmBuiltIn()) GTEST_SKIP() << "no shm in this build";
  WorldOptions o = oneNode(3);
  o.timeout = std::chrono::milliseconds(300);
  Comms comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(o, comms);
  std::vector<std::shared_ptr<Task>> tasks;
  for (int r = 0; r < 2; ++r) tasks.push_back(comms[r]->barrier());
  int timeouts = 0;
  for (const Status& st : waitAll(tasks)) {
    // Its own timeout, or the first rank's failure quoting it where that came first.
    EXPECT_TRUE(st.code() == StatusCode::kTimeout || st.code() == StatusCode::kPeerError)
        << st.toString();
    timeouts += st.code() == StatusCode::kTimeout ? 1 : 0;
    EXPECT_TRUE(contains(st.message(), "rank(s) 2 did not make the call #1")) << st.toString();
  }
  EXPECT_GE(timeouts, 1);
}

// A rank whose communicator is destroyed mid-round (it will never publish): its peers fail
// with the reason, not a timeout.
TEST(Board, APeerDestroyedWhileOthersWaitFailsThem) {
  if (!shmBuiltIn()) GTEST_SKIP() << "no shm in this build";
  WorldOptions o = oneNode(3);
  o.timeout = std::chrono::milliseconds(20000);
  Comms comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(o, comms);
  int32_t a = 1, b = 2;
  auto t0 = comms[0]->allreduce(&a, 1, DataType::kInt32, ReduceOp::kSum);
  auto t1 = comms[1]->allreduce(&b, 1, DataType::kInt32, ReduceOp::kSum);
  // Rank 0 and 1 are waiting (or about to); rank 2 leaves without calling.
  comms[2].reset();
  const auto start = std::chrono::steady_clock::now();
  for (const Status& st : waitAll({t0, t1})) {
    EXPECT_EQ(st.code(), StatusCode::kPeerError) << st.toString();
    EXPECT_TRUE(contains(st.message(), "rank 2")) << st.toString();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

}  // namespace
}  // namespace nanoccl::colltest
