// The TCP transport's own setup: a world of one, settings and encryption that ranks disagree
// on, unknown interfaces, engines and transports. What every transport must do is in
// conformance_test.cc; strangers and garbage on the wire in handshake_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <numeric>
#include <random>

#include "tests/transports/mesh.h"
#include "transports/tcp/address.h"

namespace nanoccl::testing {
namespace {

TEST(TcpTransportSetup, WorldOfOneNeedsNoSockets) {
  auto ts = makeMesh(1, loopbackConfig("epoll"));
  ASSERT_EQ(ts.size(), 1u);
  uint8_t x = 0;
  EXPECT_EQ(ts[0]->isend(0, collectiveEnvelope(1, 0, 1), &x, 1)->wait(soon()).code(),
            StatusCode::kInvalidArgument);
}

// The settings every rank must share travel in the published address (address.h), compared
// by every rank before it connects.
TEST(TcpTransportSetup, ThePublishedAddressCarriesTheSharedSettings) {
  Config c = loopbackConfig("epoll", 3);
  c.encrypt = true;
  auto t = createTransport("tcp", optionsFor(0, 2, c)).value();
  const std::string address = t->listen().value();
  EXPECT_EQ(tcp::publishedSettings(address), "size=2 nsocks=3 stripe_min_bytes=65536 encrypt=1")
      << address;
  EXPECT_EQ(tcp::parseRails(address).value().size(), 1u) << address;
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
  // (NANOCCL_TCP_ENGINE is checked when parsed; a Config made in code meets the engine's own
  // check before any connection is made.)
  Config c = loopbackConfig("io_uring_please");
  auto t = createTransport("tcp", optionsFor(0, 2, c));
  ASSERT_TRUE(t.isOk());
  auto a = t.value()->listen();
  ASSERT_TRUE(a.isOk());
  EXPECT_EQ(t.value()->connect({a.value(), ""}, soon()).code(), StatusCode::kInvalidArgument);
}

// abort() from another thread while the progress thread is stuck (a completion callback that
// blocks, against the contract): abort returns after its bounded wait instead of hanging, the
// requests it could not release stay pending meanwhile, and once the thread moves on they
// fail with the reason.
TEST(TcpTransportAbort, AStuckProgressThreadDoesNotHangAbort) {
  auto ts = makeMesh(2, loopbackConfig("epoll", 1));
  ASSERT_EQ(ts.size(), 2u);
  std::atomic<bool> release{false};
  std::atomic<bool> inCallback{false};
  uint8_t x = 1, y = 0;
  std::vector<uint8_t> big(1 << 20);
  auto first = ts[1]->irecv(0, collectiveEnvelope(1, 0, 1), &y, 1);
  auto later = ts[1]->irecv(0, collectiveEnvelope(1, 1, 1), big.data(), big.size());
  first->setCallback([&](const Status&, int) {
    inCallback = true;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!release && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  ASSERT_TRUE(ts[0]->isend(1, collectiveEnvelope(1, 0, 1), &x, 1)->wait(soon()).isOk());
  while (!inCallback) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ts[1]->abort(abortedError("rank 1: gave up"));  // returns, though nothing could be handled
  EXPECT_FALSE(later->test());  // still pending: not released behind the stuck thread's back
  release = true;
  const Status st = later->wait(soon());
  EXPECT_EQ(st.code(), StatusCode::kAborted) << st.toString();
}

// The same stuck thread, with warnings hidden (NANOCCL_DEBUG=NONE: the log statements are not
// evaluated): abort() still shuts the sockets down from its own thread after its bounded wait,
// so the peer learns at once that the connection closed, before the stuck thread moves on.
TEST(TcpTransportAbort, AStuckProgressThreadsSocketsCloseEvenWithLoggingOff) {
  setenv("NANOCCL_DEBUG", "NONE", 1);  // read once per process: first thing (ctest runs each
                                       // test in a process of its own)
  auto ts = makeMesh(2, loopbackConfig("epoll", 1));
  ASSERT_EQ(ts.size(), 2u);
  std::atomic<bool> release{false};
  std::atomic<bool> inCallback{false};
  uint8_t x = 1, y = 0, z = 0;
  auto first = ts[1]->irecv(0, collectiveEnvelope(1, 0, 1), &y, 1);
  first->setCallback([&](const Status&, int) {
    inCallback = true;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!release && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  auto never = ts[0]->irecv(1, collectiveEnvelope(2, 0, 1), &z, 1);  // rank 1 never sends it
  ASSERT_TRUE(ts[0]->isend(1, collectiveEnvelope(1, 0, 1), &x, 1)->wait(soon()).isOk());
  while (!inCallback) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ts[1]->abort(abortedError("rank 1: gave up"));
  const Status st = never->wait(Deadline::after(std::chrono::seconds(5)));
  EXPECT_EQ(st.code(), StatusCode::kPeerError) << st.toString();
  release = true;
}

}  // namespace
}  // namespace nanoccl::testing
