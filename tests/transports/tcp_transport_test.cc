// The TCP transport's own setup: a world of one, settings and encryption that ranks disagree
// on, unknown interfaces, engines and transports. What every transport must do is in
// conformance_test.cc; strangers and garbage on the wire in handshake_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "tests/transports/mesh.h"

namespace nanoccl::testing {
namespace {

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
