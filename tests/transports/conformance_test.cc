// The transport contract (transport.h), checked on every row of the transport table and every
// variant of it that changes how bytes move (tcp: each engine, one or three connections per
// peer, plain or encrypted): delivery of every size, early (unexpected) messages, messages
// whose receive is posted while they stream in, point-to-point order and any-source, counters,
// mismatched and skipped calls, peers that die or leave in order with data in flight, abort,
// callbacks, bad peer ranks. Ranks are threads of this process.
//
// Membership (transports/identity.h): a rank with another secret, or of another communicator,
// is refused at setup on every row, and strangers at a rank's address during setup (each
// transport's own kind: tests/transports/strangers.h) get nothing in while the job goes on.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/transports/mesh.h"
#include "tests/transports/strangers.h"

namespace nanoccl::testing {
namespace {

// One way of running a table row.
struct Row {
  std::string name;       // test-name suffix
  std::string transport;  // the table's name (createTransport)
  Config config;
  int lanes = 1;          // connections per peer that close when the peer leaves in order
};

std::vector<Row> rows() {
  std::vector<Row> out;
  for (const TransportInfo& t : builtInTransports()) {
    if (t.name == "tcp") {
      for (const std::string engine : {"epoll", "uring"}) {
        for (int nsocks : {1, 3}) {
          for (bool encrypt : {false, true}) {
            Config c = loopbackConfig(engine, nsocks);
            c.encrypt = encrypt;
            out.push_back({"tcp_" + engine + "_nsocks" + std::to_string(nsocks) +
                               (encrypt ? "_encrypted" : ""),
                           t.name, c, nsocks});
          }
        }
      }
    } else {
      // A row with no variants runs once, with the defaults.
      out.push_back({t.name, t.name, loopbackConfig("epoll", 1), 1});
    }
  }
  return out;
}

class Conformance : public ::testing::TestWithParam<Row> {
 protected:
  void SetUp() override {
    if (GetParam().transport == "tcp") skipIfUnavailable(GetParam().config.tcpEngine);
  }
  // A mesh of `size` ranks; `oneLane`: one connection per peer, so that every message from a
  // peer travels on the same ordered path (what skipped-call detection needs to see a skip).
  std::vector<std::unique_ptr<Transport>> mesh(int size, bool oneLane = false) const {
    Config c = GetParam().config;
    if (oneLane) c.nsocks = 1;
    return makeMesh(size, [&](int) { return c; }, nullptr, GetParam().transport);
  }
  uint64_t lanes() const { return static_cast<uint64_t>(GetParam().lanes); }
};

// Every table row built in has its conformance rows: a new transport cannot skip the suite.
TEST(ConformanceRows, CoverEveryTransportBuiltIn) {
  std::set<std::string> covered;
  for (const Row& r : rows()) covered.insert(r.transport);
  for (const TransportInfo& t : builtInTransports()) EXPECT_EQ(covered.count(t.name), 1u) << t.name;
  EXPECT_FALSE(builtInTransports().empty());
}

TEST_P(Conformance, AWorldOfOneNeedsNoPeers) {
  auto ts = mesh(1);
  ASSERT_EQ(ts.size(), 1u);
  uint8_t x = 0;
  EXPECT_EQ(ts[0]->isend(0, collectiveEnvelope(1, 0, 1), &x, 1)->wait(soon()).code(),
            StatusCode::kInvalidArgument);
  // Nobody to receive from either, any source included.
  EXPECT_EQ(ts[0]->irecv(kAnySource, p2pEnvelope(0, 1), &x, 1)->wait(soon()).code(),
            StatusCode::kInvalidArgument);
  ts[0]->abort(abortedError("rank 0: done"));  // nothing to drain, nobody to tell
}

// Setup's steps in their order only (EngineTransport): connect() before listen(), listen() or a
// successful connect() twice, and a wrong number of addresses are refused on the rank that
// makes them, and so are requests before connect(), an any-source receive included.
TEST_P(Conformance, SetupStepsOutOfOrderAreRefused) {
  auto opts = optionsFor(0, 2, GetParam().config);
  auto t = createTransport(GetParam().transport, opts);
  ASSERT_TRUE(t.isOk()) << t.status().toString();
  Transport& early = *t.value();
  const Status beforeListen = early.connect({"", ""}, soon());
  EXPECT_EQ(beforeListen.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(beforeListen.message().find("before listen()"), std::string::npos)
      << beforeListen.toString();
  uint8_t x = 0;
  EXPECT_EQ(early.irecv(kAnySource, p2pEnvelope(0, 1), &x, 1)->wait(soon()).code(),
            StatusCode::kInvalidArgument);
  auto address = early.listen();
  ASSERT_TRUE(address.isOk()) << address.status().toString();
  const auto again = early.listen();
  EXPECT_EQ(again.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(again.status().message().find("listen() called twice"), std::string::npos);
  const Status threeAddresses = early.connect({*address, "", ""}, soon());
  EXPECT_EQ(threeAddresses.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(threeAddresses.message().find("3 addresses for 2 ranks"), std::string::npos)
      << threeAddresses.toString();

  auto ts = mesh(2);
  ASSERT_EQ(ts.size(), 2u);
  const Status twice = ts[0]->connect({"", ""}, soon());
  EXPECT_EQ(twice.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(twice.message().find("connect() called twice"), std::string::npos) << twice.toString();
  // The mesh still works.
  auto r = ts[1]->irecv(0, collectiveEnvelope(1, 0, 1), &x, 1);
  uint8_t y = 7;
  ASSERT_TRUE(ts[0]->isend(1, collectiveEnvelope(1, 0, 1), &y, 1)->wait(soon()).isOk());
  ASSERT_TRUE(r->wait(soon()).isOk());
  EXPECT_EQ(x, 7);
}

TEST_P(Conformance, DeliversMessagesOfEverySize) {
  auto ts = mesh(2);
  ASSERT_EQ(ts.size(), 2u);
  uint32_t tag = 0;
  for (size_t n : {size_t{0}, size_t{1}, size_t{4095}, size_t{64 * 1024}, size_t{1000003},
                   size_t{(3 << 20) + 5}, size_t{24} << 20}) {
    const auto src = pattern(n, n);
    std::vector<uint8_t> dst(n, 0);
    const auto env = collectiveEnvelope(1, tag++, 1);
    auto r = ts[1]->irecv(0, env, dst.data(), n);
    auto s = ts[0]->isend(1, env, src.data(), n);
    ASSERT_TRUE(s->wait(soon()).isOk());
    const Status st = r->wait(soon());
    ASSERT_TRUE(st.isOk()) << st.toString();
    EXPECT_EQ(r->source(), 0);
    EXPECT_TRUE(src == dst) << "size " << n;
  }
}

TEST_P(Conformance, MessagesThatArriveBeforeTheirReceive) {
  auto ts = mesh(2);
  ASSERT_EQ(ts.size(), 2u);
  // Sends complete without any receive posted (they never wait for the receiver), even those
  // larger than any ring or socket buffer.
  std::vector<std::vector<uint8_t>> src;
  std::vector<std::shared_ptr<Request>> sends;
  const std::vector<size_t> sizes = {3, 100000, 3 << 20, 0, 17, 20 << 20};
  for (size_t i = 0; i < sizes.size(); ++i) {
    src.push_back(pattern(sizes[i], i));
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
    EXPECT_TRUE(dst == src[i]) << "message " << i;
  }
}

TEST_P(Conformance, AReceivePostedWhileItsMessageStreamsInGetsAllOfIt) {
  auto ts = mesh(2);
  ASSERT_EQ(ts.size(), 2u);
  // Whatever part has arrived when the receive is posted must end up in the caller's buffer
  // with the rest; timing decides the split, the result must not depend on it.
  for (int delayUs : {0, 200, 2000}) {
    const size_t n = 16 << 20;
    const auto src = pattern(n, static_cast<uint64_t>(delayUs));
    std::vector<uint8_t> dst(n);
    const auto env = collectiveEnvelope(static_cast<uint64_t>(delayUs) + 1, 0, n);
    auto s = ts[0]->isend(1, env, src.data(), n);
    std::this_thread::sleep_for(std::chrono::microseconds(delayUs));
    auto r = ts[1]->irecv(0, env, dst.data(), n);
    ASSERT_TRUE(s->wait(soon()).isOk());
    ASSERT_TRUE(r->wait(soon()).isOk());
    EXPECT_TRUE(dst == src) << "delay " << delayUs;
  }
}

TEST_P(Conformance, ManyInFlightBothDirectionsAndAllPeers) {
  const int n = 4;
  auto ts = mesh(n);
  ASSERT_EQ(ts.size(), static_cast<size_t>(n));
  const std::vector<size_t> sizes = {200000, 1536 * 1024, 1, 0};
  const size_t m = sizes.size();
  std::vector<std::vector<uint8_t>> in(n * n * m), out(n * n * m);
  std::vector<std::shared_ptr<Request>> reqs;
  for (int a = 0; a < n; ++a) {
    for (int b = 0; b < n; ++b) {
      if (a == b) continue;
      for (size_t k = 0; k < m; ++k) {
        const size_t i = (a * n + b) * m + k;
        out[i] = pattern(sizes[k], i);
        in[i].assign(sizes[k], 0);
        // One call (one fingerprint) whose steps (tags) carry messages of different sizes.
        const auto env = collectiveEnvelope(9, static_cast<uint32_t>(k), sizes[0]);
        // Half the receives before their sends, half after.
        if ((a + b + k) % 2 == 0) reqs.push_back(ts[b]->irecv(a, env, in[i].data(), sizes[k]));
        reqs.push_back(ts[a]->isend(b, env, out[i].data(), sizes[k]));
        if ((a + b + k) % 2 == 1) reqs.push_back(ts[b]->irecv(a, env, in[i].data(), sizes[k]));
      }
    }
  }
  for (auto& r : reqs) ASSERT_TRUE(r->wait(soon()).isOk());
  for (size_t i = 0; i < in.size(); ++i) EXPECT_TRUE(in[i] == out[i]) << "message " << i;
}

TEST_P(Conformance, PointToPointKeepsOrderAndServesAnySource) {
  auto ts = mesh(3);
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

TEST_P(Conformance, LargePointToPointMessagesStayInOrder) {
  auto ts = mesh(2);
  ASSERT_EQ(ts.size(), 2u);
  const size_t n = 5 << 20;
  std::vector<std::vector<uint8_t>> src, dst;
  std::vector<std::shared_ptr<Request>> reqs;
  for (int i = 0; i < 4; ++i) {
    src.push_back(pattern(n, 100 + i));
    dst.emplace_back(n, 0);
  }
  // The first two receives are posted early, the last two late (one of them any-source).
  for (int i = 0; i < 2; ++i) reqs.push_back(ts[1]->irecv(0, p2pEnvelope(3, n), dst[i].data(), n));
  for (int i = 0; i < 4; ++i) reqs.push_back(ts[0]->isend(1, p2pEnvelope(3, n), src[i].data(), n));
  reqs.push_back(ts[1]->irecv(kAnySource, p2pEnvelope(3, n), dst[2].data(), n));
  reqs.push_back(ts[1]->irecv(0, p2pEnvelope(3, n), dst[3].data(), n));
  for (auto& r : reqs) ASSERT_TRUE(r->wait(soon()).isOk());
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(dst[i] == src[i]) << "message " << i;
}

TEST_P(Conformance, CountsPayloadBytesPerPeer) {
  auto ts = mesh(2);
  ASSERT_EQ(ts.size(), 2u);
  std::vector<uint8_t> buf(3000000, 1), dst(3000000);
  auto r = ts[1]->irecv(0, collectiveEnvelope(1, 0, buf.size()), dst.data(), dst.size());
  ASSERT_TRUE(ts[0]->isend(1, collectiveEnvelope(1, 0, buf.size()), buf.data(), buf.size())
                  ->wait(soon())
                  .isOk());
  ASSERT_TRUE(r->wait(soon()).isOk());
  EXPECT_EQ(ts[0]->counters()[1].bytesSent, buf.size());
  EXPECT_EQ(ts[0]->counters()[1].messagesSent, 1u);
  EXPECT_EQ(ts[1]->counters()[0].bytesReceived, buf.size());
  EXPECT_EQ(ts[1]->counters()[0].messagesReceived, 1u);
  EXPECT_EQ(ts[1]->counters()[0].bytesSent, 0u);
}

TEST_P(Conformance, MismatchedCallsFailOnBothRanksNamingBoth) {
  auto ts = mesh(2);
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
  (void)s0->wait(soon());
  (void)s1->wait(soon());
}

// OpFingerprint::lanes: a call's messages on only some of a peer's connections (tcp; other
// transports carry it in the fingerprint and have one path anyway). Every size arrives whole,
// whether the message is striped or not, early or late.
TEST_P(Conformance, ACallOnFewerLanesDeliversEverySize) {
  auto ts = mesh(2);
  ASSERT_EQ(ts.size(), 2u);
  uint32_t tag = 0;
  for (uint8_t lanes : {1, 2, 64}) {
    for (size_t n : {size_t{0}, size_t{5}, size_t{300000}, size_t{(3 << 20) + 7}}) {
      const auto src = pattern(n, n + lanes);
      std::vector<uint8_t> dst(n, 0);
      Envelope env = collectiveEnvelope(1, tag++, 1);
      env.fingerprint.lanes = lanes;
      // Half of them sent before the receive is posted.
      std::shared_ptr<Request> r, s;
      if (tag % 2 == 0) r = ts[1]->irecv(0, env, dst.data(), n);
      s = ts[0]->isend(1, env, src.data(), n);
      ASSERT_TRUE(s->wait(soon()).isOk());
      if (tag % 2 == 1) r = ts[1]->irecv(0, env, dst.data(), n);
      const Status st = r->wait(soon());
      ASSERT_TRUE(st.isOk()) << st.toString();
      EXPECT_TRUE(src == dst) << "size " << n << ", lanes " << int{lanes};
    }
  }
}

// Ranks that planned a call on different socket counts fail it as a mismatch naming it, on
// both ranks, at once: never a receive waiting on a connection the sender did not use.
TEST_P(Conformance, RanksThatDisagreeAboutACallsLanesFailNamingIt) {
  auto ts = mesh(2);
  ASSERT_EQ(ts.size(), 2u);
  const size_t n = size_t{1} << 20;  // striped where there are several connections
  std::vector<uint8_t> a(n, 1), b(n), c(n, 2), d(n);
  Envelope one = collectiveEnvelope(4, 0, n);
  one.fingerprint.lanes = 1;
  const Envelope all = collectiveEnvelope(4, 0, n);
  auto r0 = ts[0]->irecv(1, one, b.data(), n);
  auto s0 = ts[0]->isend(1, one, a.data(), n);
  auto r1 = ts[1]->irecv(0, all, d.data(), n);
  auto s1 = ts[1]->isend(0, all, c.data(), n);
  for (auto* r : {&r0, &r1}) {
    const Status st = (*r)->wait(soon());
    ASSERT_FALSE(st.isOk());
    EXPECT_TRUE(st.code() == StatusCode::kMismatch || st.code() == StatusCode::kPeerError)
        << st.toString();
    EXPECT_NE(st.message().find("1 socket a peer"), std::string::npos) << st.message();
  }
  (void)s0->wait(soon());
  (void)s1->wait(soon());
}

TEST_P(Conformance, DifferentOpsAtTheSameCallFailAtOnceWhateverTheTags) {
  for (bool receiveFirst : {true, false}) {
    auto ts = mesh(2);
    ASSERT_EQ(ts.size(), 2u);
    uint8_t x = 1, y = 0;
    // Rank 1 runs call #1 as an allreduce (tag 0); rank 0 runs it as a broadcast (tag 5): the
    // messages never meet, but every message of one call carries the same fingerprint.
    std::shared_ptr<Request> r, s;
    if (receiveFirst) r = ts[1]->irecv(0, collectiveEnvelope(1, 0, 1, OpType::kAllreduce), &y, 1);
    s = ts[0]->isend(1, collectiveEnvelope(1, 5, 1, OpType::kBroadcast), &x, 1);
    if (!receiveFirst) {
      ASSERT_TRUE(s->wait(soon()).isOk());
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // let it arrive first
      r = ts[1]->irecv(0, collectiveEnvelope(1, 0, 1, OpType::kAllreduce), &y, 1);
    }
    const Status st = r->wait(soon());
    ASSERT_EQ(st.code(), StatusCode::kMismatch) << st.toString();
    EXPECT_NE(st.message().find("broadcast #1"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("allreduce #1"), std::string::npos) << st.message();
    (void)s->wait(soon());
  }
}

TEST_P(Conformance, ARankThatSkipsACallIsDetected) {
  auto ts = mesh(2, /*oneLane=*/true);
  ASSERT_EQ(ts.size(), 2u);
  uint8_t x = 1, y = 0;
  // Rank 1 waits for call #4 from rank 0, but rank 0 skipped it and sends call #5.
  auto r = ts[1]->irecv(0, collectiveEnvelope(4, 0, 1), &y, 1);
  auto s = ts[0]->isend(1, collectiveEnvelope(5, 0, 1), &x, 1);
  const Status st = r->wait(soon());
  ASSERT_EQ(st.code(), StatusCode::kMismatch) << st.toString();
  EXPECT_NE(st.message().find("moved on"), std::string::npos) << st.message();
  (void)s->wait(soon());
}

TEST_P(Conformance, AReceivePostedAfterALaterCallArrivedIsDetected) {
  auto ts = mesh(2, /*oneLane=*/true);
  ASSERT_EQ(ts.size(), 2u);
  uint8_t x = 1, y = 0;
  ASSERT_TRUE(ts[0]->isend(1, collectiveEnvelope(5, 0, 1), &x, 1)->wait(soon()).isOk());
  // Give rank 1 time to see call #5; the check below holds either way (skip or mismatch).
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const Status st = ts[1]->irecv(0, collectiveEnvelope(4, 0, 1), &y, 1)->wait(soon());
  ASSERT_EQ(st.code(), StatusCode::kMismatch) << st.toString();
}

TEST_P(Conformance, PeerThatDiesFailsPendingAndLaterRequests) {
  auto ts = mesh(3);
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

TEST_P(Conformance, WhatArrivedBeforeAPeerLeftCanStillBeReceived) {
  auto ts = mesh(2);
  ASSERT_EQ(ts.size(), 2u);
  std::vector<uint8_t> big = pattern(3 << 20, 3), bigIn(big.size());
  uint8_t small = 42, smallIn = 0;
  ASSERT_TRUE(ts[0]->isend(1, collectiveEnvelope(1, 0, 1), &small, 1)->wait(soon()).isOk());
  ASSERT_TRUE(ts[0]
                  ->isend(1, collectiveEnvelope(1, 1, 1), big.data(), big.size())
                  ->wait(soon())
                  .isOk());
  ts[0].reset();  // the sender finished its last call and left
  // Rank 1 has seen rank 0 close in order before it posts anything.
  ASSERT_TRUE(waitUntilClosedBy(*ts[1], 0, lanes()));
  ASSERT_TRUE(ts[1]->irecv(0, collectiveEnvelope(1, 0, 1), &smallIn, 1)->wait(soon()).isOk());
  EXPECT_EQ(smallIn, 42);
  ASSERT_TRUE(ts[1]->irecv(0, collectiveEnvelope(1, 1, 1), bigIn.data(), bigIn.size())
                  ->wait(soon())
                  .isOk());
  EXPECT_TRUE(bigIn == big);
  // A message that was never sent cannot come any more: a clear error, not a timeout.
  const Status st = ts[1]->irecv(0, collectiveEnvelope(2, 0, 1), &smallIn, 1)->wait(soon());
  ASSERT_EQ(st.code(), StatusCode::kPeerError) << st.toString();
  EXPECT_NE(st.message().find("rank 0"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("closed"), std::string::npos) << st.message();
}

// The end of a collective: one rank has done its part and leaves while another still waits
// for a third. The others finish; only a request that needs the one who left fails.
TEST_P(Conformance, APeerThatFinishedAndClosedDoesNotFailTheOthers) {
  auto ts = mesh(3);
  ASSERT_EQ(ts.size(), 3u);
  uint8_t from1 = 0, from2 = 0;
  auto r1 = ts[0]->irecv(1, collectiveEnvelope(5, 0, 1), &from1, 1);
  auto r2 = ts[0]->irecv(2, collectiveEnvelope(5, 0, 1), &from2, 1);
  const uint8_t two = 2, one = 1;
  ASSERT_TRUE(ts[2]->isend(0, collectiveEnvelope(5, 0, 1), &two, 1)->wait(soon()).isOk());
  ts[2].reset();  // done with its part, gone
  ASSERT_TRUE(waitUntilClosedBy(*ts[0], 2, lanes()));  // rank 0 has seen it close
  ASSERT_TRUE(ts[1]->isend(0, collectiveEnvelope(5, 0, 1), &one, 1)->wait(soon()).isOk());
  EXPECT_TRUE(r1->wait(soon()).isOk());
  EXPECT_TRUE(r2->wait(soon()).isOk());
  EXPECT_EQ(from1, 1);
  EXPECT_EQ(from2, 2);
  // A send to the peer that left fails instead of waiting for a reader that is gone.
  const Status late = ts[0]->isend(2, collectiveEnvelope(6, 0, 1), &one, 1)->wait(soon());
  EXPECT_EQ(late.code(), StatusCode::kPeerError) << late.toString();
}

TEST_P(Conformance, AbortReachesThePeersWithItsReason) {
  auto ts = mesh(3);
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

TEST_P(Conformance, AbortWhileSendingReleasesTheBuffers) {
  auto ts = mesh(2);
  ASSERT_EQ(ts.size(), 2u);
  // Rank 1 never receives; rank 0 sends more than any ring or socket buffer holds, then aborts.
  std::vector<std::vector<uint8_t>> bufs;
  std::vector<std::shared_ptr<Request>> sends;
  for (int i = 0; i < 4; ++i) {
    bufs.push_back(pattern(16 << 20, i));
    sends.push_back(ts[0]->isend(1, collectiveEnvelope(1, i, 1), bufs[i].data(), bufs[i].size()));
  }
  ts[0]->abort(abortedError("rank 0: stop"));
  for (auto& s : sends) EXPECT_TRUE(s->test());  // abort() returned: nothing touches them
}

TEST_P(Conformance, AReceiveThatNeverMatchesTimesOutAndAbortReleasesIt) {
  auto ts = mesh(2);
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

TEST_P(Conformance, CallbacksRunOnceOnCompletion) {
  auto ts = mesh(2);
  ASSERT_EQ(ts.size(), 2u);
  uint8_t x = 9, y = 0;
  std::promise<std::pair<Status, int>> got;
  auto r = ts[1]->irecv(0, collectiveEnvelope(1, 0, 1), &y, 1);
  r->setCallback([&](const Status& st, int src) { got.set_value({st, src}); });
  (void)ts[0]->isend(1, collectiveEnvelope(1, 0, 1), &x, 1)->wait(soon());
  auto fut = got.get_future();
  ASSERT_EQ(fut.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  auto [st, src] = fut.get();
  EXPECT_TRUE(st.isOk());
  EXPECT_EQ(src, 0);
  EXPECT_EQ(y, 9);
}

TEST_P(Conformance, ACallbackMayAbortTheTransport) {
  auto ts = mesh(2);
  ASSERT_EQ(ts.size(), 2u);
  uint8_t x = 9, y = 0, z = 0;
  auto r = ts[1]->irecv(0, collectiveEnvelope(1, 0, 1), &y, 1);
  auto later = ts[1]->irecv(0, collectiveEnvelope(1, 1, 1), &z, 1);
  Transport* t1 = ts[1].get();
  r->setCallback([t1](const Status&, int) { t1->abort(abortedError("rank 1: from a callback")); });
  (void)ts[0]->isend(1, collectiveEnvelope(1, 0, 1), &x, 1)->wait(soon());
  EXPECT_TRUE(r->wait(soon()).isOk());
  EXPECT_EQ(later->wait(soon()).code(), StatusCode::kAborted);
}

TEST_P(Conformance, InvalidPeersAreRejectedWithoutBreakingTheTransport) {
  auto ts = mesh(2);
  ASSERT_EQ(ts.size(), 2u);
  uint8_t x = 0;
  EXPECT_EQ(ts[0]->isend(0, collectiveEnvelope(1, 0, 1), &x, 1)->wait(soon()).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ts[0]->isend(7, collectiveEnvelope(1, 0, 1), &x, 1)->wait(soon()).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ts[0]->irecv(kAnySource, collectiveEnvelope(1, 0, 1), &x, 1)->wait(soon()).code(),
            StatusCode::kInvalidArgument);  // any-source is for point-to-point only
  uint8_t y = 0;
  auto r = ts[1]->irecv(0, collectiveEnvelope(1, 0, 1), &y, 1);
  EXPECT_TRUE(ts[0]->isend(1, collectiveEnvelope(1, 0, 1), &x, 1)->wait(soon()).isOk());
  EXPECT_TRUE(r->wait(soon()).isOk());
}

// Setup with one rank whose membership differs (`tweak`): every rank's connect() must end
// within the deadline, and not in success.
std::vector<Status> setupWithAnOutsider(const Row& row,
                                        const std::function<void(int, TransportOptions&)>& tweak) {
  std::vector<Status> statuses;
  const Clock::time_point start = Clock::now();
  auto ts = makeMesh(2, [&](int) { return row.config; }, &statuses, row.transport, tweak, 2);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(15)) << "setup outlived its deadline";
  return statuses;
}

TEST_P(Conformance, ARankWithAnotherSecretIsRefusedAtSetup) {
  const auto statuses = setupWithAnOutsider(GetParam(), [](int rank, TransportOptions& o) {
    if (rank == 1) o.secret = "another-jobs-secret-0123";
  });
  ASSERT_EQ(statuses.size(), 2u);
  bool named = false;
  for (const Status& st : statuses) {
    EXPECT_FALSE(st.isOk()) << "a rank with another secret was admitted";
    named = named || st.message().find("secret") != std::string::npos;
  }
  EXPECT_TRUE(named) << statuses[0].toString() << " / " << statuses[1].toString();
}

TEST_P(Conformance, ARankOfAnotherCommunicatorIsRefusedAtSetup) {
  // The same secret proves nothing in another communicator: proofs are under a key of both.
  const auto statuses = setupWithAnOutsider(GetParam(), [](int rank, TransportOptions& o) {
    if (rank == 1) o.commId = "another-comm";
  });
  ASSERT_EQ(statuses.size(), 2u);
  for (const Status& st : statuses) {
    EXPECT_FALSE(st.isOk()) << "a rank of another communicator was admitted";
  }
}

// Strangers at rank 0's address while it waits for rank 1 at setup, in this transport's terms
// (strangers.h): tcp gets a wrong secret, random bytes, another communicator and a silent
// connection; fabric gets garbage and forged frames from a bare endpoint; shm's segment cannot
// be opened by another user. Setup completes, the real peer's bytes arrive intact and are the
// only ones counted, and the transport goes on working.
TEST_P(Conformance, StrangersAtARanksAddressGetNothingInAndTheJobGoesOn) {
  const Row& row = GetParam();
  auto t0 = createTransport(row.transport, optionsFor(0, 2, row.config)).value();
  auto t1 = createTransport(row.transport, optionsFor(1, 2, row.config)).value();
  const std::string a0 = t0->listen().value();
  const std::string a1 = t1->listen().value();
  auto setup0 = std::async(std::launch::async, [&] { return t0->connect({a0, a1}, soon(20)); });
  std::shared_ptr<void> lingering;  // a stranger that stays connected through setup
  bool played = true;
  if (row.transport == "tcp") {
    lingering = tcpStrangers(a0);
  } else if (row.transport == "shm") {
    played = anotherUserCannotOpenSegment(a0);
#ifdef NANOCCL_TEST_FABRIC
  } else if (row.transport == "fabric") {
    auto raw = std::make_shared<RawFabricPeer>(a0);
    ASSERT_TRUE(raw->ok());
    for (const std::string& b : fabricStrangersBytes()) EXPECT_TRUE(raw->post(b)) << b.size();
    lingering = raw;
#endif
  } else {
    played = false;
  }
  const Status st1 = t1->connect({a0, a1}, soon(20));
  ASSERT_TRUE(st1.isOk()) << st1.toString();
  const Status st0 = setup0.get();
  ASSERT_TRUE(st0.isOk()) << st0.toString();
#ifdef NANOCCL_TEST_FABRIC
  if (auto* raw = static_cast<RawFabricPeer*>(row.transport == "fabric" ? lingering.get()
                                                                          : nullptr)) {
    EXPECT_TRUE(raw->drain());
  }
#endif
  const std::vector<uint8_t> out = pattern(1 << 20, 5), back = pattern(1000, 6);
  std::vector<uint8_t> in(out.size()), backIn(back.size());
  auto r1 = t1->irecv(0, collectiveEnvelope(1, 0, out.size()), in.data(), in.size());
  auto r0 = t0->irecv(1, collectiveEnvelope(1, 1, back.size()), backIn.data(), backIn.size());
  ASSERT_TRUE(t0->isend(1, collectiveEnvelope(1, 0, out.size()), out.data(), out.size())
                  ->wait(soon()).isOk());
  ASSERT_TRUE(t1->isend(0, collectiveEnvelope(1, 1, back.size()), back.data(), back.size())
                  ->wait(soon()).isOk());
  ASSERT_TRUE(r1->wait(soon()).isOk());
  ASSERT_TRUE(r0->wait(soon()).isOk());
  EXPECT_EQ(in, out);
  EXPECT_EQ(backIn, back);
  EXPECT_EQ(t0->counters()[1].messagesReceived, 1u);
  EXPECT_EQ(t0->counters()[1].bytesReceived, back.size());
  if (!played) GTEST_SKIP() << row.name << ": no stranger could be played here (shm needs root)";
}

INSTANTIATE_TEST_SUITE_P(Rows, Conformance, ::testing::ValuesIn(rows()),
                         [](const ::testing::TestParamInfo<Row>& i) { return i.param.name; });

}  // namespace
}  // namespace nanoccl::testing
