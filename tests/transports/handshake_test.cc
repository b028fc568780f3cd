// Strangers, garbage and liars at the TCP transport's door: none gets in, none crashes it, and
// the job goes on. Raw sockets play the strangers; the wire structs come from wire.h.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <future>
#include <random>

#include "tests/transports/mesh.h"
#include "transports/tcp/address.h"
#include "transports/tcp/wire.h"

namespace nanoccl::testing {
namespace {

using tcp::Hello;
using tcp::HelloAck;

int dial(const std::string& address) {
  auto a = tcp::SocketAddress::parse(address);
  EXPECT_TRUE(a.isOk());
  const int fd = socket(a->family(), SOCK_STREAM | SOCK_CLOEXEC, 0);
  EXPECT_EQ(connect(fd, reinterpret_cast<const sockaddr*>(&a->storage), a->length), 0);
  return fd;
}

// Whether the other side closed `fd` within `ms` (a read returns 0 or an error).
bool closedByPeer(int fd, int ms = 5000) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, ms) <= 0) return false;
  char b[256];
  return recv(fd, b, sizeof(b), 0) <= 0;
}

Hello helloFor(int rank, int size, const std::string& secret, int nsocks = 1, int socket = 0) {
  Hello h{};
  h.magic = kMagic;
  h.version = kVersion;
  h.socketIndex = static_cast<uint16_t>(socket);
  h.rank = rank;
  h.size = size;
  h.nsocks = nsocks;
  h.secretBytes = static_cast<uint32_t>(secret.size());
  h.commIdHash = hashCommId("test-comm");
  h.stripeMinBytes = 64 * 1024;
  std::memcpy(h.secret, secret.data(), secret.size());
  return h;
}

class HandshakeTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { skipIfUnavailable(GetParam()); }
};

TEST_P(HandshakeTest, StrangersAreTurnedAwayAndTheJobGoesOn) {
  const Config cfg = loopbackConfig(GetParam(), 1);
  auto t0 = createTransport("tcp", optionsFor(0, 2, cfg)).value();
  auto t1 = createTransport("tcp", optionsFor(1, 2, cfg)).value();
  const std::string a0 = t0->listen().value();
  const std::string a1 = t1->listen().value();

  // Rank 0 starts waiting for rank 1; four strangers come first.
  auto setup0 = std::async(std::launch::async, [&] { return t0->connect({a0, a1}, soon(20)); });
  std::vector<int> strangers;
  {  // the wrong secret
    const int fd = dial(a0);
    const Hello h = helloFor(1, 2, "not-the-secret");
    ASSERT_EQ(send(fd, &h, sizeof(h), 0), static_cast<ssize_t>(sizeof(h)));
    strangers.push_back(fd);
  }
  {  // random bytes
    const int fd = dial(a0);
    std::mt19937 rng(1);
    char junk[4096];
    for (char& c : junk) c = static_cast<char>(rng());
    send(fd, junk, sizeof(junk), MSG_NOSIGNAL);
    strangers.push_back(fd);
  }
  {  // the right magic and an absurd secret length
    const int fd = dial(a0);
    Hello h = helloFor(1, 2, "test-secret");
    h.secretBytes = 0xffffffffu;
    ASSERT_EQ(send(fd, &h, sizeof(h), 0), static_cast<ssize_t>(sizeof(h)));
    strangers.push_back(fd);
  }
  const int silent = dial(a0);  // says nothing at all
  for (int fd : strangers) EXPECT_TRUE(closedByPeer(fd)) << "stranger was not turned away";

  // The real rank 1 arrives: setup completes despite the silent stranger.
  const Status st1 = t1->connect({a0, a1}, soon(20));
  ASSERT_TRUE(st1.isOk()) << st1.toString();
  ASSERT_TRUE(setup0.get().isOk());
  uint32_t x = 77, y = 0;
  auto r = t1->irecv(0, collectiveEnvelope(1, 0, 4), &y, 4);
  ASSERT_TRUE(t0->isend(1, collectiveEnvelope(1, 0, 4), &x, 4)->wait(soon()).isOk());
  ASSERT_TRUE(r->wait(soon()).isOk());
  EXPECT_EQ(y, 77u);
  for (int fd : strangers) close(fd);
  close(silent);
  // After setup the port is closed: nobody else can even connect.
  auto late = tcp::SocketAddress::parse(a0).value();
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
                            [&] { return t0_->connect({a0, "127.0.0.1:1"}, soon(20)); });
    const int fd = dial(a0);
    const Hello h = helloFor(1, 2, "test-secret");
    EXPECT_EQ(send(fd, &h, sizeof(h), 0), static_cast<ssize_t>(sizeof(h)));
    HelloAck ack{};
    EXPECT_EQ(recv(fd, &ack, sizeof(ack), MSG_WAITALL), static_cast<ssize_t>(sizeof(ack)));
    EXPECT_EQ(ack.verdict, tcp::HelloVerdict::kAccepted);
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
  FrameHeader h{};
  h.magic = kMagic;
  h.version = kVersion;
  h.kind = FrameKind::kAbort;
  h.total = h.length = text.size();
  ASSERT_EQ(send(fd, &h, sizeof(h), 0), static_cast<ssize_t>(sizeof(h)));
  ASSERT_EQ(send(fd, text.data(), text.size(), 0), static_cast<ssize_t>(text.size()));
  const Status st = r->wait(soon());
  ASSERT_EQ(st.code(), StatusCode::kPeerError);
  EXPECT_NE(st.message().find("out of memory"), std::string::npos) << st.message();
  close(fd);
}

INSTANTIATE_TEST_SUITE_P(Engines, HandshakeTest, ::testing::Values("epoll", "uring"));
INSTANTIATE_TEST_SUITE_P(Engines, InsiderTest, ::testing::Values("epoll", "uring"));

TEST(InterfaceSpec, FollowsNcclSyntax) {
  using tcp::interfaceMatches;
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
    auto a = tcp::SocketAddress::parse(s);
    ASSERT_TRUE(a.isOk()) << s;
    EXPECT_EQ(a->toString(), s);
  }
  for (const std::string s : {"", "1.2.3.4", "1.2.3.4:0", "1.2.3.4:70000", "nohost:1", "[::1:3"}) {
    EXPECT_FALSE(tcp::SocketAddress::parse(s).isOk()) << s;
  }
}

}  // namespace
}  // namespace nanoccl::testing
