// The routed transport (tcp between all ranks, shm for the collective messages between ranks
// of one node), with ranks as threads given a node letter each, and as fork()ed processes
// where a peer must really die: routing both ways with parent-rank sources, point-to-point
// (any-source included) staying on tcp, mismatches, abort and failure propagation between the
// two inner transports, the address format, and the counters per transport.
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <future>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tests/transports/mesh.h"
#include "transports/routed/routed_transport.h"

namespace nanoccl::testing {
namespace {

using routed::RoutedTransport;

std::vector<uint8_t> pattern(size_t n, uint64_t seed) {
  std::vector<uint8_t> v(n);
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v[i] = static_cast<uint8_t>(x);
  }
  return v;
}

// Rank r's node is letters[r]; its local ranks are the ranks with the same letter.
routed::RouteOptions routeFor(const std::string& letters, int rank) {
  routed::RouteOptions ro;
  for (int r = 0; r < static_cast<int>(letters.size()); ++r) {
    if (letters[r] == letters[rank]) ro.localRanks.push_back(r);
  }
  return ro;
}

TransportOptions routedOptions(int rank, int size, const std::string& commId = "routed-test") {
  TransportOptions o = optionsFor(rank, size, loopbackConfig("epoll"));
  o.commId = commId;
  return o;
}

// Skips the test where shm is not built in.
#define SKIP_WITHOUT_SHM()                                                                  \
  do {                                                                                      \
    if (!createTransport("shm", TransportOptions{}).isOk()) GTEST_SKIP() << "no shm here"; \
  } while (0)

// Creates, listens and connects one routed transport per letter.
std::vector<std::unique_ptr<RoutedTransport>> makeRoutedMesh(const std::string& letters) {
  const int size = static_cast<int>(letters.size());
  static std::atomic<int> meshes{0};
  const std::string commId = "routed-test-" + std::to_string(meshes.fetch_add(1));
  std::vector<std::unique_ptr<RoutedTransport>> ts(static_cast<size_t>(size));
  std::vector<std::string> addrs(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    auto t = routed::createRoutedTransport(routedOptions(r, size, commId), routeFor(letters, r));
    EXPECT_TRUE(t.isOk()) << t.status().toString();
    if (!t.isOk()) return {};
    ts[r] = std::move(t).value();
    auto a = ts[r]->listen();
    EXPECT_TRUE(a.isOk()) << a.status().toString();
    if (!a.isOk()) return {};
    addrs[r] = a.value();
  }
  std::vector<std::future<Status>> done;
  for (int r = 0; r < size; ++r) {
    done.push_back(
        std::async(std::launch::async, [&, r] { return ts[r]->connect(addrs, soon()); }));
  }
  bool ok = true;
  for (auto& d : done) {
    const Status st = d.get();
    EXPECT_TRUE(st.isOk()) << st.toString();
    ok = ok && st.isOk();
  }
  if (!ok) return {};
  return ts;
}

// Bytes rank `t` sent to `peer` over the inner transport `name`.
uint64_t sentOver(const RoutedTransport& t, const std::string& name, int peer) {
  for (const auto& [n, c] : t.countersPerTransport()) {
    if (n == name) return c[peer].bytesSent;
  }
  ADD_FAILURE() << "no inner transport " << name;
  return 0;
}

uint64_t totalSentOver(const RoutedTransport& t, const std::string& name) {
  uint64_t sum = 0;
  for (const auto& [n, c] : t.countersPerTransport()) {
    if (n != name) continue;
    for (const PeerCounters& p : c) sum += p.bytesSent;
  }
  return sum;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// "aba": ranks 0 and 2 share node a (local ranks 0 and 1 there), rank 1 is alone on node b.
TEST(RoutedTransport, CollectivesToLocalPeersTakeShmAndTheRestTcp) {
  SKIP_WITHOUT_SHM();
  auto ts = makeRoutedMesh("aba");
  ASSERT_EQ(ts.size(), 3u);
  // Small, and large enough to be striped over tcp's connections and span several shm chunks.
  uint32_t tag = 0;
  for (size_t n : {size_t{1}, size_t{4097}, (size_t{3} << 20) + 5}) {
    SCOPED_TRACE("size " + std::to_string(n));
    const auto env = collectiveEnvelope(1, tag++, n);
    // Rank 0 sends to both peers; each answers with its own bytes.
    const auto out = pattern(n, n);
    std::vector<uint8_t> at1(n), at2(n), from1(n), from2(n);
    const auto back1 = pattern(n, n + 1), back2 = pattern(n, n + 2);
    std::vector<std::shared_ptr<Request>> reqs = {
        ts[1]->irecv(0, env, at1.data(), n),           ts[2]->irecv(0, env, at2.data(), n),
        ts[0]->irecv(1, env, from1.data(), n),         ts[0]->irecv(2, env, from2.data(), n),
        ts[0]->isend(1, env, out.data(), n),           ts[0]->isend(2, env, out.data(), n),
        ts[1]->isend(0, env, back1.data(), n),         ts[2]->isend(0, env, back2.data(), n)};
    for (auto& r : reqs) {
      const Status st = r->wait(soon());
      ASSERT_TRUE(st.isOk()) << st.toString();
    }
    EXPECT_TRUE(at1 == out && at2 == out);
    EXPECT_TRUE(from1 == back1 && from2 == back2);
    // Sources are ranks of the routed transport, whichever inner one carried the message.
    EXPECT_EQ(reqs[0]->source(), 0);
    EXPECT_EQ(reqs[1]->source(), 0);
    EXPECT_EQ(reqs[2]->source(), 1);
    EXPECT_EQ(reqs[3]->source(), 2);  // local rank 1 of node a
    EXPECT_EQ(reqs[7]->source(), 2);
  }
  const uint64_t total = 1 + 4097 + (uint64_t{3} << 20) + 5;
  EXPECT_EQ(sentOver(*ts[0], "shm", 2), total);
  EXPECT_EQ(sentOver(*ts[0], "tcp", 2), 0u);
  EXPECT_EQ(sentOver(*ts[0], "tcp", 1), total);
  EXPECT_EQ(sentOver(*ts[0], "shm", 1), 0u);
  EXPECT_EQ(sentOver(*ts[2], "shm", 0), total);
  EXPECT_EQ(totalSentOver(*ts[1], "shm"), 0u);  // alone on its node
}

TEST(RoutedTransport, PointToPointStaysOnTcpKeepsOrderAndServesAnySource) {
  SKIP_WITHOUT_SHM();
  auto ts = makeRoutedMesh("aab");
  ASSERT_EQ(ts.size(), 3u);
  // Any source on rank 0: one message from its local peer, one from the remote one.
  int32_t got[2] = {-1, -1};
  auto r0 = ts[0]->irecv(kAnySource, p2pEnvelope(5, 1, DataType::kInt32), &got[0], 4);
  auto r1 = ts[0]->irecv(kAnySource, p2pEnvelope(5, 1, DataType::kInt32), &got[1], 4);
  int32_t v1 = 11, v2 = 22;
  auto s1 = ts[1]->isend(0, p2pEnvelope(5, 1, DataType::kInt32), &v1, 4);
  auto s2 = ts[2]->isend(0, p2pEnvelope(5, 1, DataType::kInt32), &v2, 4);
  for (auto* r : {&r0, &r1, &s1, &s2}) ASSERT_TRUE((*r)->wait(soon()).isOk());
  const int a = r0->source(), b = r1->source();
  EXPECT_TRUE((a == 1 && b == 2) || (a == 2 && b == 1)) << a << " " << b;
  EXPECT_EQ(got[0], a == 1 ? 11 : 22);
  EXPECT_EQ(got[1], b == 1 ? 11 : 22);
  // FIFO per (peer, tag) between ranks of one node.
  std::vector<int32_t> in(8, -1), out(8);
  std::vector<std::shared_ptr<Request>> reqs;
  for (int i = 0; i < 8; ++i) {
    out[i] = 100 + i;
    reqs.push_back(ts[1]->isend(0, p2pEnvelope(9, 1, DataType::kInt32), &out[i], 4));
  }
  for (int i = 0; i < 8; ++i) {
    reqs.push_back(ts[0]->irecv(1, p2pEnvelope(9, 1, DataType::kInt32), &in[i], 4));
  }
  for (auto& r : reqs) ASSERT_TRUE(r->wait(soon()).isOk());
  for (int i = 0; i < 8; ++i) EXPECT_EQ(in[i], 100 + i);
  for (const auto& t : ts) EXPECT_EQ(totalSentOver(*t, "shm"), 0u);
  EXPECT_EQ(sentOver(*ts[1], "tcp", 0), 4u * 9);
}

TEST(RoutedTransport, MismatchBetweenLocalPeersNamesBothAndFailsTheTcpSideToo) {
  SKIP_WITHOUT_SHM();
  auto ts = makeRoutedMesh("aba");
  ASSERT_EQ(ts.size(), 3u);
  float a[8] = {}, b[8] = {}, c[4] = {}, d[4] = {}, e[4] = {};
  // Rank 0 also waits for rank 1 (remote), which never sends: only propagation ends that wait.
  auto fromRemote = ts[0]->irecv(1, collectiveEnvelope(3, 1, 4), e, sizeof(e));
  auto r0 = ts[0]->irecv(2, collectiveEnvelope(3, 0, 8, OpType::kAllreduce, DataType::kFloat32), b,
                         sizeof(b));
  auto s0 = ts[0]->isend(2, collectiveEnvelope(3, 0, 8, OpType::kAllreduce, DataType::kFloat32), a,
                         sizeof(a));
  auto r2 = ts[2]->irecv(0, collectiveEnvelope(3, 0, 4, OpType::kAllreduce, DataType::kFloat32), d,
                         sizeof(d));
  auto s2 = ts[2]->isend(0, collectiveEnvelope(3, 0, 4, OpType::kAllreduce, DataType::kFloat32), c,
                         sizeof(c));
  for (auto* r : {&r0, &r2}) {
    const Status st = (*r)->wait(soon());
    ASSERT_FALSE(st.isOk());
    EXPECT_TRUE(st.code() == StatusCode::kMismatch || st.code() == StatusCode::kPeerError)
        << st.toString();
    EXPECT_TRUE(contains(st.message(), "x 8") && contains(st.message(), "x 4")) << st.message();
    // The shm numbering (0, 1) is explained in this transport's (0, 2).
    EXPECT_TRUE(contains(st.message(), "ranks 0 2")) << st.message();
  }
  const Status st = fromRemote->wait(soon());
  EXPECT_FALSE(st.isOk());
  EXPECT_NE(st.code(), StatusCode::kTimeout) << st.toString();
  // Rank 1 hears it over tcp: a later request there fails, not waits.
  uint8_t x = 0;
  const Status later = ts[1]->irecv(0, collectiveEnvelope(4, 0, 1), &x, 1)->wait(soon());
  EXPECT_EQ(later.code(), StatusCode::kPeerError) << later.toString();
  (void)s0->wait(soon());
  (void)s2->wait(soon());
}

TEST(RoutedTransport, ARankThatSkipsACallIsDetectedOverShm) {
  SKIP_WITHOUT_SHM();
  auto ts = makeRoutedMesh("aa");
  ASSERT_EQ(ts.size(), 2u);
  uint8_t x = 1, y = 0;
  auto r = ts[1]->irecv(0, collectiveEnvelope(4, 0, 1), &y, 1);
  auto s = ts[0]->isend(1, collectiveEnvelope(5, 0, 1), &x, 1);
  const Status st = r->wait(soon());
  EXPECT_EQ(st.code(), StatusCode::kMismatch) << st.toString();
  (void)s->wait(soon());
}

TEST(RoutedTransport, AbortReachesLocalAndRemotePeersWithItsReason) {
  SKIP_WITHOUT_SHM();
  auto ts = makeRoutedMesh("aab");
  ASSERT_EQ(ts.size(), 3u);
  uint8_t b[3] = {};
  auto own = ts[0]->irecv(1, collectiveEnvelope(1, 0, 1), &b[0], 1);
  auto local = ts[1]->irecv(0, collectiveEnvelope(1, 0, 1), &b[1], 1);
  auto remote = ts[2]->irecv(0, collectiveEnvelope(1, 0, 1), &b[2], 1);
  ts[0]->abort(abortedError("test abort by rank 0"));
  EXPECT_EQ(own->wait(soon()).code(), StatusCode::kAborted);
  for (auto* r : {&local, &remote}) {
    const Status st = (*r)->wait(soon());
    EXPECT_EQ(st.code(), StatusCode::kPeerError) << st.toString();
    EXPECT_TRUE(contains(st.message(), "test abort by rank 0")) << st.toString();
  }
  // Failed for good, on both inner transports.
  for (int peer : {1, 2}) {
    EXPECT_FALSE(ts[0]->isend(peer, collectiveEnvelope(2, 0, 1), &b[0], 1)->wait(soon()).isOk());
  }
}

TEST(RoutedTransport, CountersMergePerRankAndDescribeNamesBoth) {
  SKIP_WITHOUT_SHM();
  auto ts = makeRoutedMesh("aab");
  ASSERT_EQ(ts.size(), 3u);
  // Each receive its own buffer: the shm and tcp receives run concurrently (TSan saw them
  // share one).
  std::vector<uint8_t> src(1000), dst1(1000), dst2(1000), dst3(10);
  std::vector<std::shared_ptr<Request>> reqs = {
      ts[1]->irecv(0, collectiveEnvelope(1, 0, 1000), dst1.data(), 1000),
      ts[2]->irecv(0, collectiveEnvelope(1, 0, 1000), dst2.data(), 1000),
      ts[1]->irecv(0, p2pEnvelope(0, 10), dst3.data(), 10),
      ts[0]->isend(1, collectiveEnvelope(1, 0, 1000), src.data(), 1000),
      ts[0]->isend(2, collectiveEnvelope(1, 0, 1000), src.data(), 1000),
      ts[0]->isend(1, p2pEnvelope(0, 10), src.data(), 10)};
  for (auto& r : reqs) ASSERT_TRUE(r->wait(soon()).isOk());
  const std::vector<PeerCounters> c = ts[0]->counters();
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[1].bytesSent, 1010u);  // 1000 over shm, 10 over tcp
  EXPECT_EQ(c[1].messagesSent, 2u);
  EXPECT_EQ(c[2].bytesSent, 1000u);
  EXPECT_EQ(sentOver(*ts[0], "shm", 1), 1000u);
  EXPECT_EQ(sentOver(*ts[0], "tcp", 1), 10u);
  const std::vector<PeerCounters> c1 = ts[1]->counters();
  EXPECT_EQ(c1[0].bytesReceived, 1010u);
  EXPECT_EQ(c1[0].messagesReceived, 2u);
  const std::string d = ts[0]->describe();
  EXPECT_TRUE(contains(d, "tcp") && contains(d, "shm") && contains(d, "ranks 0 1")) << d;
}

TEST(RoutedTransport, InvalidPeersAreRejectedWithoutBreakingIt) {
  SKIP_WITHOUT_SHM();
  auto ts = makeRoutedMesh("aa");
  ASSERT_EQ(ts.size(), 2u);
  uint8_t x = 7, y = 0;
  for (int bad : {-3, 0, 2}) {
    const Status st = ts[0]->isend(bad, collectiveEnvelope(1, 0, 1), &x, 1)->wait(soon());
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.toString();
  }
  EXPECT_EQ(ts[0]->irecv(kAnySource, collectiveEnvelope(1, 0, 1), &y, 1)->wait(soon()).code(),
            StatusCode::kInvalidArgument);
  auto r = ts[1]->irecv(0, collectiveEnvelope(1, 0, 1), &y, 1);
  ASSERT_TRUE(ts[0]->isend(1, collectiveEnvelope(1, 0, 1), &x, 1)->wait(soon()).isOk());
  ASSERT_TRUE(r->wait(soon()).isOk());
  EXPECT_EQ(y, 7);
}

TEST(RoutedTransport, CallbacksGetTheRanksOfThisTransport) {
  SKIP_WITHOUT_SHM();
  auto ts = makeRoutedMesh("abba");
  ASSERT_EQ(ts.size(), 4u);
  // Rank 3 is local rank 1 of node a: its callback must say 3, not 1.
  uint8_t x = 5, y = 0;
  std::promise<std::pair<Status, int>> seen;
  auto r = ts[0]->irecv(3, collectiveEnvelope(1, 0, 1), &y, 1);
  r->setCallback([&](const Status& st, int src) { seen.set_value({st, src}); });
  ASSERT_TRUE(ts[3]->isend(0, collectiveEnvelope(1, 0, 1), &x, 1)->wait(soon()).isOk());
  auto f = seen.get_future();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  const auto [st, src] = f.get();
  EXPECT_TRUE(st.isOk()) << st.toString();
  EXPECT_EQ(src, 3);
  EXPECT_EQ(y, 5);
  EXPECT_EQ(sentOver(*ts[3], "shm", 0), 1u);
}

// ---- setup --------------------------------------------------------------------------------

TEST(RoutedTransportSetup, TheAddressCarriesBothInnerAddresses) {
  SKIP_WITHOUT_SHM();
  auto t = routed::createRoutedTransport(routedOptions(0, 2), routeFor("aa", 0));
  ASSERT_TRUE(t.isOk()) << t.status().toString();
  auto a = t.value()->listen();
  ASSERT_TRUE(a.isOk()) << a.status().toString();
  const std::string& addr = a.value();
  const size_t sep = addr.find(routed::kAddressSeparator);
  ASSERT_NE(sep, std::string::npos) << addr;
  EXPECT_EQ(addr.find(routed::kAddressSeparator, sep + 1), std::string::npos) << addr;
  EXPECT_TRUE(contains(addr.substr(0, sep), "127.0.0.1:")) << addr;  // tcp on loopback
  EXPECT_TRUE(contains(addr.substr(sep + 1), "nanoccl-")) << addr;   // the shm segment
}

TEST(RoutedTransportSetup, ALocalPeerThatDoesNotRouteIsAClearError) {
  SKIP_WITHOUT_SHM();
  auto t = routed::createRoutedTransport(routedOptions(0, 2), routeFor("aa", 0));
  ASSERT_TRUE(t.isOk());
  auto mine = t.value()->listen();
  ASSERT_TRUE(mine.isOk());
  // Rank 1 published a plain tcp address (NANOCCL_INTRA_TRANSPORT=tcp there).
  const Status st = t.value()->connect({mine.value(), "127.0.0.1:1"}, soon());
  EXPECT_EQ(st.code(), StatusCode::kMismatch) << st.toString();
  EXPECT_TRUE(contains(st.message(), "NANOCCL_INTRA_TRANSPORT")) << st.toString();
  EXPECT_TRUE(contains(st.message(), "rank 1")) << st.toString();
}

TEST(RoutedTransportSetup, RanksThatDoNotRouteReadThePlainParts) {
  // Rank 2 is alone on its node: it reads the tcp parts of its routed peers' addresses.
  const std::vector<std::string> published = {"10.0.0.1:1|/nanoccl-a-0-1",
                                              "10.0.0.1:2|/nanoccl-b-1-1", "10.0.0.2:3"};
  auto plain = routed::plainAddresses(published, 2, {2});
  ASSERT_TRUE(plain.isOk()) << plain.status().toString();
  EXPECT_EQ(plain.value(), (std::vector<std::string>{"10.0.0.1:1", "10.0.0.1:2", "10.0.0.2:3"}));
  // Rank 1 on rank 0's node, not routing while rank 0 does: a clear error.
  const auto bad = routed::plainAddresses(published, 1, {0, 1});
  EXPECT_EQ(bad.status().code(), StatusCode::kMismatch);
  EXPECT_TRUE(contains(bad.status().message(), "NANOCCL_INTRA_TRANSPORT"))
      << bad.status().message();
  EXPECT_TRUE(contains(bad.status().message(), "rank 0")) << bad.status().message();
}

// A local transport that cannot be set up on this host (as shm with /dev/shm full).
class UnavailableLocal : public Transport {
 public:
  Result<std::string> listen() override { return unavailableError("no room in /dev/shm (test)"); }
  Status connect(const std::vector<std::string>&, const Deadline&) override {
    return internalError("connect() after a failed listen()");
  }
  std::shared_ptr<Request> isend(int, const Envelope&, const void*, size_t) override {
    ADD_FAILURE() << "isend on the unavailable local transport";
    return nullptr;
  }
  std::shared_ptr<Request> irecv(int, const Envelope&, void*, size_t) override {
    ADD_FAILURE() << "irecv on the unavailable local transport";
    return nullptr;
  }
  void abort(const Status&) override {}
  std::vector<PeerCounters> counters() const override { return {}; }
  std::string describe() const override { return "unavailable"; }
};

TEST(RoutedTransportSetup, WhereOneRankHasNoShmTheNodeFallsBackToTcpTogether) {
  SKIP_WITHOUT_SHM();
  const std::string letters = "aab";
  std::vector<std::unique_ptr<RoutedTransport>> ts(3);
  std::vector<std::string> addrs(3);
  for (int r = 0; r < 3; ++r) {
    TransportOptions o = routedOptions(r, 3, "routed-fallback");
    routed::RouteOptions ro = routeFor(letters, r);
    ro.fallback = true;
    auto remote = createTransport("tcp", o);
    ASSERT_TRUE(remote.isOk());
    // Rank 1 cannot create its segment; rank 0 can, and must still agree to go without.
    std::unique_ptr<Transport> local;
    if (r == 1) {
      local = std::make_unique<UnavailableLocal>();
    } else {
      auto made = createTransport("shm", routed::localTransportOptions(o, ro));
      ASSERT_TRUE(made.isOk());
      local = std::move(made).value();
    }
    auto t = routed::createRoutedTransport(o, ro, std::move(remote).value(), std::move(local));
    ASSERT_TRUE(t.isOk()) << t.status().toString();
    ts[r] = std::move(t).value();
    auto a = ts[r]->listen();
    ASSERT_TRUE(a.isOk()) << a.status().toString();
    addrs[r] = a.value();
  }
  std::vector<std::future<Status>> done;
  for (int r = 0; r < 3; ++r) {
    done.push_back(
        std::async(std::launch::async, [&, r] { return ts[r]->connect(addrs, soon()); }));
  }
  for (auto& d : done) {
    const Status st = d.get();
    ASSERT_TRUE(st.isOk()) << st.toString();
  }
  uint8_t x = 9, y = 0;
  auto r = ts[1]->irecv(0, collectiveEnvelope(1, 0, 1), &y, 1);
  ASSERT_TRUE(ts[0]->isend(1, collectiveEnvelope(1, 0, 1), &x, 1)->wait(soon()).isOk());
  ASSERT_TRUE(r->wait(soon()).isOk());
  EXPECT_EQ(y, 9);
  EXPECT_EQ(r->source(), 0);
  EXPECT_EQ(sentOver(*ts[0], "tcp", 1), 1u);
  EXPECT_EQ(ts[0]->countersPerTransport().size(), 1u);  // shm is not in use
  EXPECT_TRUE(contains(ts[0]->describe(), "unavailable")) << ts[0]->describe();

  // Without fallback (NANOCCL_INTRA_TRANSPORT=shm) the same failure is the setup's error.
  TransportOptions o = routedOptions(1, 3, "routed-no-fallback");
  auto remote = createTransport("tcp", o);
  ASSERT_TRUE(remote.isOk());
  auto strict = routed::createRoutedTransport(o, routeFor(letters, 1), std::move(remote).value(),
                                              std::make_unique<UnavailableLocal>());
  ASSERT_TRUE(strict.isOk());
  EXPECT_EQ(strict.value()->listen().status().code(), StatusCode::kUnavailable);
}

TEST(RoutedTransportSetup, BadRoutesAreRejected) {
  const std::vector<std::vector<int>> bads = {{}, {1, 2}, {2, 0}, {0, 5}};
  for (const std::vector<int>& bad : bads) {
    routed::RouteOptions ro;
    ro.localRanks = bad;
    const auto t = routed::createRoutedTransport(routedOptions(0, 3), ro);
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument) << t.status().toString();
  }
  routed::RouteOptions same;
  same.localRanks = {0, 1};
  same.local = "tcp";
  EXPECT_EQ(routed::createRoutedTransport(routedOptions(0, 2), same).status().code(),
            StatusCode::kInvalidArgument);
}

