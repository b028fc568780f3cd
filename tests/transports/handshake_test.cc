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
#include <thread>

#include "common/secret.h"
#include "tests/transports/mesh.h"
#include "tests/transports/raw_peer.h"
#include "transports/tcp/address.h"
#include "transports/tcp/handshake.h"
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

}  // namespace
}  // namespace nanoccl::testing
