// allreduce over engine x world size x count x dtype x reduction x algorithm.
#include "tests/collectives/test_util.h"

namespace nanoccl::colltest {
namespace {

class AllreduceTest : public ::testing::TestWithParam<Case> {};

TEST_P(AllreduceTest, MatchesReference) {
  const Case& c = GetParam();
  std::vector<std::shared_ptr<Communicator>> comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(worldFor(c), comms);
  const int n = c.size;
  for (const Combo& combo : combosFor(c)) {
    SCOPED_TRACE(comboName(combo));
    const DataType t = combo.dtype;
    const ReduceOp op = combo.op;
    std::vector<std::vector<char>> bufs;
    for (int r = 0; r < n; ++r) {
      bufs.push_back(makeBuffer(t, c.count, [&](size_t i) { return inputValue(t, op, r, i); }));
    }
    std::vector<std::shared_ptr<Task>> tasks;
    for (int r = 0; r < n; ++r) {
      tasks.push_back(comms[r]->allreduce(bufs[r].data(), c.count, t, op, kPremulFactor));
    }
    expectAllOk(tasks);
    std::vector<Value> want(c.count);
    for (size_t i = 0; i < c.count; ++i) {
      want[i] = referenceReduce(t, op, n, [&](int q) { return inputValue(t, op, q, i); });
    }
    for (int r = 0; r < n; ++r) {
      expectBuffer(
          t, bufs[r].data(), c.count, [&](size_t i) { return want[i]; },
          "rank " + std::to_string(r));
      // Every algorithm fixes the order of operands, so all ranks hold the same bits.
      EXPECT_EQ(0, std::memcmp(bufs[r].data(), bufs[0].data(), c.count * dataTypeSize(t)))
          << "rank " << r << " differs from rank 0";
    }
    if (::testing::Test::HasFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(Matrix, AllreduceTest,
                         ::testing::ValuesIn(standardCases({"ring", "recursive_doubling", "tree"},
                                                           kLargeCount)),
                         caseName);

// Several calls queued back to back from one thread run in call order with distinct
// sequence numbers, and the stats count their bytes.
TEST(AllreduceQueue, ManyCallsInFlight) {
  WorldOptions o;
  o.size = 3;
  std::vector<std::shared_ptr<Communicator>> comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(o, comms);
  constexpr int kCalls = 20;
  constexpr size_t kCount = 257;
  std::vector<std::vector<std::vector<int32_t>>> bufs(3, std::vector<std::vector<int32_t>>(kCalls));
  std::vector<std::shared_ptr<Task>> tasks;
  for (int k = 0; k < kCalls; ++k) {
    for (int r = 0; r < 3; ++r) {
      bufs[r][k].assign(kCount, r + k);
      tasks.push_back(
          comms[r]->allreduce(bufs[r][k].data(), kCount, DataType::kInt32, ReduceOp::kSum));
    }
  }
  expectAllOk(tasks);
  for (int r = 0; r < 3; ++r) {
    for (int k = 0; k < kCalls; ++k) {
      EXPECT_EQ(bufs[r][k][kCount - 1], 3 + 3 * k) << "rank " << r << " call " << k;
    }
    const CommStats st = comms[r]->stats();
    EXPECT_EQ(st.calls, static_cast<uint64_t>(kCalls));
    EXPECT_GT(st.bytesSentPerOp[static_cast<size_t>(OpType::kAllreduce)], 0u);
    EXPECT_GT(st.bytesReceivedPerOp[static_cast<size_t>(OpType::kAllreduce)], 0u);
    ASSERT_EQ(st.perPeer.size(), 3u);
    uint64_t sent = 0;
    for (const PeerCounters& p : st.perPeer) sent += p.bytesSent;
    EXPECT_EQ(sent, st.bytesSentPerOp[static_cast<size_t>(OpType::kAllreduce)]);
  }
}

// Task::onComplete runs once, also when set after completion.
TEST(AllreduceQueue, OnCompleteCallbacks) {
  WorldOptions o;
  o.size = 2;
  std::vector<std::shared_ptr<Communicator>> comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(o, comms);
  std::vector<float> a(100, 1.0f), b(100, 2.0f);
  std::atomic<int> called{0};
  auto t0 = comms[0]->allreduce(a.data(), a.size(), DataType::kFloat32, ReduceOp::kSum);
  auto t1 = comms[1]->allreduce(b.data(), b.size(), DataType::kFloat32, ReduceOp::kSum);
  t0->onComplete([&](const Status& s) {
    EXPECT_TRUE(s.isOk());
    ++called;
  });
  expectAllOk({t0, t1});
  t1->onComplete([&](const Status& s) { ++called; });
  // t0's callback runs on the worker thread just after wait() can see the task done.
  for (int i = 0; i < 5000 && called.load() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(called.load(), 2);
  EXPECT_EQ(a[99], 3.0f);
  EXPECT_EQ(b[0], 3.0f);
}

}  // namespace
}  // namespace nanoccl::colltest
