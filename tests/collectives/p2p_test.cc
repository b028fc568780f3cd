// Point-to-point send/recv through the communicator: not queued behind collectives, matched by
// (peer, tag) in order, receive from any source.
#include "tests/collectives/test_util.h"

namespace nanoccl::colltest {
namespace {

class SendRecvTest : public ::testing::TestWithParam<Case> {};

TEST_P(SendRecvTest, RingShiftAnySourceAndFifo) {
  const Case& c = GetParam();
  std::vector<std::shared_ptr<Communicator>> comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(worldFor(c), comms);
  const int n = c.size;
  constexpr size_t kCount = 1023;

  // Ring shift: receives posted before the sends on every rank.
  std::vector<std::vector<float>> in(n, std::vector<float>(kCount)), out(n);
  std::vector<std::shared_ptr<Task>> tasks;
  for (int r = 0; r < n; ++r) {
    tasks.push_back(comms[r]->recv(in[r].data(), kCount, DataType::kFloat32, (r - 1 + n) % n, 7));
  }
  for (int r = 0; r < n; ++r) {
    out[r].assign(kCount, static_cast<float>(r) + 0.5f);
    tasks.push_back(comms[r]->send(out[r].data(), kCount, DataType::kFloat32, (r + 1) % n, 7));
  }
  expectAllOk(tasks);
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(in[r][0], static_cast<float>((r - 1 + n) % n) + 0.5f) << "rank " << r;
    EXPECT_EQ(in[r][kCount - 1], static_cast<float>((r - 1 + n) % n) + 0.5f) << "rank " << r;
    EXPECT_EQ(tasks[r]->source(), (r - 1 + n) % n);
  }

  // Any source: rank 0 receives one message from each other rank, in whatever order.
  std::vector<int64_t> got(n, -1);
  std::vector<int64_t> mine(n);
  std::vector<std::shared_ptr<Task>> recvs, sends;
  for (int k = 1; k < n; ++k) {
    recvs.push_back(comms[0]->recv(&got[k], 1, DataType::kInt64, kAnySource, 9));
  }
  for (int r = 1; r < n; ++r) {
    mine[r] = 100 + r;
    sends.push_back(comms[r]->send(&mine[r], 1, DataType::kInt64, 0, 9));
  }
  expectAllOk(recvs);
  expectAllOk(sends);
  std::vector<bool> seen(n, false);
  for (int k = 1; k < n; ++k) {
    const int src = recvs[k - 1]->source();
    ASSERT_GE(src, 1);
    ASSERT_LT(src, n);
    EXPECT_EQ(got[k], 100 + src);
    EXPECT_FALSE(seen[src]) << "two messages from rank " << src;
    seen[src] = true;
  }

  // Same (peer, tag): matched in the order sent. Also an empty message.
  int32_t a = 1, b = 2, ra = 0, rb = 0;
  auto s1 = comms[1]->send(&a, 1, DataType::kInt32, 0, 3);
  auto s2 = comms[1]->send(&b, 1, DataType::kInt32, 0, 3);
  auto s3 = comms[1]->send(nullptr, 0, DataType::kInt32, 0, 4);
  auto r1 = comms[0]->recv(&ra, 1, DataType::kInt32, 1, 3);
  auto r2 = comms[0]->recv(&rb, 1, DataType::kInt32, 1, 3);
  auto r3 = comms[0]->recv(nullptr, 0, DataType::kInt32, 1, 4);
  expectAllOk({s1, s2, s3, r1, r2, r3});
  EXPECT_EQ(ra, 1);
  EXPECT_EQ(rb, 2);

  const CommStats st = comms[0]->stats();
  EXPECT_GT(st.bytesReceivedPerOp[static_cast<size_t>(OpType::kSendRecv)], 0u);
}

std::vector<Case> p2pCases() {
  std::vector<Case> out;
  for (const std::string engine : {"epoll", "uring"}) {
    for (int size : {2, 3, 4}) out.push_back({engine, size, 1023, "auto", 0, false});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Matrix, SendRecvTest, ::testing::ValuesIn(p2pCases()), caseName);

// A receive posted before a collective, whose send is posted after it: p2p does not wait
// behind the queue, so neither blocks the other.
TEST(SendRecv, NotQueuedBehindCollectives) {
  WorldOptions o;
  o.size = 2;
  std::vector<std::shared_ptr<Communicator>> comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(o, comms);
  std::vector<double> msg(64, 0.0), payload(64, 3.25);
  auto rx = comms[1]->recv(msg.data(), msg.size(), DataType::kFloat64, 0, 1);
  std::vector<int32_t> x(10, 1), y(10, 2);
  auto a0 = comms[0]->allreduce(x.data(), x.size(), DataType::kInt32, ReduceOp::kSum);
  auto a1 = comms[1]->allreduce(y.data(), y.size(), DataType::kInt32, ReduceOp::kSum);
  expectAllOk({a0, a1});
  EXPECT_FALSE(rx->test());
  auto tx = comms[0]->send(payload.data(), payload.size(), DataType::kFloat64, 1, 1);
  expectAllOk({rx, tx});
  EXPECT_EQ(msg[63], 3.25);
  EXPECT_EQ(x[0], 3);
}

// A world of one: every op is a local copy, no sockets.
TEST(WorldOfOne, LocalSemantics) {
  WorldOptions o;
  o.size = 1;
  std::vector<std::shared_ptr<Communicator>> comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(o, comms);
  Communicator& c = *comms[0];
  std::vector<float> buf = {1, 2, 3};
  expectAllOk({c.allreduce(buf.data(), 3, DataType::kFloat32, ReduceOp::kPremulSum, 2.0)});
  EXPECT_EQ(buf, (std::vector<float>{2, 4, 6}));
  std::vector<int32_t> src = {5, 6}, dst(2, 0);
  expectAllOk({c.allgather(src.data(), 2, dst.data(), {2}, DataType::kInt32)});
  EXPECT_EQ(dst, src);
  dst.assign(2, 0);
  expectAllOk({c.reduceScatter(src.data(), dst.data(), {2}, DataType::kInt32, ReduceOp::kAvg)});
  EXPECT_EQ(dst, src);
  dst.assign(2, 0);
  expectAllOk({c.alltoall(src.data(), {2}, dst.data(), {2}, DataType::kInt32)});
  EXPECT_EQ(dst, src);
  dst.assign(2, 0);
  expectAllOk({c.gather(src.data(), 2, dst.data(), {2}, DataType::kInt32, 0)});
  EXPECT_EQ(dst, src);
  dst.assign(2, 0);
  expectAllOk({c.scatter(src.data(), {2}, dst.data(), 2, DataType::kInt32, 0)});
  EXPECT_EQ(dst, src);
  expectAllOk({c.barrier(), c.broadcast(buf.data(), 3, DataType::kFloat32, 0)});
  EXPECT_EQ(c.send(src.data(), 2, DataType::kInt32, 0, 0)->wait(Deadline::never()).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(c.stats().perPeer.size(), 1u);
}

}  // namespace
}  // namespace nanoccl::colltest
