// Strangers, garbage and liars at the TCP transport's door: none gets in, none crashes it, and
// the job goes on. Raw sockets play the strangers; the wire structs come from wire.h.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <optional>
#include <random>
#include <thread>

#include "common/secret.h"
#include "tests/transports/mesh.h"
#include "tests/transports/raw_peer.h"
#include "transports/tcp/address.h"
#include "transports/tcp/handshake.h"
#include "transports/tcp/layout.h"
#include "transports/tcp/wire.h"

namespace nanoccl::testing {
namespace {

using tcp::Challenge;
using tcp::Hello;
using tcp::Proof;

// Forwards one TCP connection to `target` (a rank's listening address), letting a test change
// the bytes the dialer sends: mutate(seen, chunk) may edit `chunk`, the next bytes after the
// `seen` bytes already forwarded, before it goes on.
class Proxy {
 public:
  using Mutate = std::function<void(const std::string& seen, std::string& chunk)>;
  Proxy(const std::string& target, Mutate mutate) : target_(target), mutate_(std::move(mutate)) {
    listenFd_ = listenLoopback(&address_);
    thread_ = std::thread([this] { run(); });
  }
  ~Proxy() {
    stop_ = true;
    thread_.join();
    close(listenFd_);
  }
  const std::string& address() const { return address_; }

 private:
  void run() {
    pollfd lp{listenFd_, POLLIN, 0};
    while (!stop_ && poll(&lp, 1, 50) == 0) {
    }
    if (stop_) return;
    const int in = accept(listenFd_, nullptr, nullptr);
    const int out = dial(target_);
    std::string seen;
    char buf[65536];
    while (!stop_) {
      pollfd p[2] = {{in, POLLIN, 0}, {out, POLLIN, 0}};
      if (poll(p, 2, 50) <= 0) continue;
      if (p[0].revents) {
        const ssize_t n = recv(in, buf, sizeof(buf), 0);
        if (n <= 0) break;
        std::string chunk(buf, static_cast<size_t>(n));
        mutate_(seen, chunk);
        seen.append(buf, static_cast<size_t>(n));
        if (!sendAll(out, chunk.data(), chunk.size())) break;
      }
      if (p[1].revents) {
        const ssize_t n = recv(out, buf, sizeof(buf), 0);
        if (n <= 0 || !sendAll(in, buf, static_cast<size_t>(n))) break;
      }
    }
    close(in);
    close(out);
  }

  std::string target_;
  Mutate mutate_;
  int listenFd_ = -1;
  std::string address_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Bytes a connector sends during the handshake; after them, sealed records.
constexpr size_t kConnectorHandshakeBytes = sizeof(Hello) + sizeof(Proof);
constexpr size_t kSealedHeaderBytes = sizeof(FrameHeader) + crypto::kTagBytes;

class HandshakeTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { skipIfUnavailable(GetParam()); }
};

// Strangers during setup are conformance_test.cc's (every tcp row). After setup the listening
// port is closed: nobody else can even connect.
TEST_P(HandshakeTest, AfterSetupThePortIsClosed) {
  const Config cfg = loopbackConfig(GetParam(), 1);
  auto t0 = createTransport("tcp", optionsFor(0, 2, cfg)).value();
  auto t1 = createTransport("tcp", optionsFor(1, 2, cfg)).value();
  const std::string a0 = t0->listen().value();
  const std::string a1 = t1->listen().value();
  auto setup0 = std::async(std::launch::async, [&] { return t0->connect({a0, a1}, soon(20)); });
  ASSERT_TRUE(t1->connect({a0, a1}, soon(20)).isOk());
  ASSERT_TRUE(setup0.get().isOk());
  const SocketAddress late = tcp::parseRails(a0).value().front().address;
  const int fd = socket(late.family(), SOCK_STREAM, 0);
  EXPECT_NE(connect(fd, reinterpret_cast<const sockaddr*>(&late.storage), late.length), 0);
  close(fd);
}

// A connection that passed the handshake (it knows the secret) and then lies in a frame
// header: the transport fails with a protocol error instead of trusting it.
class InsiderTest : public HandshakeTest {
 protected:
  // Rank 0 is real; this test is rank 1. Returns the connected raw socket.
  int joinAsRank1() {
    cfg_ = loopbackConfig(GetParam(), 1);
    t0_ = createTransport("tcp", optionsFor(0, 2, cfg_)).value();
    const std::string a0 = t0_->listen().value();
    auto setup = std::async(std::launch::async,
                            [&] { return t0_->connect({a0, publishedLike("127.0.0.1:1", a0)},
                                                      soon(20)); });
    const int fd = dial(a0);
    const Played p = handshake(fd, helloFor(1, 2), keyOf("test-secret"));
    EXPECT_TRUE(p.acceptorProved);
    EXPECT_TRUE(p.ack.has_value());
    if (p.ack) {
      EXPECT_EQ(p.ack->verdict, tcp::HelloVerdict::kAccepted);
    }
    EXPECT_TRUE(setup.get().isOk());
    return fd;
  }

  FrameHeader validHeader(uint64_t total) {
    FrameHeader h{};
    h.magic = kMagic;
    h.version = kVersion;
    h.kind = FrameKind::kData;
    h.op = OpType::kAllreduce;
    h.dtype = DataType::kUInt8;
    h.seq = 1;
    h.count = total;
    h.total = total;
    h.length = total;
    return h;
  }

