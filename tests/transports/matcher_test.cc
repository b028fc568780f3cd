// The Matcher on its own, fed frame headers by hand as a transport would: what it accepts,
// where it puts bytes, and every check it makes on lanes and parts (the conformance suite runs
// the same rules end to end through each transport).
#include "transports/matcher.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tests/transports/mesh.h"

namespace nanoccl::testing {
namespace {

// Rank 0 of 3, two lanes per peer: messages of 8 bytes or more are striped over both lanes
// (half each); smaller ones and point-to-point travel whole on lane (seq + tag) % 2 or 0.
MatcherOptions twoLanes(bool inOrder = false) {
  MatcherOptions o;
  o.rank = 0;
  o.size = 3;
  o.lanes = 2;
  o.landsInOrder = inOrder;
  o.parts = [](OpType op, uint64_t seq, uint32_t tag, uint64_t total, int) {
    if (op == OpType::kSendRecv) return std::vector<Part>{{0, 0, total}};
    if (total < 8) return std::vector<Part>{{static_cast<int>((seq + tag) % 2), 0, total}};
    return std::vector<Part>{{0, 0, total / 2}, {1, total / 2, total - total / 2}};
  };
  return o;
}

std::shared_ptr<BasicRequest> recv(int peer, const Envelope& env, void* buf, size_t bytes) {
  return std::make_shared<BasicRequest>(false, peer, env, static_cast<char*>(buf), bytes);
}

FrameHeader frame(const Envelope& env, uint64_t total, uint64_t offset, uint64_t length,
                  uint64_t seq = 0) {
  return dataFrameHeader(env.fingerprint, env.tag, seq ? seq : env.fingerprint.seq, total,
                         offset, length);
}

// Hands `length` bytes of `src` at `offset` to the matcher as one frame on `lane`.
Status deliver(Matcher& m, int peer, int lane, const Envelope& env, const std::string& src,
               uint64_t offset, uint64_t length) {
  auto msg = m.onFrame(peer, lane, frame(env, src.size(), offset, length));
  if (!msg.isOk()) return msg.status();
  std::memcpy(msg.value()->dest(offset), src.data() + offset, length);
  m.landed(msg.value(), length);
  return Status::ok();
}

TEST(Matcher, StripesMeetTheirReceiveInAnyOrder) {
  Matcher m(twoLanes());
  const std::string src = "0123456789abcdef";
  const auto env = collectiveEnvelope(1, 0, 16);
  std::string dst(16, '.');
  auto r = recv(1, env, dst.data(), dst.size());
  ASSERT_TRUE(m.postRecv(r).isOk());
  ASSERT_TRUE(deliver(m, 1, 1, env, src, 8, 8).isOk());  // the second stripe first
  EXPECT_FALSE(r->test());
  ASSERT_TRUE(deliver(m, 1, 0, env, src, 0, 8).isOk());
  EXPECT_TRUE(r->test());
  EXPECT_EQ(dst, src);
  EXPECT_EQ(r->source(), 1);
  EXPECT_FALSE(m.hasPending());
}

// A receive that times out asks which lanes it still waits on: only messages that have begun
// to arrive are listed (a lane that went down mid-stripe), not receives that saw nothing.
TEST(Matcher, AwaitedLanesNameTheMissingStripe) {
  Matcher m(twoLanes());
  const std::string src = "0123456789abcdef";
  const auto env = collectiveEnvelope(1, 0, 16);
  std::string dst(16, '.');
  auto r = recv(1, env, dst.data(), dst.size());
  ASSERT_TRUE(m.postRecv(r).isOk());
  EXPECT_TRUE(m.awaitedLanes(1).empty());  // nothing arrived: the peer may not have called
  ASSERT_TRUE(deliver(m, 1, 0, env, src, 0, 8).isOk());  // lane 0's stripe, not lane 1's
  const std::vector<Matcher::AwaitedLane> waits = m.awaitedLanes(1);
  ASSERT_EQ(waits.size(), 1u);
  EXPECT_EQ(waits[0].lane, 1);
  EXPECT_EQ(waits[0].bytes, 8u);
  EXPECT_TRUE(m.awaitedLanes(2).empty());
  ASSERT_TRUE(deliver(m, 1, 1, env, src, 8, 8).isOk());
  EXPECT_TRUE(r->test());
  EXPECT_TRUE(m.awaitedLanes(1).empty());
}

// A receive nothing has arrived for is listed once the peer has sent frames of a later call on
// another lane: the peer made this call, and what it sent on the receive's lane is stuck (a
// rail brought down after the sender's bytes left it).
TEST(Matcher, AwaitedLanesNameALaneBehindAPeerThatWentOn) {
  Matcher m(twoLanes());
  const std::string small = "0123";  // whole on lane (seq + tag) % 2
  const auto mine = collectiveEnvelope(1, 0, 4);  // call #1, tag 0: lane 1
  std::string dst(4, '.');
  auto r = recv(1, mine, dst.data(), dst.size());
  ASSERT_TRUE(m.postRecv(r).isOk());
  // Another message of the same call on lane 0: the peer may still be sending call #1.
  ASSERT_TRUE(deliver(m, 1, 0, collectiveEnvelope(1, 1, 4), small, 0, 4).isOk());
  EXPECT_TRUE(m.awaitedLanes(1).empty());
  // Call #2 on lane 0: the peer has gone past call #1, whose message on lane 1 never came.
  ASSERT_TRUE(deliver(m, 1, 0, collectiveEnvelope(2, 0, 4), small, 0, 4).isOk());
  const std::vector<Matcher::AwaitedLane> waits = m.awaitedLanes(1);
  ASSERT_EQ(waits.size(), 1u);
  EXPECT_EQ(waits[0].lane, 1);
  EXPECT_EQ(waits[0].bytes, 4u);
  EXPECT_TRUE(m.awaitedLanes(2).empty());
  ASSERT_TRUE(deliver(m, 1, 1, mine, small, 0, 4).isOk());  // it comes after all
  EXPECT_TRUE(r->test());
  EXPECT_EQ(dst, small);
  EXPECT_TRUE(m.awaitedLanes(1).empty());
}

TEST(Matcher, AnEarlyMessageIsHeldAndCopiedOutWhenItsReceiveComes) {
  for (bool inOrder : {false, true}) {
    Matcher m(twoLanes(inOrder));
    const std::string src = "0123456789abcdef";
    const auto env = collectiveEnvelope(1, 0, 16);
    ASSERT_TRUE(deliver(m, 2, 0, env, src, 0, 8).isOk());  // half of it, unexpected
    EXPECT_FALSE(m.hasPending());
    std::string dst(16, '.');
    auto r = recv(2, env, dst.data(), dst.size());
    ASSERT_TRUE(m.postRecv(r).isOk());
    EXPECT_FALSE(r->test());
    EXPECT_TRUE(m.hasPending());
    ASSERT_TRUE(deliver(m, 2, 1, env, src, 8, 8).isOk());
    ASSERT_TRUE(r->test());
    EXPECT_EQ(dst, src) << "landsInOrder " << inOrder;
  }
}

TEST(Matcher, AFrameOnALaneItsMessageDoesNotUseIsAProtocolError) {
  Matcher m(twoLanes());
  const auto env = collectiveEnvelope(2, 1, 1);  // 1 byte: whole on lane (2 + 1) % 2 = 1
  auto r = m.onFrame(1, 0, frame(env, 1, 0, 1));
  ASSERT_EQ(r.status().code(), StatusCode::kProtocolError) << r.status().toString();
  EXPECT_NE(r.status().message().find("does not use"), std::string::npos);
}

TEST(Matcher, AFrameThatRepeatsOrOverrunsItsPartIsAProtocolError) {
  Matcher m(twoLanes());
  const auto env = collectiveEnvelope(1, 0, 16);
  ASSERT_TRUE(m.onFrame(1, 0, frame(env, 16, 0, 8)).isOk());
  EXPECT_EQ(m.onFrame(1, 0, frame(env, 16, 0, 8)).status().code(), StatusCode::kProtocolError);
  Matcher m2(twoLanes());
  EXPECT_EQ(m2.onFrame(1, 1, frame(env, 16, 8, 9)).status().code(), StatusCode::kProtocolError);
  Matcher m3(twoLanes());
  EXPECT_EQ(m3.onFrame(1, 1, frame(env, 16, 4, 4)).status().code(), StatusCode::kProtocolError);
}

TEST(Matcher, AMessageCutIntoFramesMustContinueOnItsLane) {
  Matcher m(twoLanes(/*inOrder=*/true));
  const auto env = collectiveEnvelope(1, 0, 16);
  ASSERT_TRUE(m.onFrame(1, 0, frame(env, 16, 0, 4)).isOk());
  EXPECT_TRUE(m.midMessage(1, 0));
  // Another message in the middle of the first one's part.
  const auto other = collectiveEnvelope(1, 1, 16);
  auto r = m.onFrame(1, 0, frame(other, 16, 0, 4));
  ASSERT_EQ(r.status().code(), StatusCode::kProtocolError);
  EXPECT_NE(r.status().message().find("interrupts"), std::string::npos) << r.status().message();
}

TEST(Matcher, ALaterCallOnALaneFailsEarlierReceivesThatNeedIt) {
  Matcher m(twoLanes());
  uint8_t b = 0;
  // Call #3 tag 0, 1 byte: lane 1. Call #4 tag 1: lane 1 too.
  ASSERT_TRUE(m.postRecv(recv(1, collectiveEnvelope(3, 0, 1), &b, 1)).isOk());
  // A frame of call #4 on lane 0 says nothing about lane 1.
  ASSERT_TRUE(m.onFrame(1, 0, frame(collectiveEnvelope(4, 0, 1), 1, 0, 1)).isOk());
  auto r = m.onFrame(1, 1, frame(collectiveEnvelope(4, 1, 1), 1, 0, 1));
  ASSERT_EQ(r.status().code(), StatusCode::kMismatch) << r.status().toString();
  EXPECT_NE(r.status().message().find("moved on to call #4"), std::string::npos);
  // And a receive posted after the later call was seen fails at once.
  Matcher m2(twoLanes());
  ASSERT_TRUE(m2.onFrame(1, 1, frame(collectiveEnvelope(4, 1, 1), 1, 0, 1)).isOk());
  EXPECT_EQ(m2.postRecv(recv(1, collectiveEnvelope(3, 0, 1), &b, 1)).code(),
            StatusCode::kMismatch);
}

TEST(Matcher, AStripeLeftUnsentIsAProtocolError) {
  Matcher m(twoLanes());
  const auto env = collectiveEnvelope(1, 0, 16);
  ASSERT_TRUE(m.onFrame(1, 0, frame(env, 16, 0, 8)).isOk());  // lane 1's stripe never comes
  auto r = m.onFrame(1, 1, frame(collectiveEnvelope(2, 1, 1), 1, 0, 1));
  ASSERT_EQ(r.status().code(), StatusCode::kProtocolError) << r.status().toString();
  EXPECT_NE(r.status().message().find("unsent"), std::string::npos);
}

TEST(Matcher, SiblingMessagesOfOneCallMustAgreeOnTheCall) {
  uint8_t b = 0;
  // A message of call #1 arrives as a broadcast; the receive for another tag is an allreduce.
  Matcher m(twoLanes());
  ASSERT_TRUE(m.onFrame(1, 1, frame(collectiveEnvelope(1, 0, 1, OpType::kBroadcast), 1, 0, 1))
                  .isOk());
  EXPECT_EQ(m.postRecv(recv(1, collectiveEnvelope(1, 2, 1), &b, 1)).code(),
            StatusCode::kMismatch);
  // The same, receive first.
  Matcher m2(twoLanes());
  ASSERT_TRUE(m2.postRecv(recv(1, collectiveEnvelope(1, 2, 1), &b, 1)).isOk());
  EXPECT_EQ(m2.onFrame(1, 1, frame(collectiveEnvelope(1, 0, 1, OpType::kBroadcast), 1, 0, 1))
                .status()
                .code(),
            StatusCode::kMismatch);
}

TEST(Matcher, AClosedLaneFailsOnlyWhatStillNeedsIt) {
  Matcher m(twoLanes());
  uint8_t a = 0, c = 0;
  auto onLane1 = recv(1, collectiveEnvelope(3, 0, 1), &a, 1);  // lane 1
  auto onLane0 = recv(1, collectiveEnvelope(3, 1, 1), &c, 1);  // lane 0
  ASSERT_TRUE(m.postRecv(onLane1).isOk());
  ASSERT_TRUE(m.postRecv(onLane0).isOk());
  EXPECT_EQ(m.laneClosed(1, 1), onLane1);
  EXPECT_EQ(m.laneClosed(2, 1), nullptr);  // nothing waits on rank 2
  EXPECT_FALSE(m.closed(1));
  EXPECT_EQ(m.laneClosed(1, 0), onLane0);
  EXPECT_TRUE(m.closed(1));
  // A receive posted now for a closed lane fails with kPeerError naming the peer.
  uint8_t d = 0;
  const Status st = m.postRecv(recv(1, collectiveEnvelope(4, 0, 1), &d, 1));
  EXPECT_EQ(st.code(), StatusCode::kPeerError);
  EXPECT_NE(st.message().find("rank 1"), std::string::npos);
  EXPECT_EQ(m.takeAll().size(), 2u);
  EXPECT_FALSE(m.hasPending());
}

TEST(Matcher, PointToPointInOrderAndAnySourceAcrossPeers) {
  Matcher m(twoLanes());
  int32_t x = 0, y = 0, z = 0;
  const auto env = p2pEnvelope(7, 1, DataType::kInt32);
  auto any = recv(kAnySource, env, &x, 4);
  ASSERT_TRUE(m.postRecv(any).isOk());
  const int32_t v1 = 11, v2 = 22;
  for (int32_t v : {v1, v2}) {
    auto msg = m.onFrame(2, 0, frame(env, 4, 0, 4, /*seq=*/static_cast<uint64_t>(v)));
    ASSERT_TRUE(msg.isOk()) << msg.status().toString();
    std::memcpy(msg.value()->dest(0), &v, 4);
    m.landed(msg.value(), 4);
  }
  ASSERT_TRUE(any->test());
  EXPECT_EQ(x, 11);
  EXPECT_EQ(any->source(), 2);
  auto from2 = recv(2, env, &y, 4);
  ASSERT_TRUE(m.postRecv(from2).isOk());  // the held second message
  ASSERT_TRUE(from2->test());
  EXPECT_EQ(y, 22);
  // Nothing more can come from anyone once every peer's lane 0 closed.
  auto last = recv(kAnySource, env, &z, 4);
  ASSERT_TRUE(m.postRecv(last).isOk());
  EXPECT_EQ(m.laneClosed(1, 0), nullptr);
  EXPECT_EQ(m.laneClosed(2, 0), last);
}

TEST(Matcher, WireSequenceNumbersCountPointToPointPerPeer) {
  Matcher m(twoLanes());
  uint8_t b = 0;
  BasicRequest coll(true, 1, collectiveEnvelope(9, 0, 1), reinterpret_cast<char*>(&b), 1);
  BasicRequest p1(true, 1, p2pEnvelope(0, 1), reinterpret_cast<char*>(&b), 1);
  BasicRequest p2(true, 2, p2pEnvelope(0, 1), reinterpret_cast<char*>(&b), 1);
  EXPECT_EQ(m.wireSeq(coll), 9u);
  EXPECT_EQ(m.wireSeq(p1), 1u);
  EXPECT_EQ(m.wireSeq(p1), 2u);
  EXPECT_EQ(m.wireSeq(p2), 1u);
}

}  // namespace
}  // namespace nanoccl::testing
