#include "common/status.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>

namespace nanoccl {
namespace {

TEST(StatusTest, DefaultIsOk) {
  const Status s;
  EXPECT_TRUE(s.isOk());
  EXPECT_EQ(s.code(), StatusCode::kOk);
  EXPECT_EQ(s.toString(), "OK");
  EXPECT_TRUE(Status::ok().isOk());
}

TEST(StatusTest, HelpersCarryCodeAndMessage) {
  const struct {
    Status status;
    StatusCode code;
    const char* name;
  } cases[] = {
      {invalidArgument("m"), StatusCode::kInvalidArgument, "InvalidArgument"},
      {mismatchError("m"), StatusCode::kMismatch, "Mismatch"},
      {timeoutError("m"), StatusCode::kTimeout, "Timeout"},
      {peerError("m"), StatusCode::kPeerError, "PeerError"},
      {protocolError("m"), StatusCode::kProtocolError, "ProtocolError"},
      {abortedError("m"), StatusCode::kAborted, "Aborted"},
      {unavailableError("m"), StatusCode::kUnavailable, "Unavailable"},
      {internalError("m"), StatusCode::kInternal, "Internal"},
  };
  for (const auto& c : cases) {
    EXPECT_FALSE(c.status.isOk()) << c.name;
    EXPECT_EQ(c.status.code(), c.code) << c.name;
    EXPECT_EQ(c.status.message(), "m");
    EXPECT_STREQ(statusCodeName(c.code), c.name);
    EXPECT_EQ(c.status.toString(), std::string(c.name) + ": m");
  }
  EXPECT_STREQ(statusCodeName(StatusCode::kOk), "OK");
}

TEST(StatusTest, WithContextPrefixesFailuresOnly) {
  const Status failed = mismatchError("rank 0 called allreduce, rank 1 called broadcast");
  const Status wrapped = failed.withContext("allreduce #7: ");
  EXPECT_EQ(wrapped.code(), StatusCode::kMismatch);
  EXPECT_EQ(wrapped.message(), "allreduce #7: rank 0 called allreduce, rank 1 called broadcast");
  EXPECT_EQ(failed.message(), "rank 0 called allreduce, rank 1 called broadcast");  // a copy
  EXPECT_TRUE(Status::ok().withContext("ignored: ").isOk());
  EXPECT_EQ(Status::ok().withContext("ignored: ").message(), "");
}

TEST(StatusTest, SystemErrorNamesTheCallAndTheError) {
  const Status s = systemError("connect", ECONNREFUSED);
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_NE(s.message().find("connect"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(std::strerror(ECONNREFUSED)), std::string::npos) << s.message();
}

TEST(ResultTest, HoldsAValue) {
  Result<int> r = 42;
  ASSERT_TRUE(r.isOk());
  EXPECT_TRUE(r.status().isOk());
  EXPECT_EQ(r.value(), 42);
  EXPECT_EQ(*r, 42);
  *r = 7;
  EXPECT_EQ(r.value(), 7);
}

TEST(ResultTest, HoldsAStatus) {
  const Result<std::string> r = timeoutError("waited 5 s for rank 3");
  EXPECT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), StatusCode::kTimeout);
  EXPECT_EQ(r.status().message(), "waited 5 s for rank 3");
}

TEST(ResultTest, MoveOnlyValues) {
  Result<std::unique_ptr<int>> r = std::make_unique<int>(5);
  ASSERT_TRUE(r.isOk());
  EXPECT_EQ(*r.value(), 5);
  std::unique_ptr<int> taken = std::move(r).value();
  ASSERT_NE(taken, nullptr);
  EXPECT_EQ(*taken, 5);
}

TEST(ResultTest, ArrowReachesMembers) {
  Result<std::string> r = std::string("abc");
  EXPECT_EQ(r->size(), 3u);
}

Status failAt(int fail, int* reached) {
  for (int i = 0; i < 3; ++i) {
    *reached = i;
    NANOCCL_CHECK(i == fail ? peerError("step " + std::to_string(i)) : Status::ok());
  }
  return Status::ok();
}

TEST(StatusMacrosTest, CheckReturnsTheFirstFailure) {
  int reached = -1;
  EXPECT_TRUE(failAt(-1, &reached).isOk());
  EXPECT_EQ(reached, 2);
  const Status s = failAt(1, &reached);
  EXPECT_EQ(s.code(), StatusCode::kPeerError);
  EXPECT_EQ(s.message(), "step 1");
  EXPECT_EQ(reached, 1);
}

Result<int> parsePositive(int x) {
  if (x <= 0) return invalidArgument("not positive: " + std::to_string(x));
  return x;
}

Result<int> doubled(int x) {
  NANOCCL_ASSIGN_OR_RETURN(const int v, parsePositive(x));
  return 2 * v;
}

Status assignTwice(int a, int b, int* out) {
  NANOCCL_ASSIGN_OR_RETURN(const int x, parsePositive(a));
  NANOCCL_ASSIGN_OR_RETURN(const int y, parsePositive(b));  // two on one scope: distinct temps
  *out = x + y;
  return Status::ok();
}

TEST(StatusMacrosTest, AssignOrReturn) {
  const Result<int> good = doubled(21);
  ASSERT_TRUE(good.isOk());
  EXPECT_EQ(good.value(), 42);

  const Result<int> bad = doubled(-1);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "not positive: -1");

  int out = 0;
  EXPECT_TRUE(assignTwice(1, 2, &out).isOk());
  EXPECT_EQ(out, 3);
  EXPECT_FALSE(assignTwice(1, 0, &out).isOk());
}

}  // namespace
}  // namespace nanoccl