  Config cfg_;
  std::unique_ptr<Transport> t0_;
};

TEST_P(InsiderTest, AnOversizedLengthIsAProtocolErrorNotAnAllocation) {
  const int fd = joinAsRank1();
  std::vector<uint8_t> dst(16);
  auto r = t0_->irecv(1, collectiveEnvelope(2, 0, 16), dst.data(), dst.size());
  FrameHeader h = validHeader(16);
  h.seq = 2;
  h.total = uint64_t{1} << 60;  // would be an exabyte
  h.length = 16;
  ASSERT_EQ(send(fd, &h, sizeof(h), 0), static_cast<ssize_t>(sizeof(h)));
  const Status st = r->wait(soon());
  ASSERT_EQ(st.code(), StatusCode::kProtocolError) << st.toString();
  EXPECT_NE(st.message().find("rank 1"), std::string::npos) << st.message();
  close(fd);
}

TEST_P(InsiderTest, GarbageAfterTheHandshakeIsAProtocolError) {
  const int fd = joinAsRank1();
  std::vector<uint8_t> dst(16);
  auto r = t0_->irecv(1, collectiveEnvelope(1, 0, 16), dst.data(), dst.size());
  char junk[sizeof(FrameHeader)];
  std::memset(junk, 0xab, sizeof(junk));
  ASSERT_EQ(send(fd, junk, sizeof(junk), 0), static_cast<ssize_t>(sizeof(junk)));
  EXPECT_EQ(r->wait(soon()).code(), StatusCode::kProtocolError);
  close(fd);
}

TEST_P(InsiderTest, AnUnknownCodecIsAProtocolError) {
  const int fd = joinAsRank1();
  std::vector<uint8_t> dst(16);
  auto r = t0_->irecv(1, collectiveEnvelope(1, 0, 16), dst.data(), dst.size());
  FrameHeader h = validHeader(16);
  h.codec = 200;
  ASSERT_EQ(send(fd, &h, sizeof(h), 0), static_cast<ssize_t>(sizeof(h)));
  const Status st = r->wait(soon());
  EXPECT_EQ(st.code(), StatusCode::kProtocolError) << st.toString();
  EXPECT_NE(st.message().find("codec"), std::string::npos) << st.message();
  close(fd);
}

TEST_P(InsiderTest, ASliceOutsideItsMessageIsAProtocolError) {
  const int fd = joinAsRank1();
  std::vector<uint8_t> dst(16);
  auto r = t0_->irecv(1, collectiveEnvelope(1, 0, 16), dst.data(), dst.size());
  FrameHeader h = validHeader(16);
  h.offset = 8;
  h.length = 16;  // [8, 24) of a 16-byte message
  ASSERT_EQ(send(fd, &h, sizeof(h), 0), static_cast<ssize_t>(sizeof(h)));
  EXPECT_EQ(r->wait(soon()).code(), StatusCode::kProtocolError);
  close(fd);
}

TEST_P(InsiderTest, AnAbortFrameIsReportedWithItsText) {
  const int fd = joinAsRank1();
  std::vector<uint8_t> dst(16);
  auto r = t0_->irecv(1, collectiveEnvelope(1, 0, 16), dst.data(), dst.size());
  const std::string text = "rank 1: out of memory";
  const FrameHeader h = abortFrameHeader(text.size());
  ASSERT_EQ(send(fd, &h, sizeof(h), 0), static_cast<ssize_t>(sizeof(h)));
  ASSERT_EQ(send(fd, text.data(), text.size(), 0), static_cast<ssize_t>(text.size()));
  const Status st = r->wait(soon());
  ASSERT_EQ(st.code(), StatusCode::kPeerError);
  EXPECT_NE(st.message().find("out of memory"), std::string::npos) << st.message();
  close(fd);
}

// A peer that dies in the middle of a message (SIGKILL while sending): the receive it was for
// fails naming it, once the close grace is over; never waits for a timeout. The point-to-point
// receive was once lost (held by no table) and timed out instead: seen in bench/soak.py.
TEST_P(InsiderTest, AReceiveCutMidPayloadByADyingPeerFails) {
  for (const bool p2p : {true, false}) {
    SCOPED_TRACE(p2p ? "point-to-point" : "collective");
    const int fd = joinAsRank1();
    constexpr uint64_t kTotal = 1 << 20;
    std::vector<uint8_t> dst(kTotal);
    const Envelope env = p2p ? p2pEnvelope(7, kTotal) : collectiveEnvelope(1, 0, kTotal);
    auto r = t0_->irecv(1, env, dst.data(), dst.size());
    const FrameHeader h = dataFrameHeader(env.fingerprint, env.tag, 1, kTotal, 0, kTotal);
    ASSERT_TRUE(sendAll(fd, &h, sizeof(h)));
    const std::vector<uint8_t> half(kTotal / 2, 0x5a);
    ASSERT_TRUE(sendAll(fd, half.data(), half.size()));
    close(fd);  // gone with half of the payload sent
    const Status st = r->wait(soon());
    ASSERT_EQ(st.code(), StatusCode::kPeerError) << st.toString();
    EXPECT_NE(st.message().find("rank 1"), std::string::npos) << st.message();
    t0_.reset();
  }
}

TEST_P(HandshakeTest, AReplayedHandshakeIsTurnedAway) {
  // Record a real join of rank 1 (all the bytes it sent), then replay them at a new job that
  // uses the same secret and communicator id: the acceptor's fresh nonce makes the old Proof
  // worthless, and the real rank 1 still gets in.
  const Config cfg = loopbackConfig(GetParam(), 1);
  std::string recorded;
  {
    auto t0 = createTransport("tcp", optionsFor(0, 2, cfg)).value();
    const std::string a0 = t0->listen().value();
    auto setup = std::async(std::launch::async,
                            [&] { return t0->connect({a0, publishedLike("127.0.0.1:1", a0)},
                                                     soon(20)); });
    const int fd = dial(a0);
    const Played p = handshake(fd, helloFor(1, 2), keyOf("test-secret"));
    ASSERT_TRUE(p.ack.has_value());
    ASSERT_TRUE(setup.get().isOk());
    recorded = p.sent;
    close(fd);
  }
  ASSERT_EQ(recorded.size(), kConnectorHandshakeBytes);
  auto t0 = createTransport("tcp", optionsFor(0, 2, cfg)).value();
  auto t1 = createTransport("tcp", optionsFor(1, 2, cfg)).value();
  const std::string a0 = t0->listen().value();
  const std::string a1 = t1->listen().value();
  auto setup0 = std::async(std::launch::async, [&] { return t0->connect({a0, a1}, soon(20)); });
  const int fd = dial(a0);
  const Played replayed = handshake(fd, Hello{}, keyOf("test-secret"), recorded);
  EXPECT_FALSE(replayed.ack.has_value()) << "a replayed handshake was admitted";
  EXPECT_TRUE(closedByPeer(fd));
  close(fd);
  ASSERT_TRUE(t1->connect({a0, a1}, soon(20)).isOk());
  ASSERT_TRUE(setup0.get().isOk());
}

TEST_P(HandshakeTest, TheTimeoutNamesTheCauseNotALaterBareClose) {
  // A rank holding another secret is turned away, then hangs up its other connection before
  // saying anything: rank 0's timeout still names the secret, not the bare close.
  const Config cfg = loopbackConfig(GetParam(), 1);
  auto t0 = createTransport("tcp", optionsFor(0, 2, cfg)).value();
  const std::string a0 = t0->listen().value();
  auto setup = std::async(std::launch::async,
                          [&] { return t0->connect({a0, publishedLike("127.0.0.1:1", a0)},
                                                   soon(3)); });
  const int wrong = dial(a0);
  EXPECT_FALSE(handshake(wrong, helloFor(1, 2), keyOf("not-the-secret")).ack.has_value());
  EXPECT_TRUE(closedByPeer(wrong));
  close(wrong);
  const int bare = dial(a0);
  close(bare);
  const Status st = setup.get();
  ASSERT_EQ(st.code(), StatusCode::kTimeout) << st.toString();
  EXPECT_NE(st.message().find("no proof of the job secret"), std::string::npos) << st.message();
}

TEST_P(HandshakeTest, TheAcceptorMustProveTheSecretToo) {
  // Something else answers at rank 0's address with a Challenge it cannot sign: rank 1 fails
  // at once, naming it, and never sends a Proof an impostor could use.
  std::string fake;
  const int impostor = listenLoopback(&fake);
  auto proofSeen = std::async(std::launch::async, [&] {
    const int fd = accept(impostor, nullptr, nullptr);
    Hello h{};
    if (!recvAll(fd, &h, sizeof(h))) return false;
    Challenge c{};
    c.magic = kMagic;
    c.rank = 0;
    const crypto::Mac guess = tcp::challengeMac(keyOf("a-guessed-secret!"), h, c);
    std::memcpy(c.mac, guess.data(), guess.size());
    sendAll(fd, &c, sizeof(c));
    Proof p{};
    const bool got = recvAll(fd, &p, sizeof(p), 1000);
    close(fd);
    return got;
  });
  auto t1 = createTransport("tcp", optionsFor(1, 2, loopbackConfig(GetParam(), 1))).value();
  const std::string a1 = t1->listen().value();
  const Status st = t1->connect({publishedLike(fake, a1), a1}, soon(20));
  ASSERT_EQ(st.code(), StatusCode::kProtocolError) << st.toString();
  EXPECT_NE(st.message().find("did not prove"), std::string::npos) << st.message();
  EXPECT_FALSE(proofSeen.get()) << "rank 1 sent its Proof to an impostor";
  close(impostor);
}

TEST_P(HandshakeTest, AHelloOutOfRangeIsTurnedAwayAndTheRealPeerGetsIn) {
  // Signed with the job's secret, but for a rank or connection rank 0 does not accept: rank 0
  // itself, a rank past the end, another size, a connection index past nsocks (1 here). Each
  // is closed before any Challenge, and setup goes on.
  const Config cfg = loopbackConfig(GetParam(), 1);
  auto t0 = createTransport("tcp", optionsFor(0, 2, cfg)).value();
  auto t1 = createTransport("tcp", optionsFor(1, 2, cfg)).value();
  const std::string a0 = t0->listen().value();
  const std::string a1 = t1->listen().value();
  auto setup0 = std::async(std::launch::async, [&] { return t0->connect({a0, a1}, soon(20)); });
  for (const Hello& h : {helloFor(0, 2), helloFor(2, 2), helloFor(-1, 2), helloFor(1, 3),
                         helloFor(1, 2, /*socket=*/1)}) {
    SCOPED_TRACE("rank " + std::to_string(h.rank) + " of " + std::to_string(h.size) +
                 ", connection " + std::to_string(h.socketIndex));
    const int fd = dial(a0);
    const Played p = handshake(fd, h, keyOf("test-secret"));
    EXPECT_FALSE(p.acceptorProved) << "rank 0 answered with a Challenge";
    EXPECT_FALSE(p.ack.has_value()) << "rank 0 admitted it";
    EXPECT_TRUE(closedByPeer(fd));
    close(fd);
  }
  const Status st1 = t1->connect({a0, a1}, soon(20));
  ASSERT_TRUE(st1.isOk()) << st1.toString();
  const Status st0 = setup0.get();
  ASSERT_TRUE(st0.isOk()) << st0.toString();
}

// Encrypted connections through a proxy that changes what rank 1 sends to rank 0: rank 0
// rejects the record and both ranks fail with the reason, within the timeout.
class TamperTest : public HandshakeTest {
 protected:
  void runThrough(const Proxy::Mutate& mutate) {
    Config cfg = loopbackConfig(GetParam(), 1);
    cfg.encrypt = true;
    auto t0 = createTransport("tcp", optionsFor(0, 2, cfg)).value();
    auto t1 = createTransport("tcp", optionsFor(1, 2, cfg)).value();
    const std::string a0 = t0->listen().value();
    const std::string a1 = t1->listen().value();
    Proxy proxy(a0, mutate);
    auto setup0 = std::async(std::launch::async, [&] { return t0->connect({a0, a1}, soon(20)); });
    ASSERT_TRUE(t1->connect({publishedLike(proxy.address(), a0), a1}, soon(20)).isOk());
    ASSERT_TRUE(setup0.get().isOk());

    std::vector<uint8_t> src(4096, 0x5a), dst(4096, 0);
    auto recv0 = t0->irecv(1, collectiveEnvelope(1, 0, src.size()), dst.data(), dst.size());
    uint8_t later = 0;
    auto recv1 = t1->irecv(0, collectiveEnvelope(2, 0, 1), &later, 1);
    t1->isend(0, collectiveEnvelope(1, 0, src.size()), src.data(), src.size());
    const Status st0 = recv0->wait(soon());
    ASSERT_EQ(st0.code(), StatusCode::kProtocolError) << st0.toString();
    EXPECT_NE(st0.message().find("failed authentication"), std::string::npos) << st0.message();
    EXPECT_NE(st0.message().find("from rank 1"), std::string::npos) << st0.message();
    const Status st1 = recv1->wait(soon());
    ASSERT_FALSE(st1.isOk());
    EXPECT_NE(st1.message().find("failed authentication"), std::string::npos) << st1.message();
    EXPECT_NE(dst, src) << "tampered bytes were delivered as the message";
  }
};

TEST_P(TamperTest, AFlippedCiphertextBitFailsBothRanks) {
  const size_t target = kConnectorHandshakeBytes + kSealedHeaderBytes + 100;  // in the payload
  runThrough([&](const std::string& seen, std::string& chunk) {
    if (seen.size() <= target && target < seen.size() + chunk.size()) {
      chunk[target - seen.size()] ^= 0x01;
    }
  });
}

TEST_P(TamperTest, AReplayedRecordFailsBothRanks) {
  // The first frame's header record is sent twice: the copy arrives under the next record
  // number and must not open.
  const size_t from = kConnectorHandshakeBytes;
  const size_t to = from + kSealedHeaderBytes;
  bool done = false;
  runThrough([&](const std::string& seen, std::string& chunk) {
    const std::string all = seen + chunk;
    if (!done && all.size() >= to) {
      chunk.insert(to - seen.size(), all.substr(from, to - from));
      done = true;
    }
  });
}

// A failing rank sends its reason only on idle connections; a busy one just closes. Rank 0
// waits on ranks 1 and 2; rank 1's connection closes with no reason, and a moment later rank 2
// sends one: both receives fail with that reason, not with "closed its connection".
TEST_P(InsiderTest, AReasonOnAnotherStreamWinsOverABareClose) {
  cfg_ = loopbackConfig(GetParam(), 1);
  t0_ = createTransport("tcp", optionsFor(0, 3, cfg_)).value();
  const std::string a0 = t0_->listen().value();
  auto setup = std::async(std::launch::async, [&] {
    return t0_->connect(
        {a0, publishedLike("127.0.0.1:1", a0), publishedLike("127.0.0.1:2", a0)}, soon(20));
  });
  const int fd1 = dial(a0);
  ASSERT_TRUE(handshake(fd1, helloFor(1, 3), keyOf("test-secret")).ack.has_value());
  const int fd2 = dial(a0);
  ASSERT_TRUE(handshake(fd2, helloFor(2, 3), keyOf("test-secret")).ack.has_value());
  ASSERT_TRUE(setup.get().isOk());
  uint8_t b1 = 0, b2 = 0;
  auto r1 = t0_->irecv(1, collectiveEnvelope(1, 0, 1), &b1, 1);
  auto r2 = t0_->irecv(2, collectiveEnvelope(1, 0, 1), &b2, 1);
  close(fd1);  // no reason given
  ASSERT_TRUE(waitUntilClosedBy(*t0_, 1, 1));  // seen before the reason below is sent
  const std::string text = "rank 2: the real reason";
  const FrameHeader h = abortFrameHeader(text.size());
  ASSERT_TRUE(sendAll(fd2, &h, sizeof(h)));
  ASSERT_TRUE(sendAll(fd2, text.data(), text.size()));
  for (auto* r : {&r1, &r2}) {
    const Status st = (*r)->wait(soon());
    ASSERT_EQ(st.code(), StatusCode::kPeerError) << st.toString();
    EXPECT_NE(st.message().find("the real reason"), std::string::npos) << st.message();
  }
  close(fd2);
}

INSTANTIATE_TEST_SUITE_P(Engines, HandshakeTest, ::testing::Values("epoll", "uring"));
INSTANTIATE_TEST_SUITE_P(Engines, TamperTest, ::testing::Values("epoll", "uring"));
INSTANTIATE_TEST_SUITE_P(Engines, InsiderTest, ::testing::Values("epoll", "uring"));

TEST(InterfaceSpec, FollowsNcclSyntax) {
  using nanoccl::interfaceMatches;
  EXPECT_TRUE(interfaceMatches("eth0", ""));
  EXPECT_TRUE(interfaceMatches("eth0", "eth"));
  EXPECT_TRUE(interfaceMatches("ens5", "eth,ens"));
  EXPECT_FALSE(interfaceMatches("lo", "eth,ens"));
  EXPECT_FALSE(interfaceMatches("docker0", "^docker"));
  EXPECT_TRUE(interfaceMatches("eth0", "^docker"));
  EXPECT_TRUE(interfaceMatches("eth0", "=eth0"));
  EXPECT_FALSE(interfaceMatches("eth01", "=eth0"));
  EXPECT_FALSE(interfaceMatches("eth0", "^=eth0"));
  EXPECT_TRUE(interfaceMatches("eth01", "^=eth0"));
}

TEST(SocketAddress, ParsesWhatItPrints) {
  for (const std::string s : {"127.0.0.1:80", "[::1]:4242", "10.1.2.3:65535"}) {
    auto a = SocketAddress::parse(s);
    ASSERT_TRUE(a.isOk()) << s;
    EXPECT_EQ(a->toString(), s);
  }
  for (const std::string s : {"", "1.2.3.4", "1.2.3.4:0", "1.2.3.4:70000", "nohost:1", "[::1:3"}) {
    EXPECT_FALSE(SocketAddress::parse(s).isOk()) << s;
  }
}

// An interface as upInterfaces() lists it (port 0).
InterfaceAddress iface(const std::string& name, const std::string& address) {
  InterfaceAddress out{name, SocketAddress::parse(address + ":1").value()};
  out.address.setPort(0);
  return out;
}

std::vector<std::string> railNames(const std::string& spec,
                                   const std::vector<InterfaceAddress>& seen) {
  auto rails = pickRails(spec, seen);
  EXPECT_TRUE(rails.isOk()) << spec << ": " << rails.status().toString();
  std::vector<std::string> out;
  if (rails.isOk()) {
    for (const auto& r : *rails) out.push_back(r.name + "=" + r.address.toString());
  }
  return out;
}

TEST(Rails, AnIncludingListIsOneRailPerInterfaceInItsOrder) {
  const std::vector<InterfaceAddress> seen = {
      iface("lo", "127.0.0.1"),  iface("eth1", "10.0.1.1"), iface("eth0", "10.0.0.1"),
      iface("eth0", "10.0.9.9"), iface("ens5", "10.0.2.1"), iface("docker0", "172.17.0.1")};
  using V = std::vector<std::string>;
  EXPECT_EQ(railNames("eth0,eth1", seen), (V{"eth0=10.0.0.1:0", "eth1=10.0.1.1:0"}));
  EXPECT_EQ(railNames("eth1,eth0", seen), (V{"eth1=10.0.1.1:0", "eth0=10.0.0.1:0"}));
  EXPECT_EQ(railNames("eth", seen), (V{"eth0=10.0.0.1:0", "eth1=10.0.1.1:0"}));
  EXPECT_EQ(railNames("=eth1,ens", seen), (V{"eth1=10.0.1.1:0"}));  // '=' : exact names
  EXPECT_EQ(railNames("ens,eth0,eth", seen),
            (V{"ens5=10.0.2.1:0", "eth0=10.0.0.1:0", "eth1=10.0.1.1:0"}));
  EXPECT_EQ(railNames("eth0,,eth0", seen), (V{"eth0=10.0.0.1:0"}));
  // Aliases and interfaces without a carrier are no rails; alone, the first match still is.
  auto withAlias = seen;
  withAlias.push_back(iface("eth0:1", "10.0.5.1"));
  withAlias.push_back(iface("eth2", "10.0.6.1"));
  withAlias.back().running = false;
  EXPECT_EQ(railNames("eth", withAlias), (V{"eth0=10.0.0.1:0", "eth1=10.0.1.1:0"}));
  EXPECT_EQ(railNames("eth2", withAlias), (V{"eth2=10.0.6.1:0"}));
  // Excluding or empty specs keep one interface, as before rails.
  EXPECT_EQ(railNames("^docker,lo", seen), (V{"eth1=10.0.1.1:0"}));
  EXPECT_EQ(railNames("", seen), (V{"eth1=10.0.1.1:0"}));
  EXPECT_EQ(railNames("", {iface("lo", "127.0.0.1")}), (V{"lo=127.0.0.1:0"}));
  const auto none = pickRails("ib,eth7", seen);
  ASSERT_EQ(none.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(none.status().message().find("'ib,eth7'"), std::string::npos);
  EXPECT_NE(none.status().message().find("eth0"), std::string::npos) << "names what is there";
}

TEST(Rails, PublishedAddressesRoundTrip) {
  auto a = tcp::parseRails("10.0.0.1:4000@1000,[::1]:4001");
  ASSERT_TRUE(a.isOk());
  ASSERT_EQ(a->size(), 2u);
  EXPECT_EQ((*a)[0].mbps, 1000);
  EXPECT_EQ((*a)[1].mbps, 0);  // unknown
  EXPECT_EQ(tcp::formatRails(*a), "10.0.0.1:4000@1000,[::1]:4001");
  EXPECT_EQ(tcp::parseRails("127.0.0.1:9")->size(), 1u);
  EXPECT_EQ(tcp::publishedSettings("127.0.0.1:9"), "");
  // With the settings every rank must share, after a space: parseRails() reads the rails only.
  const std::string published = tcp::formatRails(*a, "nsocks=2 encrypt=0");
  EXPECT_EQ(published, "10.0.0.1:4000@1000,[::1]:4001 nsocks=2 encrypt=0");
  ASSERT_TRUE(tcp::parseRails(published).isOk());
  EXPECT_EQ(tcp::formatRails(tcp::parseRails(published).value()), "10.0.0.1:4000@1000,[::1]:4001");
  EXPECT_EQ(tcp::publishedSettings(published), "nsocks=2 encrypt=0");
  for (const std::string s : {"", ",", "10.0.0.1:4000,", ",10.0.0.1:4000", "10.0.0.1:4000;x:1",
                              "10.0.0.1:4000@", "10.0.0.1:4000@0", "10.0.0.1:4000@-5",
                              "10.0.0.1:4000@1g", "10.0.0.1:4000@99999999999999999999",
                              " nsocks=2", "10.0.0.1:4000@ nsocks=2"}) {
    EXPECT_EQ(tcp::parseRails(s).status().code(), StatusCode::kInvalidArgument) << s;
  }
}

std::string partsText(const std::vector<Part>& parts) {
  std::string out;
  for (const Part& p : parts) {
    out += (out.empty() ? "" : " ") + std::to_string(p.lane) + ":" + std::to_string(p.offset) +
           "+" + std::to_string(p.length);
  }
  return out;
}

TEST(Rails, StripesFollowTheRailsWeights) {
  using tcp::layoutMessage;
  const auto all = OpType::kAllreduce;
  tcp::Rails equal{{1, 1}, 65536};
  // Two rails, two connections each (c % 2 is the rail): equal quarters, aligned.
  EXPECT_EQ(partsText(layoutMessage(equal, 4, all, 0, 0, 1 << 20)),
            "0:0+262144 1:262144+262144 2:524288+262144 3:786432+262144");
  // 1000 and 100 Mbit/s: the fast rail carries 10/11, the last stripe ends at the end.
  tcp::Rails unequal{{1000, 100}, 65536};
  EXPECT_EQ(partsText(layoutMessage(unequal, 2, all, 0, 0, 11 << 20)),
            "0:0+10485760 1:10485760+1048576");
  for (uint64_t total : {uint64_t{65536}, uint64_t{1000003}, uint64_t{256} << 20}) {
    for (int n : {2, 4, 6}) {
      const auto parts = layoutMessage(unequal, n, all, 7, 3, total);
      uint64_t next = 0, fast = 0;
      for (const Part& p : parts) {
        EXPECT_EQ(p.offset, next) << "every byte once, in order";
        EXPECT_GT(p.length, 0u);
        next += p.length;
        if (p.lane % 2 == 0) fast += p.length;
      }
      EXPECT_EQ(next, total);
      // Off the exact share by at most the alignment of each connection's cut.
      EXPECT_NEAR(static_cast<double>(fast), total * 10.0 / 11, n * tcp::kStripeAlign)
          << total << " on " << n;
    }
  }
  // Small messages travel whole, on the fastest rail's connections only.
  for (uint64_t seq = 0; seq < 8; ++seq) {
    const auto parts = layoutMessage(unequal, 4, all, seq, 0, 4096);
    ASSERT_EQ(parts.size(), 1u);
    EXPECT_EQ(parts[0].lane % 2, 0);
  }
  EXPECT_EQ(partsText(layoutMessage(equal, 4, all, 1, 0, 4096)), "1:0+4096");
  EXPECT_EQ(partsText(layoutMessage(unequal, 4, OpType::kSendRecv, 5, 0, 1 << 20)), "0:0+1048576");
  // Point-to-point on the fast rail even where it is not rail 0.
  tcp::Rails slowFirst{{100, 1000}, 65536};
  EXPECT_EQ(partsText(layoutMessage(slowFirst, 4, OpType::kSendRecv, 5, 0, 4096)), "1:0+4096");
  EXPECT_EQ(partsText(layoutMessage(equal, 4, all, 0, 0, 0)), "0:0+0");
  // A share that rounds to nothing leaves its connection out.
  tcp::Rails lopsided{{1000000, 1}, 4096};
  EXPECT_EQ(partsText(layoutMessage(lopsided, 2, all, 0, 0, 8192)), "0:0+8192");
}

// Two rails on loopback (two listeners of 127.0.0.1): connection s of every pair goes to the
// peer's rail s % 2 listener.
TEST(Rails, EveryRankWeighsTheRailsAlike) {
  const auto weights = [](const std::vector<std::string>& addresses, int rails) {
    auto r = tcp::weighRails(addresses, rails, 4096);
    EXPECT_TRUE(r.isOk()) << r.status().toString();
    return r.isOk() ? r->weights : std::vector<int64_t>{};
  };
  using W = std::vector<int64_t>;
  // The slowest rate any rank published, per rail; the order of the ranks does not matter.
  EXPECT_EQ(weights({"10.0.0.1:1@1000,10.0.1.1:1@100", "10.0.0.2:1@1000,10.0.1.2:1@1000"}, 2),
            (W{1000, 100}));
  EXPECT_EQ(weights({"10.0.0.2:1@1000,10.0.1.2:1@1000", "10.0.0.1:1@1000,10.0.1.1:1@100"}, 2),
            (W{1000, 100}));
  // One rank that does not know a rate: equal shares.
  EXPECT_EQ(weights({"10.0.0.1:1@1000,10.0.1.1:1", "10.0.0.2:1@1000,10.0.1.2:1@100"}, 2),
            (W{1, 1}));
  // A rank with another rail count (setup fails naming it): equal shares meanwhile.
  EXPECT_EQ(weights({"10.0.0.1:1@1000,10.0.1.1:1@100", "10.0.0.2:1@1000"}, 2), (W{1, 1}));
  EXPECT_EQ(weights({"10.0.0.1:1@1000", "10.0.0.2:1@10"}, 1), (W{1}));  // one rail: no weighing
  EXPECT_EQ(weights({""}, 1), (W{1}));  // a world of one publishes nothing
  EXPECT_EQ(tcp::weighRails({"10.0.0.1:1@1000,x", "10.0.0.2:1"}, 2, 0).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(tcp::weighRails({"10.0.0.1:1", "10.0.0.2:1"}, 1, 4096)->stripeMinBytes, 4096u);
}

TEST(Rails, ConnectionSRunsOnRailSModuloRails) {
  auto lo = iface("lo", "127.0.0.1");
  std::vector<std::vector<tcp::Listener>> listeners(2);
  std::vector<std::string> addresses;
  for (auto& l : listeners) {
    for (int rail = 0; rail < 2; ++rail) l.push_back(tcp::openListener(lo).value());
    addresses.push_back(tcp::formatRails({{l[0].address}, {l[1].address}}));
  }
  auto params = [](int rank) {
    tcp::MeshParams p{keyOf("test-secret")};
    p.rank = rank;
    p.size = 2;
    p.nsocks = 4;
    return p;
  };
  const tcp::MeshParams p0 = params(0), p1 = params(1);
  auto mesh0 = std::async(std::launch::async,
                          [&] { return tcp::buildMesh(listeners[0], addresses, p0, soon(20)); });
  auto mesh1 = tcp::buildMesh(listeners[1], addresses, p1, soon(20));
  auto links0 = mesh0.get();
  ASSERT_TRUE(links0.isOk()) << links0.status().toString();
  ASSERT_TRUE(mesh1.isOk()) << mesh1.status().toString();
  ASSERT_EQ((*links0)[1].size(), 4u);
  for (int s = 0; s < 4; ++s) {
    // Rank 0 accepted rank 1's connection s on its rail s % 2.
    SocketAddress local;
    local.length = sizeof(local.storage);
    getsockname((*links0)[1][s].fd, reinterpret_cast<sockaddr*>(&local.storage), &local.length);
    EXPECT_EQ(local.toString(), listeners[0][s % 2].address.toString()) << "connection " << s;
  }
  for (auto* links : {&*links0, &mesh1.value()}) {
    for (auto& row : *links) {
      for (auto& l : row) close(l.fd);
    }
  }
  for (auto& ls : listeners) {
    for (auto& l : ls) close(l.fd);
  }
}

TEST(Rails, RanksWithDifferentRailCountsFailAlike) {
  auto lo = iface("lo", "127.0.0.1");
  std::vector<tcp::Listener> two = {tcp::openListener(lo).value(), tcp::openListener(lo).value()};
  std::vector<tcp::Listener> one = {tcp::openListener(lo).value()};
  const std::vector<std::string> addresses = {
      tcp::formatRails({{two[0].address}, {two[1].address}}), tcp::formatRails({{one[0].address}})};
  tcp::MeshParams p{keyOf("test-secret")};
  p.size = 2;
  p.nsocks = 2;
  for (int rank : {0, 1}) {
    p.rank = rank;
    const auto mesh = tcp::buildMesh(rank == 0 ? two : one, addresses, p, soon(5));
    ASSERT_EQ(mesh.status().code(), StatusCode::kMismatch) << mesh.status().toString();
    EXPECT_NE(mesh.status().message().find("NANOCCL_SOCKET_IFNAME"), std::string::npos)
        << mesh.status().message();
    EXPECT_NE(mesh.status().message().find(rank == 0 ? "listens on 1 rail" : "listens on 2 rail"),
              std::string::npos)
        << mesh.status().message();
  }
  for (auto& l : two) close(l.fd);
  close(one[0].fd);
}

// The settings every rank must share travel in the published addresses: a rank whose settings
// differ fails setup on every rank, each naming both values, before any connection is made.
TEST(TcpSettings, ARankWhoseSettingsDifferFailsEveryRankBeforeAnyConnection) {
  auto lo = iface("lo", "127.0.0.1");
  std::vector<tcp::Listener> listeners = {tcp::openListener(lo).value(),
                                          tcp::openListener(lo).value()};
  const std::vector<std::string> addresses = {
      tcp::formatRails({{listeners[0].address}}, "nsocks=2 stripe_min_bytes=65536 encrypt=0"),
      tcp::formatRails({{listeners[1].address}}, "nsocks=3 stripe_min_bytes=65536 encrypt=0")};
  tcp::MeshParams p{keyOf("test-secret")};
  p.size = 2;
  p.nsocks = 2;
  for (int rank : {0, 1}) {
    p.rank = rank;
    const auto mesh = tcp::buildMesh({listeners[rank]}, addresses, p, soon(5));
    ASSERT_EQ(mesh.status().code(), StatusCode::kMismatch) << mesh.status().toString();
    for (const char* named : {"nsocks=2", "nsocks=3", rank == 0 ? "rank 1" : "rank 0"}) {
      EXPECT_NE(mesh.status().message().find(named), std::string::npos) << mesh.status().message();
    }
  }
  // Rank 1 never connected: no connection waits at rank 0's listener (nor at its own).
  for (const tcp::Listener& l : listeners) {
    pollfd pf{l.fd, POLLIN, 0};
    EXPECT_EQ(poll(&pf, 1, 100), 0) << "a connection was made to " << l.address.toString();
    close(l.fd);
  }
}

// A rank that dials before its peer listens (a restarted peer, a slow interface) is refused,
// and dials again until the deadline: rank 1's connections are refused while nothing listens
// at rank 0's address; once rank 0 listens there, the mesh is built.
TEST(TcpSetup, ARefusedConnectIsDialledAgain) {
  auto lo = iface("lo", "127.0.0.1");
  // Rank 0's port is bound but does not listen yet: connects to it are refused, and no one
  // else can take it.
  tcp::Listener l0{socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0), "lo", lo.address};
  l0.address.setPort(0);
  ASSERT_EQ(bind(l0.fd, reinterpret_cast<const sockaddr*>(&l0.address.storage), l0.address.length),
            0) << strerror(errno);
  l0.address.length = sizeof(l0.address.storage);
  getsockname(l0.fd, reinterpret_cast<sockaddr*>(&l0.address.storage), &l0.address.length);
  std::vector<tcp::Listener> l1 = {tcp::openListener(lo).value()};
  const std::vector<std::string> addresses = {tcp::formatRails({{l0.address}}),
                                              tcp::formatRails({{l1[0].address}})};
  tcp::MeshParams p{keyOf("test-secret")};
  p.size = 2;
  p.nsocks = 2;
  p.rank = 1;
  auto mesh1 = std::async(std::launch::async,
                          [&] { return tcp::buildMesh(l1, addresses, p, soon(20)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_EQ(mesh1.wait_for(std::chrono::seconds(0)), std::future_status::timeout)
      << mesh1.get().status().toString();
  ASSERT_EQ(listen(l0.fd, 16), 0);
  tcp::MeshParams p0 = p;
  p0.rank = 0;
  auto mesh0 = tcp::buildMesh({l0}, addresses, p0, soon(20));
  auto links1 = mesh1.get();
  ASSERT_TRUE(mesh0.isOk()) << mesh0.status().toString();
  ASSERT_TRUE(links1.isOk()) << links1.status().toString();
  EXPECT_EQ((*links1)[0].size(), 2u);
  for (auto* links : {&mesh0.value(), &links1.value()}) {
    for (auto& row : *links) {
      for (auto& l : row) close(l.fd);
    }
  }
  close(l0.fd);
  close(l1[0].fd);
}

// NANOCCL_TCP_CONGESTION: every connection of the mesh, connected and accepted, runs the
// algorithm asked for; one the kernel does not have fails listen() on that rank, naming the
// setting and what the host allows.
TEST(TcpCongestion, EveryConnectionRunsItAndAnUnknownOneIsNamed) {
  auto lo = iface("lo", "127.0.0.1");
  std::vector<tcp::Listener> listeners = {tcp::openListener(lo).value(),
                                          tcp::openListener(lo).value()};
  const std::vector<std::string> addresses = {tcp::formatRails({{listeners[0].address}}),
                                              tcp::formatRails({{listeners[1].address}})};
  auto params = [](int rank) {
    tcp::MeshParams p{keyOf("test-secret")};
    p.rank = rank;
    p.size = 2;
    p.nsocks = 2;
    p.tcpCongestion = "reno";  // built into every Linux kernel and allowed by default
    return p;
  };
  const tcp::MeshParams p0 = params(0), p1 = params(1);
  auto mesh0 = std::async(std::launch::async, [&] {
    return tcp::buildMesh({listeners[0]}, addresses, p0, soon(20));
  });
  auto mesh1 = tcp::buildMesh({listeners[1]}, addresses, p1, soon(20));
  auto links0 = mesh0.get();
  ASSERT_TRUE(links0.isOk()) << links0.status().toString();
  ASSERT_TRUE(mesh1.isOk()) << mesh1.status().toString();
  for (const auto& link : {(*links0)[1][0], (*links0)[1][1], (*mesh1)[0][0], (*mesh1)[0][1]}) {
    char name[16] = {};
    socklen_t len = sizeof(name);
    ASSERT_EQ(getsockopt(link.fd, IPPROTO_TCP, TCP_CONGESTION, name, &len), 0);
    EXPECT_STREQ(name, "reno");
  }
  for (auto* links : {&*links0, &mesh1.value()}) {
    for (auto& row : *links) {
      for (auto& l : row) close(l.fd);
    }
  }
  for (auto& l : listeners) close(l.fd);

  Config cfg = loopbackConfig("epoll", 1);
  ASSERT_TRUE(cfg.set("tcp_congestion", "nosuchcc").isOk());  // well formed, not a kernel's
  auto t = createTransport("tcp", optionsFor(0, 2, cfg)).value();
  const auto listened = t->listen();
  ASSERT_EQ(listened.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(listened.status().message().find("NANOCCL_TCP_CONGESTION=nosuchcc"),
            std::string::npos) << listened.status().message();
  EXPECT_NE(listened.status().message().find("this host allows: "), std::string::npos)
      << listened.status().message();
}

// NANOCCL_TCP_CONGESTION=auto leaves the host's default unless it is BBR, which it replaces by
// cubic (or reno); "host" leaves BBR too; a name is set as it is. The listener's algorithm
// stands in for the host's default here (chooseCongestionControl reads the socket's own).
TEST(TcpCongestion, AutoReplacesBbrAndKeepsAnyOtherDefault) {
  auto lo = iface("lo", "127.0.0.1");
  tcp::Listener l = tcp::openListener(lo).value();
  auto running = [&] {
    char name[16] = {};
    socklen_t len = sizeof(name) - 1;
    EXPECT_EQ(getsockopt(l.fd, IPPROTO_TCP, TCP_CONGESTION, name, &len), 0);
    return std::string(name);
  };
  ASSERT_TRUE(tcp::setCongestionControl(l.fd, "reno").isOk());
  EXPECT_EQ(tcp::chooseCongestionControl(l.fd, "auto").value(), "");  // not BBR: kept
  EXPECT_EQ(running(), "reno");
  EXPECT_EQ(tcp::chooseCongestionControl(l.fd, "host").value(), "");
  EXPECT_EQ(running(), "reno");
  const auto bad = tcp::chooseCongestionControl(l.fd, "nosuchcc");
  ASSERT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("NANOCCL_TCP_CONGESTION=nosuchcc"), std::string::npos);

  const bool haveBbr = tcp::setCongestionControl(l.fd, "bbr").isOk();
  if (haveBbr) {
    EXPECT_EQ(tcp::chooseCongestionControl(l.fd, "host").value(), "");
    EXPECT_EQ(running(), "bbr");
    auto chosen = tcp::chooseCongestionControl(l.fd, "auto");
    ASSERT_TRUE(chosen.isOk()) << chosen.status().toString();
    EXPECT_TRUE(*chosen == "cubic" || *chosen == "reno") << *chosen;
    EXPECT_EQ(running(), *chosen);
    EXPECT_EQ(tcp::chooseCongestionControl(l.fd, "bbr").value(), "bbr");  // asked for by name
    EXPECT_EQ(running(), "bbr");
  }
  close(l.fd);
  if (!haveBbr) GTEST_SKIP() << "this kernel has no bbr: the BBR half was not run";
}

}  // namespace
}  // namespace nanoccl::testing
