// The TCP transport's behaviour, on both engines: delivery, striping, early (unexpected)
// messages, point-to-point order and any-source, counters, and every failure path.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "tests/transports/mesh.h"

namespace nanoccl::testing {
namespace {

std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

struct Param {
  std::string engine;
  int nsocks;
  bool encrypt;  // every case runs over sealed records too (NANOCCL_ENCRYPT=1)
};

class TcpTransportTest : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override { skipIfUnavailable(GetParam().engine); }
  Config cfg() const {
    Config c = loopbackConfig(GetParam().engine, GetParam().nsocks);
    c.encrypt = GetParam().encrypt;
    return c;
  }
};

TEST_P(TcpTransportTest, DeliversMessagesOfEverySize) {
  auto ts = makeMesh(2, cfg());
  ASSERT_EQ(ts.size(), 2u);
  uint32_t tag = 0;
  for (size_t n : {size_t{0}, size_t{1}, size_t{4095}, size_t{64 * 1024}, size_t{1000003},
                   size_t{8 << 20}}) {
    const auto src = pattern(n, static_cast<uint32_t>(n));
    std::vector<uint8_t> dst(n, 0);
    const auto env = collectiveEnvelope(1, tag++, n);
    auto r = ts[1]->irecv(0, env, dst.data(), n);
    auto s = ts[0]->isend(1, env, src.data(), n);
    ASSERT_TRUE(s->wait(soon()).isOk());
    const Status st = r->wait(soon());
    ASSERT_TRUE(st.isOk()) << st.toString();
    EXPECT_EQ(r->source(), 0);
    EXPECT_EQ(src, dst) << "size " << n;
  }
}

TEST_P(TcpTransportTest, MessagesThatArriveBeforeTheirReceive) {
  auto ts = makeMesh(2, cfg());
  ASSERT_EQ(ts.size(), 2u);
  // Sends complete without any receive posted (they never wait for the receiver).
  std::vector<std::vector<uint8_t>> src;
  std::vector<std::shared_ptr<Request>> sends;
  const std::vector<size_t> sizes = {3, 100000, 3 << 20, 0, 17};
  for (size_t i = 0; i < sizes.size(); ++i) {
    src.push_back(pattern(sizes[i], static_cast<uint32_t>(i)));
    // One call (#5), one fingerprint, a tag per message.
    sends.push_back(ts[0]->isend(1, collectiveEnvelope(5, static_cast<uint32_t>(i)),
                                 src[i].data(), sizes[i]));
  }
  for (auto& s : sends) ASSERT_TRUE(s->wait(soon()).isOk());
  // Receives posted afterwards, in reverse order.
  for (size_t i = sizes.size(); i-- > 0;) {
    std::vector<uint8_t> dst(sizes[i]);
    auto r = ts[1]->irecv(0, collectiveEnvelope(5, static_cast<uint32_t>(i)), dst.data(),
                          sizes[i]);
    ASSERT_TRUE(r->wait(soon()).isOk());
    EXPECT_EQ(dst, src[i]);
  }
}

TEST_P(TcpTransportTest, ManyInFlightBothDirectionsAndAllPeers) {
  const int n = 4;
  auto ts = makeMesh(n, cfg());
  ASSERT_EQ(ts.size(), static_cast<size_t>(n));
  const size_t bytes = 200000;
  std::vector<std::vector<uint8_t>> in(n * n, std::vector<uint8_t>(bytes));
  std::vector<std::vector<uint8_t>> out(n * n);
  std::vector<std::shared_ptr<Request>> reqs;
  for (int a = 0; a < n; ++a) {
    for (int b = 0; b < n; ++b) {
      if (a == b) continue;
      out[a * n + b] = pattern(bytes, static_cast<uint32_t>(a * n + b));
      const auto env = collectiveEnvelope(9, static_cast<uint32_t>(a), bytes);
      reqs.push_back(ts[b]->irecv(a, env, in[a * n + b].data(), bytes));
      reqs.push_back(ts[a]->isend(b, env, out[a * n + b].data(), bytes));
    }
  }
  for (auto& r : reqs) ASSERT_TRUE(r->wait(soon()).isOk());
  for (int a = 0; a < n; ++a) {
    for (int b = 0; b < n; ++b) {
      if (a != b) {
        EXPECT_EQ(in[a * n + b], out[a * n + b]);
      }
    }
  }
}

TEST_P(TcpTransportTest, PointToPointKeepsOrderAndServesAnySource) {
  auto ts = makeMesh(3, cfg());
  ASSERT_EQ(ts.size(), 3u);
  // Rank 0 sends three messages with the same tag to rank 2: they arrive in order.
  std::vector<int32_t> a = {1, 2, 3};
  std::vector<std::shared_ptr<Request>> sends;
  for (int32_t& v : a) sends.push_back(ts[0]->isend(2, p2pEnvelope(7, 1, DataType::kInt32), &v, 4));
  int32_t got[3] = {0, 0, 0};
  for (int i = 0; i < 3; ++i) {
    auto r = ts[2]->irecv(0, p2pEnvelope(7, 1, DataType::kInt32), &got[i], 4);
    ASSERT_TRUE(r->wait(soon()).isOk());
  }
  EXPECT_EQ(got[0], 1);
  EXPECT_EQ(got[1], 2);
  EXPECT_EQ(got[2], 3);
  // Any-source: one message from rank 1, received without naming it.
  int32_t v = 42;
  int32_t w = 0;
  auto r = ts[2]->irecv(kAnySource, p2pEnvelope(8, 1, DataType::kInt32), &w, 4);
  auto s = ts[1]->isend(2, p2pEnvelope(8, 1, DataType::kInt32), &v, 4);
  ASSERT_TRUE(r->wait(soon()).isOk());
  EXPECT_EQ(w, 42);
  EXPECT_EQ(r->source(), 1);
  for (auto& x : sends) ASSERT_TRUE(x->wait(soon()).isOk());
  ASSERT_TRUE(s->wait(soon()).isOk());
}

TEST_P(TcpTransportTest, CountsPayloadBytesPerPeer) {
  auto ts = makeMesh(2, cfg());
  ASSERT_EQ(ts.size(), 2u);
  std::vector<uint8_t> buf(300000, 1), dst(300000);
  auto r = ts[1]->irecv(0, collectiveEnvelope(1, 0, buf.size()), dst.data(), dst.size());
  ASSERT_TRUE(ts[0]->isend(1, collectiveEnvelope(1, 0, buf.size()), buf.data(), buf.size())
                  ->wait(soon())
                  .isOk());
  ASSERT_TRUE(r->wait(soon()).isOk());
  EXPECT_EQ(ts[0]->counters()[1].bytesSent, buf.size());
  EXPECT_EQ(ts[0]->counters()[1].messagesSent, 1u);
  EXPECT_EQ(ts[1]->counters()[0].bytesReceived, buf.size());
  EXPECT_EQ(ts[1]->counters()[0].bytesSent, 0u);
}

TEST_P(TcpTransportTest, MismatchedCallsFailOnBothRanksNamingBoth) {
  auto ts = makeMesh(2, cfg());
  ASSERT_EQ(ts.size(), 2u);
  float a[8] = {}, b[8] = {}, c[4] = {}, d[4] = {};
  // Rank 0 thinks call #3 is an allreduce of 8 floats; rank 1 thinks 4.
  auto r0 = ts[0]->irecv(1, collectiveEnvelope(3, 0, 8, OpType::kAllreduce, DataType::kFloat32), b,
                         sizeof(b));
  auto s0 = ts[0]->isend(1, collectiveEnvelope(3, 0, 8, OpType::kAllreduce, DataType::kFloat32), a,
                         sizeof(a));
  auto r1 = ts[1]->irecv(0, collectiveEnvelope(3, 0, 4, OpType::kAllreduce, DataType::kFloat32), d,
                         sizeof(d));
  auto s1 = ts[1]->isend(0, collectiveEnvelope(3, 0, 4, OpType::kAllreduce, DataType::kFloat32), c,
                         sizeof(c));
  for (auto* r : {&r0, &r1}) {
    const Status st = (*r)->wait(soon());
    ASSERT_FALSE(st.isOk());
    EXPECT_TRUE(st.code() == StatusCode::kMismatch || st.code() == StatusCode::kPeerError)
        << st.toString();
    EXPECT_NE(st.message().find("rank 0"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("rank 1"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("x 8"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("x 4"), std::string::npos) << st.message();
  }
  s0->wait(soon()).isOk();
  s1->wait(soon()).isOk();
}

TEST_P(TcpTransportTest, ARankThatSkipsACallIsDetected) {
  Config one = cfg();
  one.nsocks = 1;
  auto ts = makeMesh(2, one);
  ASSERT_EQ(ts.size(), 2u);
  uint8_t x = 1, y = 0;
  // Rank 1 waits for call #4 from rank 0, but rank 0 skipped it and sends call #5.
  auto r = ts[1]->irecv(0, collectiveEnvelope(4, 0, 1), &y, 1);
  auto s = ts[0]->isend(1, collectiveEnvelope(5, 0, 1), &x, 1);
  const Status st = r->wait(soon());
  ASSERT_EQ(st.code(), StatusCode::kMismatch) << st.toString();
  EXPECT_NE(st.message().find("moved on"), std::string::npos) << st.message();
  s->wait(soon()).isOk();
}

TEST_P(TcpTransportTest, PeerThatDiesFailsPendingAndLaterRequests) {
  auto ts = makeMesh(3, cfg());
  ASSERT_EQ(ts.size(), 3u);
  std::vector<uint8_t> dst(1 << 20);
  auto r = ts[0]->irecv(1, collectiveEnvelope(1, 0, dst.size()), dst.data(), dst.size());
  ts[1].reset();  // rank 1 goes away mid-collective
  const Status st = r->wait(soon());
  ASSERT_EQ(st.code(), StatusCode::kPeerError) << st.toString();
  EXPECT_NE(st.message().find("rank 1"), std::string::npos) << st.message();
  // Later requests fail at once, also towards healthy peers.
  uint8_t b = 0;
  const Status later = ts[0]->isend(2, collectiveEnvelope(2, 0, 1), &b, 1)->wait(soon());
  EXPECT_FALSE(later.isOk());
}

TEST_P(TcpTransportTest, WhatArrivedBeforeAPeerLeftCanStillBeReceived) {
  auto ts = makeMesh(2, cfg());
  ASSERT_EQ(ts.size(), 2u);
  std::vector<uint8_t> big = pattern(1 << 20, 3), bigIn(big.size());
  uint8_t small = 42, smallIn = 0;
  ASSERT_TRUE(ts[0]->isend(1, collectiveEnvelope(1, 0, 1), &small, 1)->wait(soon()).isOk());
  ASSERT_TRUE(
      ts[0]->isend(1, collectiveEnvelope(1, 1, big.size()), big.data(), big.size())->wait(soon()).isOk());
  ts[0].reset();  // the sender finished its last call and left
  // Rank 1 has seen every connection of rank 0 close before it posts anything.
  ASSERT_TRUE(waitUntilClosedBy(*ts[1], 0, static_cast<uint64_t>(cfg().nsocks)));
  ASSERT_TRUE(ts[1]->irecv(0, collectiveEnvelope(1, 0, 1), &smallIn, 1)->wait(soon()).isOk());
  EXPECT_EQ(smallIn, 42);
  ASSERT_TRUE(ts[1]->irecv(0, collectiveEnvelope(1, 1, big.size()), bigIn.data(), bigIn.size())
                  ->wait(soon())
                  .isOk());
  EXPECT_EQ(bigIn, big);
  // A message that was never sent cannot come any more: a clear error, not a timeout.
  const Status st = ts[1]->irecv(0, collectiveEnvelope(2, 0, 1), &smallIn, 1)->wait(soon());
  ASSERT_EQ(st.code(), StatusCode::kPeerError) << st.toString();
  EXPECT_NE(st.message().find("rank 0"), std::string::npos) << st.message();
}

TEST_P(TcpTransportTest, DifferentOpsAtTheSameCallFailAtOnceWhateverTheTags) {
  auto ts = makeMesh(2, cfg());
  ASSERT_EQ(ts.size(), 2u);
  uint8_t x = 1, y = 0;
  // Rank 1 runs call #1 as an allreduce (tag 0); rank 0 runs it as a broadcast (tag 5).
  auto r = ts[1]->irecv(0, collectiveEnvelope(1, 0, 1, OpType::kAllreduce), &y, 1);
  auto s = ts[0]->isend(1, collectiveEnvelope(1, 5, 1, OpType::kBroadcast), &x, 1);
  const Status st = r->wait(soon());
  ASSERT_EQ(st.code(), StatusCode::kMismatch) << st.toString();
  EXPECT_NE(st.message().find("broadcast #1"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("allreduce #1"), std::string::npos) << st.message();
  s->wait(soon()).isOk();
}

TEST_P(TcpTransportTest, AbortReachesThePeersWithItsReason) {
  auto ts = makeMesh(3, cfg());
  ASSERT_EQ(ts.size(), 3u);
  uint8_t b1 = 0, b2 = 0;
  auto r1 = ts[1]->irecv(0, collectiveEnvelope(1, 0, 1), &b1, 1);
  auto r2 = ts[2]->irecv(1, collectiveEnvelope(1, 0, 1), &b2, 1);
  ts[0]->abort(abortedError("rank 0: user pressed the red button"));
  const Status st1 = r1->wait(soon());
  ASSERT_EQ(st1.code(), StatusCode::kPeerError) << st1.toString();
  EXPECT_NE(st1.message().find("red button"), std::string::npos) << st1.message();
  // Rank 2 waits on rank 1, which failed in turn: it still learns, within the deadline.
  EXPECT_FALSE(r2->wait(soon()).isOk());
}

TEST_P(TcpTransportTest, AReceiveThatNeverMatchesTimesOutAndAbortReleasesIt) {
  auto ts = makeMesh(2, cfg());
  ASSERT_EQ(ts.size(), 2u);
  std::vector<uint8_t> dst(1000);
  auto r = ts[0]->irecv(1, collectiveEnvelope(1, 0, dst.size()), dst.data(), dst.size());
  const Status st = r->wait(Deadline::after(std::chrono::milliseconds(300)));
  EXPECT_EQ(st.code(), StatusCode::kTimeout) << st.toString();
  EXPECT_FALSE(r->test());
  ts[0]->abort(timeoutError("rank 0: gave up"));
  EXPECT_TRUE(r->test());  // abort() returns only when the buffer is released
  EXPECT_EQ(r->wait(soon()).code(), StatusCode::kTimeout);
}

TEST_P(TcpTransportTest, CallbacksRunOnceOnCompletion) {
  auto ts = makeMesh(2, cfg());
  ASSERT_EQ(ts.size(), 2u);
  uint8_t x = 9, y = 0;
  std::promise<std::pair<Status, int>> got;
  auto r = ts[1]->irecv(0, collectiveEnvelope(1, 0, 1), &y, 1);
  r->setCallback([&](const Status& st, int src) { got.set_value({st, src}); });
  ts[0]->isend(1, collectiveEnvelope(1, 0, 1), &x, 1)->wait(soon()).isOk();
  auto [st, src] = got.get_future().get();
  EXPECT_TRUE(st.isOk());
  EXPECT_EQ(src, 0);
  EXPECT_EQ(y, 9);
}

TEST_P(TcpTransportTest, InvalidPeersAreRejectedWithoutBreakingTheTransport) {
  auto ts = makeMesh(2, cfg());
  ASSERT_EQ(ts.size(), 2u);
  uint8_t x = 0;
  EXPECT_EQ(ts[0]->isend(0, collectiveEnvelope(1, 0, 1), &x, 1)->wait(soon()).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ts[0]->isend(7, collectiveEnvelope(1, 0, 1), &x, 1)->wait(soon()).code(),
            StatusCode::kInvalidArgument);
  uint8_t y = 0;
  auto r = ts[1]->irecv(0, collectiveEnvelope(1, 0, 1), &y, 1);
  EXPECT_TRUE(ts[0]->isend(1, collectiveEnvelope(1, 0, 1), &x, 1)->wait(soon()).isOk());
  EXPECT_TRUE(r->wait(soon()).isOk());
}

std::vector<Param> params() {
  std::vector<Param> out;
  for (const std::string e : {"epoll", "uring"}) {
    for (int n : {1, 3}) {
      for (bool encrypt : {false, true}) out.push_back({e, n, encrypt});
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Engines, TcpTransportTest, ::testing::ValuesIn(params()),
                         [](const ::testing::TestParamInfo<Param>& i) {
                           return i.param.engine + "_nsocks" + std::to_string(i.param.nsocks) +
                                  (i.param.encrypt ? "_encrypted" : "");
                         });

TEST(TcpTransportSetup, WorldOfOneNeedsNoSockets) {
  auto ts = makeMesh(1, loopbackConfig("epoll"));
  ASSERT_EQ(ts.size(), 1u);
  uint8_t x = 0;
  EXPECT_EQ(ts[0]->isend(0, collectiveEnvelope(1, 0, 1), &x, 1)->wait(soon()).code(),
            StatusCode::kInvalidArgument);
}

TEST(TcpTransportSetup, DifferentSettingsAcrossRanksFailSetupNamingBoth) {
  std::vector<Status> statuses;
  auto ts = makeMesh(
      2, [](int r) { return loopbackConfig("epoll", r == 0 ? 2 : 3); }, &statuses);
  ASSERT_EQ(statuses.size(), 2u);
  for (const Status& st : statuses) {
    ASSERT_EQ(st.code(), StatusCode::kMismatch) << st.toString();
    EXPECT_NE(st.message().find("nsocks=2"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("nsocks=3"), std::string::npos) << st.message();
  }
}

TEST(TcpTransportSetup, RanksThatDisagreeAboutEncryptionFailNamingIt) {
  std::vector<Status> statuses;
  auto ts = makeMesh(
      2,
      [](int r) {
        Config c = loopbackConfig("epoll", 1);
        c.encrypt = r == 1;
        return c;
      },
      &statuses);
  ASSERT_EQ(statuses.size(), 2u);
  for (const Status& st : statuses) {
    ASSERT_EQ(st.code(), StatusCode::kMismatch) << st.toString();
    EXPECT_NE(st.message().find("encrypt=1"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("encrypt=0"), std::string::npos) << st.message();
  }
}

TEST(TcpTransportSetup, UnknownInterfaceIsAClearError) {
  Config c = loopbackConfig("epoll");
  c.socketIfname = "=nosuchif0";
  auto t = createTransport("tcp", optionsFor(0, 2, c));
  ASSERT_TRUE(t.isOk());
  auto a = t.value()->listen();
  ASSERT_FALSE(a.isOk());
  EXPECT_NE(a.status().message().find("nosuchif0"), std::string::npos);
}

TEST(TcpTransportSetup, UnknownTransportOrEngineIsAClearError) {
  EXPECT_EQ(createTransport("carrier-pigeon", optionsFor(0, 1, Config{})).status().code(),
            StatusCode::kUnavailable);
  Config c = loopbackConfig("io_uring_please");
  auto t = createTransport("tcp", optionsFor(0, 1, c));
  ASSERT_TRUE(t.isOk());
  ASSERT_TRUE(t.value()->listen().isOk());
  EXPECT_EQ(t.value()->connect({""}, soon()).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace nanoccl::testing