// ---- a local peer that dies (fork) --------------------------------------------------------

bool writeString(int fd, const std::string& s) {
  const uint32_t n = static_cast<uint32_t>(s.size());
  return write(fd, &n, 4) == 4 && write(fd, s.data(), n) == static_cast<ssize_t>(n);
}

std::optional<std::string> readString(int fd, int timeoutMs = 10000) {
  const Deadline deadline = Deadline::after(std::chrono::milliseconds(timeoutMs));
  auto readAll = [&](char* dst, size_t len) {
    for (size_t done = 0; done < len;) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, deadline.remainingMs()) <= 0) return false;
      const ssize_t k = read(fd, dst + done, len - done);
      if (k <= 0) return false;
      done += static_cast<size_t>(k);
    }
    return true;
  };
  uint32_t n = 0;
  if (!readAll(reinterpret_cast<char*>(&n), 4) || n > 4096) return std::nullopt;
  std::string out(n, '\0');
  if (!readAll(out.data(), n)) return std::nullopt;
  return out;
}

TEST(RoutedTransportProcesses, ALocalPeerThatDiesFailsPendingRequestsInTime) {
  SKIP_WITHOUT_SHM();
  int down[2], up[2];
  ASSERT_EQ(pipe(down), 0);
  ASSERT_EQ(pipe(up), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Rank 1: connect, say so, then wait to be killed.
    close(down[1]);
    close(up[0]);
    alarm(30);  // never outlive a hung test
    auto t = routed::createRoutedTransport(routedOptions(1, 2, "routed-fork"), routeFor("aa", 1));
    if (!t.isOk()) _exit(2);
    auto mine = t.value()->listen();
    if (!mine.isOk() || !writeString(up[1], mine.value())) _exit(3);
    auto theirs = readString(down[0]);
    if (!theirs || !t.value()->connect({*theirs, mine.value()}, soon()).isOk()) _exit(4);
    writeString(up[1], "connected");
    (void)readString(down[0], 25000);
    _exit(0);
  }
  close(down[0]);
  close(up[1]);
  auto t = routed::createRoutedTransport(routedOptions(0, 2, "routed-fork"), routeFor("aa", 0));
  ASSERT_TRUE(t.isOk());
  auto mine = t.value()->listen();
  ASSERT_TRUE(mine.isOk());
  ASSERT_TRUE(writeString(down[1], mine.value()));
  auto theirs = readString(up[0]);
  ASSERT_TRUE(theirs.has_value());
  const Status connected = t.value()->connect({mine.value(), *theirs}, soon());
  ASSERT_TRUE(connected.isOk()) << connected.toString();
  ASSERT_EQ(readString(up[0]).value_or(""), "connected");

  // Only a collective receive over shm is pending: shm must see the death by itself (within
  // its liveness period; tcp, with nothing pending, only notes its closed sockets).
  std::vector<uint8_t> dst(1 << 20), p2p(4);
  auto viaShm = t.value()->irecv(1, collectiveEnvelope(1, 0, dst.size()), dst.data(), dst.size());
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  const Status st = viaShm->wait(soon(20));
  EXPECT_EQ(st.code(), StatusCode::kPeerError) << st.toString();
  EXPECT_TRUE(contains(st.message(), "rank 1")) << st.toString();
  // Failed as a whole: point-to-point (tcp) fails too, at once or as its sockets close.
  const Status later = t.value()->irecv(1, p2pEnvelope(3, 4), p2p.data(), p2p.size())->wait(soon());
  EXPECT_EQ(later.code(), StatusCode::kPeerError) << later.toString();
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  close(down[1]);
  close(up[0]);
}

}  // namespace
}  // namespace nanoccl::testing
