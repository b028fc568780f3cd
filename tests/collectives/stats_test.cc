// CommStats::operator+=: the one merge of the stats type (Communicator::stats() adds the
// sub-communicators' traffic with it).
#include <gtest/gtest.h>

#include "collectives/communicator.h"

namespace nanoccl {
namespace {

TEST(CommStats, MergesPerRankAndByName) {
  CommStats a;
  a.rank = 1;
  a.size = 3;
  a.nodes = {"n0", "n0", "n1"};
  a.perPeer.resize(3);
  a.perPeer[2].bytesSent = 10;
  a.bytesSentPerOp = {1, 2};
  a.calls = 4;
  a.interNodeBytesSent = 10;
  a.callsPerAlgorithm = {{"allreduce/ring", 2}};
  a.perTransport = {{"tcp", PeerCounters{10, 0, 1, 0, 0}}};
  a.perRail = {{"eth0", 10, 0}};
  a.modelled = {{"allreduce/ring", 2, 0.5, 0.75}};

  CommStats b;
  b.rank = 7;  // not this one's: kept
  b.perPeer.resize(3);
  b.perPeer[0].bytesReceived = 5;
  b.perPeer[2].bytesSent = 1;
  b.bytesSentPerOp = {1, 0, 3};
  b.calls = 1;
  b.intraNodeBytesReceived = 5;
  b.callsPerAlgorithm = {{"allreduce/ring", 1}, {"broadcast/tree", 3}};
  b.perTransport = {{"shm", PeerCounters{0, 5, 0, 1, 0}}, {"tcp", PeerCounters{1, 0, 1, 0, 0}}};
  b.perRail = {{"eth1", 1, 0}, {"eth0", 0, 2}};
  b.modelled = {{"allreduce/ring", 1, 0.25, 0.5}};
  b.callsWithKeptBuffers = 1;

  a += b;
  EXPECT_EQ(a.rank, 1);
  EXPECT_EQ(a.nodes.size(), 3u);
  EXPECT_EQ(a.perPeer[0].bytesReceived, 5u);
  EXPECT_EQ(a.perPeer[2].bytesSent, 11u);
  EXPECT_EQ(a.bytesSentPerOp, (std::vector<uint64_t>{2, 2, 3}));
  EXPECT_EQ(a.calls, 5u);
  EXPECT_EQ(a.interNodeBytesSent, 10u);
  EXPECT_EQ(a.intraNodeBytesReceived, 5u);
  ASSERT_EQ(a.callsPerAlgorithm.size(), 2u);
  EXPECT_EQ(a.callsPerAlgorithm[0], (std::pair<std::string, uint64_t>{"allreduce/ring", 3}));
  EXPECT_EQ(a.callsPerAlgorithm[1], (std::pair<std::string, uint64_t>{"broadcast/tree", 3}));
  ASSERT_EQ(a.perTransport.size(), 2u);  // first-use order: tcp, then shm
  EXPECT_EQ(a.perTransport[0].first, "tcp");
  EXPECT_EQ(a.perTransport[0].second.bytesSent, 11u);
  EXPECT_EQ(a.perTransport[0].second.messagesSent, 2u);
  EXPECT_EQ(a.perTransport[1].first, "shm");
  EXPECT_EQ(a.perTransport[1].second.bytesReceived, 5u);
  ASSERT_EQ(a.perRail.size(), 2u);
  EXPECT_EQ(a.perRail[0].ifname, "eth0");
  EXPECT_EQ(a.perRail[0].bytesSent, 10u);
  EXPECT_EQ(a.perRail[0].bytesReceived, 2u);
  EXPECT_EQ(a.perRail[1].ifname, "eth1");
  ASSERT_EQ(a.modelled.size(), 1u);
  EXPECT_EQ(a.modelled[0].calls, 3u);
  EXPECT_DOUBLE_EQ(a.modelled[0].predictedSeconds, 0.75);
  EXPECT_DOUBLE_EQ(a.modelled[0].measuredSeconds, 1.25);
  EXPECT_EQ(a.callsWithKeptBuffers, 1u);
}

}  // namespace
}  // namespace nanoccl
