// The IoEngine's sealed sockets (transports/tcp/io_engine.h), on both engines: what one end
// sends, cut into iov entries, the other end receives cut the same way, through AES-GCM
// records (the stage refilled as it drains, empty entries sending nothing); a record changed
// on the way completes the receive with -EBADMSG and the reason. The transport's use of them
// is conformance_test.cc's encrypted rows and handshake_test.cc's TamperTest.
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tests/transports/mesh.h"
#include "transports/tcp/io_engine.h"

namespace nanoccl::testing {
namespace {

class SealedSocketTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    skipIfUnavailable(GetParam());
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds_), 0);
    for (auto* e : {&a_, &b_}) *e = std::move(tcp::createEngine(GetParam()).value());
    crypto::Key ab{}, ba{};
    for (size_t i = 0; i < ab.size(); ++i) {
      ab[i] = static_cast<uint8_t>(i + 1);
      ba[i] = static_cast<uint8_t>(2 * i + 7);
    }
    const tcp::IoEngine::Keys keysA{ab, ba}, keysB{ba, ab};
    ASSERT_TRUE(a_->addSocket(fds_[0], &keysA).isOk());
    ASSERT_TRUE(b_->addSocket(fds_[1], &keysB).isOk());
  }
  void TearDown() override {
    a_.reset();
    b_.reset();
    for (int fd : fds_) close(fd);
  }

  // Polls both engines until `n` completions came (or a bound of polls).
  std::vector<tcp::IoCompletion> await(size_t n) {
    std::vector<tcp::IoCompletion> out;
    for (int i = 0; i < 2000 && out.size() < n; ++i) {
      for (auto* e : {&a_, &b_}) {
        EXPECT_TRUE((*e)->poll(1, [&](const tcp::IoCompletion& c) { out.push_back(c); }).isOk());
      }
    }
    return out;
  }

  int fds_[2] = {-1, -1};
  std::unique_ptr<tcp::IoEngine> a_, b_;
  int sendCookie_ = 0, recvCookie_ = 0;
};

TEST_P(SealedSocketTest, EntriesCrossWholeInRecords) {
  // A header-like entry, one of four records (two batches of the stage), an empty one, a small
  // one; received cut the same way, in order.
  std::vector<std::string> entries = {std::string(32, 'h'), std::string(4 * tcp::kRecordBytes, 0),
                                      std::string(), std::string(5, 't')};
  for (size_t i = 0; i < entries[1].size(); ++i) entries[1][i] = static_cast<char>(i * 31 + 7);
  iovec iov[4];
  size_t total = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    iov[i] = {entries[i].data(), entries[i].size()};
    total += entries[i].size();
  }
  ASSERT_TRUE(a_->postSend(fds_[0], iov, 4, &sendCookie_).isOk());
  bool sent = false;
  for (const std::string& want : entries) {
    if (want.empty()) continue;  // nothing crosses for it
    std::string got(want.size(), '\0');
    ASSERT_TRUE(b_->postRecv(fds_[1], got.data(), got.size(), &recvCookie_).isOk());
    bool received = false;
    while (!received) {
      const auto done = await(1);
      ASSERT_FALSE(done.empty()) << "no completion";
      for (const tcp::IoCompletion& c : done) {
        ASSERT_TRUE(c.error.isOk()) << c.error.toString();
        if (c.cookie == &sendCookie_) {
          EXPECT_EQ(c.result, static_cast<int64_t>(total));  // the caller's bytes, not the wire's
          EXPECT_TRUE(c.send);
          sent = true;
        } else {
          EXPECT_EQ(c.result, static_cast<int64_t>(want.size()));
          EXPECT_FALSE(c.send);
          received = true;
        }
      }
    }
    EXPECT_EQ(got, want);
  }
  if (!sent) {
    const auto done = await(1);
    ASSERT_EQ(done.size(), 1u);
    EXPECT_EQ(done[0].cookie, &sendCookie_);
  }
  // sendNow seals too: an abort-like frame arrives whole.
  std::string header(32, 'a'), text = "rank 0: why";
  const iovec now[2] = {{header.data(), header.size()}, {text.data(), text.size()}};
  a_->sendNow(fds_[0], now, 2);
  std::string gotHeader(32, '\0'), gotText(text.size(), '\0');
  for (std::string* s : {&gotHeader, &gotText}) {
    ASSERT_TRUE(b_->postRecv(fds_[1], s->data(), s->size(), &recvCookie_).isOk());
    const auto done = await(1);
    ASSERT_EQ(done.size(), 1u);
    EXPECT_EQ(done[0].result, static_cast<int64_t>(s->size())) << done[0].error.toString();
  }
  EXPECT_EQ(gotHeader, header);
  EXPECT_EQ(gotText, text);
}

TEST_P(SealedSocketTest, ARecordChangedOnTheWayIsRefusedWithItsReason) {
  std::string forged(32 + crypto::kTagBytes, 'x');  // a record not sealed with the key
  ASSERT_EQ(write(fds_[0], forged.data(), forged.size()), static_cast<ssize_t>(forged.size()));
  std::string got(32, '\0');
  ASSERT_TRUE(b_->postRecv(fds_[1], got.data(), got.size(), &recvCookie_).isOk());
  const auto done = await(1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].result, -EBADMSG);
  EXPECT_NE(done[0].error.message().find("failed authentication"), std::string::npos)
      << done[0].error.toString();
}

INSTANTIATE_TEST_SUITE_P(Engines, SealedSocketTest, ::testing::Values("epoll", "uring"));

}  // namespace
}  // namespace nanoccl::testing
