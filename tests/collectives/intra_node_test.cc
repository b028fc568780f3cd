// Which transport carries a communicator's bytes: collective messages between ranks of one
// node go through shared memory (the routed transport), everything else over tcp. Ranks as
// threads with emulated node ids: on one node (1x4) every flat collective works and tcp carries
// no collective byte; on 2x2 the flat algorithms' local legs take shm, the remote ones tcp;
// NANOCCL_INTRA_TRANSPORT=tcp and one-rank nodes keep plain tcp; point-to-point stays on tcp.
#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <numeric>

#include "tests/collectives/test_util.h"

namespace nanoccl::colltest {
namespace {

using Comms = std::vector<std::shared_ptr<Communicator>>;

std::vector<std::string> nodeIdsOf(const std::string& letters) {
  std::vector<std::string> ids;
  for (char c : letters) ids.push_back(std::string("intra-test-node-") + c);
  return ids;
}

WorldOptions worldOf(const std::string& letters, const std::string& algo = "auto",
                     const std::string& intra = "auto") {
  WorldOptions o;
  o.size = static_cast<int>(letters.size());
  o.nodeIds = nodeIdsOf(letters);
  o.algo = algo;
  o.intraTransport = intra;
  return o;
}

bool builtIn(const std::string& transport) {
  for (const TransportInfo& t : builtInTransports()) {
    if (t.name == transport) return true;
  }
  return false;
}

bool shmBuiltIn() { return builtIn("shm"); }

// Calls create() on every rank of the world `letters` (one letter per rank, naming its node:
// worldOf), each from its own thread, with rank r's settings adjusted by `adjust(r, config)`;
// returns what create() said on each rank.
template <typename Adjust>
std::vector<Status> createWorld(const std::string& letters, const std::string& commId,
                                std::chrono::milliseconds timeout, Adjust adjust) {
  const WorldOptions world = worldOf(letters);
  auto store = std::make_shared<InMemoryStore>();
  std::vector<Status> results(letters.size());
  std::vector<std::thread> threads;
  for (int r = 0; r < world.size; ++r) {
    threads.emplace_back([&, r] {
      CommunicatorOptions co;
      co.rank = r;
      co.size = world.size;
      co.store = store;
      co.commId = commId;
      co.config = worldConfig(world);
      adjust(r, co.config);
      co.timeout = timeout;
      co.nodeId = world.nodeIds[r];
      results[r] = Communicator::create(co).status();
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

// perTransport's entry `name`, or nullptr.
const PeerCounters* transportEntry(const CommStats& st, const std::string& name) {
  for (const auto& [n, c] : st.perTransport) {
    if (n == name) return &c;
  }
  return nullptr;
}

uint64_t sentOver(const CommStats& st, const std::string& name) {
  const PeerCounters* c = transportEntry(st, name);
  return c ? c->bytesSent : 0;
}

uint64_t receivedOver(const CommStats& st, const std::string& name) {
  const PeerCounters* c = transportEntry(st, name);
  return c ? c->bytesReceived : 0;
}

// Runs every flat collective on `count` float elements per rank (values small integers, so
// sums are exact) and checks each result.
void runEveryCollective(const Comms& comms, size_t count) {
  const int n = static_cast<int>(comms.size());
  const float tri = static_cast<float>(n * (n - 1) / 2);
  auto check = [&](const std::vector<std::shared_ptr<Task>>& tasks, const char* what) {
    SCOPED_TRACE(what);
    expectAllOk(tasks);
  };
  {  // allreduce
    std::vector<std::vector<float>> b(n, std::vector<float>(count));
    std::vector<std::shared_ptr<Task>> tasks;
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < count; ++i) b[r][i] = static_cast<float>(r + static_cast<int>(i % 7));
      tasks.push_back(comms[r]->allreduce(b[r].data(), count, DataType::kFloat32, ReduceOp::kSum));
    }
    check(tasks, "allreduce");
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < count; i += 997) {
        ASSERT_EQ(b[r][i], tri + static_cast<float>(n * static_cast<int>(i % 7)))
            << "allreduce rank " << r << " element " << i;
      }
    }
  }
  {  // reduce to rank 1
    const int root = 1 % n;
    std::vector<std::vector<float>> b(n, std::vector<float>(count));
    std::vector<std::shared_ptr<Task>> tasks;
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < count; ++i) b[r][i] = static_cast<float>(r + static_cast<int>(i % 5));
      tasks.push_back(
          comms[r]->reduce(b[r].data(), count, DataType::kFloat32, ReduceOp::kSum, root));
    }
    check(tasks, "reduce");
    for (size_t i = 0; i < count; i += 997) {
      ASSERT_EQ(b[root][i], tri + static_cast<float>(n * static_cast<int>(i % 5))) << i;
    }
  }
  {  // broadcast from the last rank
    const int root = n - 1;
    std::vector<std::vector<float>> b(n, std::vector<float>(count, 0.0f));
    for (size_t i = 0; i < count; ++i) b[root][i] = static_cast<float>(i % 101);
    std::vector<std::shared_ptr<Task>> tasks;
    for (int r = 0; r < n; ++r) {
      tasks.push_back(comms[r]->broadcast(b[r].data(), count, DataType::kFloat32, root));
    }
    check(tasks, "broadcast");
    for (int r = 0; r < n; ++r) ASSERT_TRUE(b[r] == b[root]) << "broadcast rank " << r;
  }
  const std::vector<size_t> counts(n, count);
  {  // allgather
    std::vector<std::vector<float>> send(n, std::vector<float>(count)),
        recv(n, std::vector<float>(count * n));
    std::vector<std::shared_ptr<Task>> tasks;
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < count; ++i) send[r][i] = static_cast<float>(r * 1000 + i % 100);
      tasks.push_back(comms[r]->allgather(send[r].data(), count, recv[r].data(), counts,
                                          DataType::kFloat32));
    }
    check(tasks, "allgather");
    for (int r = 0; r < n; ++r) {
      for (int s = 0; s < n; ++s) {
        ASSERT_TRUE(std::equal(send[s].begin(), send[s].end(), recv[r].begin() + s * count))
            << "allgather rank " << r << " piece " << s;
      }
    }
  }
  {  // reduce_scatter
    std::vector<std::vector<float>> send(n, std::vector<float>(count * n)),
        recv(n, std::vector<float>(std::max<size_t>(count, 1)));
    std::vector<std::shared_ptr<Task>> tasks;
    for (int r = 0; r < n; ++r) {
      for (size_t j = 0; j < count * n; ++j) send[r][j] = static_cast<float>(r + j % 5);
      tasks.push_back(comms[r]->reduceScatter(send[r].data(), recv[r].data(), counts,
                                              DataType::kFloat32, ReduceOp::kSum));
    }
    check(tasks, "reduce_scatter");
    for (int r = 0; r < n; ++r) {
      for (size_t k = 0; k < count; k += 997) {
        const size_t j = r * count + k;
        ASSERT_EQ(recv[r][k], tri + static_cast<float>(n * static_cast<int>(j % 5))) << r;
      }
    }
  }
  {  // alltoall: rank r's part for d is r * 100 + d
    std::vector<std::vector<float>> send(n, std::vector<float>(count * n)),
        recv(n, std::vector<float>(count * n));
    std::vector<std::shared_ptr<Task>> tasks;
    for (int r = 0; r < n; ++r) {
      for (int d = 0; d < n; ++d) {
        std::fill_n(send[r].begin() + d * count, count, static_cast<float>(r * 100 + d));
      }
      tasks.push_back(comms[r]->alltoall(send[r].data(), counts, recv[r].data(), counts,
                                         DataType::kFloat32));
    }
    check(tasks, "alltoall");
    for (int r = 0; r < n; ++r) {
      for (int s = 0; s < n && count > 0; ++s) {
        ASSERT_EQ(recv[r][s * count], static_cast<float>(s * 100 + r));
      }
    }
  }
  {  // gather to rank 0, then scatter from the last rank
    std::vector<std::vector<float>> send(n, std::vector<float>(count));
    std::vector<float> gathered(count * n);
    std::vector<std::shared_ptr<Task>> tasks;
    for (int r = 0; r < n; ++r) {
      std::fill(send[r].begin(), send[r].end(), static_cast<float>(r * 10 + 1));
      tasks.push_back(comms[r]->gather(send[r].data(), count, r == 0 ? gathered.data() : nullptr,
                                       counts, DataType::kFloat32, 0));
    }
    check(tasks, "gather");
    for (int s = 0; s < n && count > 0; ++s) ASSERT_EQ(gathered[s * count], s * 10 + 1.0f);

    const int root = n - 1;
    std::vector<float> parts(count * n);
    for (int d = 0; d < n; ++d) std::fill_n(parts.begin() + d * count, count, d * 10 + 2.0f);
    std::vector<std::vector<float>> recv(n, std::vector<float>(std::max<size_t>(count, 1)));
    tasks.clear();
    for (int r = 0; r < n; ++r) {
      tasks.push_back(comms[r]->scatter(r == root ? parts.data() : nullptr, counts,
                                        recv[r].data(), count, DataType::kFloat32, root));
    }
    check(tasks, "scatter");
    for (int r = 0; r < n && count > 0; ++r) ASSERT_EQ(recv[r][count - 1], r * 10 + 2.0f);
  }
  {
    std::vector<std::shared_ptr<Task>> tasks;
    for (int r = 0; r < n; ++r) tasks.push_back(comms[r]->barrier());
    check(tasks, "barrier");
  }
}

// Collective bytes to peers on this rank's node went through shm, the rest through tcp.
void expectSplitByNode(const Comms& comms) {
  for (const auto& comm : comms) {
    const CommStats st = comm->stats();
    const Topology& topo = comm->topology();
    const int me = comm->rank();
    uint64_t localSent = 0, remoteSent = 0, localReceived = 0, remoteReceived = 0;
    for (int p = 0; p < comm->size(); ++p) {
      if (p == me) continue;
      (topo.sameNode(p, me) ? localSent : remoteSent) += st.perPeer[p].bytesSent;
      (topo.sameNode(p, me) ? localReceived : remoteReceived) += st.perPeer[p].bytesReceived;
    }
    SCOPED_TRACE("rank " + std::to_string(me));
    if (topo.localSize(topo.nodeOf[me]) > 1) {
      EXPECT_GT(localSent, 0u);
    }
    EXPECT_EQ(sentOver(st, "shm"), localSent);
    EXPECT_EQ(receivedOver(st, "shm"), localReceived);
    EXPECT_EQ(sentOver(st, "tcp"), remoteSent);
    EXPECT_EQ(receivedOver(st, "tcp"), remoteReceived);
    EXPECT_EQ(st.intraNodeBytesSent, localSent);
  }
}

class OneNode : public ::testing::TestWithParam<std::string> {};

TEST_P(OneNode, EveryFlatCollectiveGoesThroughShmAndNoneThroughTcp) {
  if (!shmBuiltIn()) GTEST_SKIP() << "no shm in this build";
  Comms comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(worldOf("aaaa", GetParam()), comms);
  runEveryCollective(comms, 1000);
  if (HasFailure()) return;
  runEveryCollective(comms, (size_t{1} << 18) + 3);  // chunked ring pipelines, several shm chunks
  if (HasFailure()) return;
  for (const auto& comm : comms) {
    const CommStats st = comm->stats();
    SCOPED_TRACE("rank " + std::to_string(comm->rank()));
    ASSERT_NE(transportEntry(st, "tcp"), nullptr);  // listed, though it carried nothing
    EXPECT_EQ(sentOver(st, "tcp"), 0u);
    EXPECT_EQ(receivedOver(st, "tcp"), 0u);
    uint64_t sent = 0;
    for (const PeerCounters& p : st.perPeer) sent += p.bytesSent;
    EXPECT_GT(sent, 0u);
    EXPECT_EQ(sentOver(st, "shm"), sent);
  }
  // Point-to-point between ranks of the node takes tcp.
  int64_t x = 42, y = 0;
  auto r = comms[2]->recv(&y, 1, DataType::kInt64, kAnySource, 3);
  auto s = comms[1]->send(&x, 1, DataType::kInt64, 2, 3);
  expectAllOk({r, s});
  EXPECT_EQ(y, 42);
  EXPECT_EQ(r->source(), 1);
  EXPECT_EQ(sentOver(comms[1]->stats(), "tcp"), 8u);
  EXPECT_EQ(receivedOver(comms[2]->stats(), "tcp"), 8u);
}

INSTANTIATE_TEST_SUITE_P(Algos, OneNode, ::testing::Values("auto", "ring", "tree"));

struct SplitCase {
  std::string letters;
  std::string algo;
};

class TwoNodes : public ::testing::TestWithParam<SplitCase> {};

TEST_P(TwoNodes, LocalLegsTakeShmAndRemoteLegsTcp) {
  if (!shmBuiltIn()) GTEST_SKIP() << "no shm in this build";
  Comms comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(worldOf(GetParam().letters, GetParam().algo), comms);
  runEveryCollective(comms, 1000);
  if (HasFailure()) return;
  runEveryCollective(comms, (size_t{1} << 17) + 1);
  if (HasFailure()) return;
  expectSplitByNode(comms);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, TwoNodes,
    ::testing::Values(SplitCase{"aabb", "ring"}, SplitCase{"abab", "ring"},
                      SplitCase{"aabb", "auto"}, SplitCase{"aab", "ring"}),
    [](const ::testing::TestParamInfo<SplitCase>& info) {
      return info.param.letters + "_" + info.param.algo;
    });

TEST(IntraTransport, TcpKeepsEverythingOnTcp) {
  Comms comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(worldOf("aaa", "ring", "tcp"), comms);
  runEveryCollective(comms, 1000);
  for (const auto& comm : comms) {
    const CommStats st = comm->stats();
    EXPECT_EQ(transportEntry(st, "shm"), nullptr);
    EXPECT_GT(sentOver(st, "tcp"), 0u);
  }
}

TEST(IntraTransport, OneRankPerNodeNeedsNoShmEvenWhenForced) {
  Comms comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(worldOf("abc", "auto", "shm"), comms);
  runEveryCollective(comms, 100);
  for (const auto& comm : comms) {
    const CommStats st = comm->stats();
    EXPECT_EQ(transportEntry(st, "shm"), nullptr);
    EXPECT_GT(sentOver(st, "tcp"), 0u);
  }
}

TEST(IntraTransport, RanksOfOneNodeThatDisagreeFailSetupNamingTheSetting) {
  if (!shmBuiltIn()) GTEST_SKIP() << "no shm in this build";
  // Rank 1 keeps tcp while ranks 0 and 2 route: nobody may wait for messages on the wrong
  // transport; setup fails on every rank within the timeout instead.
  const std::vector<Status> results =
      createWorld("aaa", "intra-disagree", std::chrono::milliseconds(5000), [](int r, Config& c) {
        if (r == 1) c.intraTransport = "tcp";
      });
  for (int r = 0; r < 3; ++r) {
    EXPECT_FALSE(results[r].isOk()) << "rank " << r;
    EXPECT_NE(results[r].code(), StatusCode::kTimeout) << results[r].toString();
  }
  EXPECT_NE(results[0].message().find("NANOCCL_INTRA_TRANSPORT"), std::string::npos)
      << results[0].toString();
}

// NANOCCL_TRANSPORT names a row of the transport table: a name it does not have, or one that
// only works within a node, fails create() on every rank at once, naming the setting and the
// choices; "tcp" and "auto" run.
TEST(TransportSetting, AnUnknownOrMisplacedTransportFailsEveryRankNamingTheChoices) {
  for (const std::string bad : {"bogus", "shm", "fabric"}) {
    if (bad == "shm" && !shmBuiltIn()) continue;
    if (bad == "fabric" && builtIn("fabric")) continue;  // then a valid choice (conformance_test.cc)
    const std::vector<Status> results =
        createWorld("ab", "transport-setting-" + bad, std::chrono::milliseconds(30000),
                    [&](int, Config& c) { c.transport = bad; });
    for (int r = 0; r < 2; ++r) {
      ASSERT_FALSE(results[r].isOk()) << bad << " rank " << r;
      EXPECT_NE(results[r].code(), StatusCode::kTimeout) << results[r].toString();
      EXPECT_NE(results[r].message().find("NANOCCL_TRANSPORT=" + bad), std::string::npos)
          << results[r].toString();
      EXPECT_NE(results[r].message().find("auto, tcp"), std::string::npos)
          << results[r].toString();
    }
  }
}

// A rank whose transport cannot be set up (here: an interface it does not have) publishes why
// instead of its address; its peer fails with that reason, not with a timeout.
TEST(TransportSetting, ARankThatCannotSetUpItsTransportFailsItsPeersWithItsReason) {
  const std::vector<Status> results =
      createWorld("ab", "transport-setup-fails", std::chrono::milliseconds(30000),
                  [](int r, Config& c) {
                    if (r == 1) c.socketIfname = "=nosuchif0";
                  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_FALSE(results[r].isOk()) << "rank " << r;
    EXPECT_NE(results[r].code(), StatusCode::kTimeout) << results[r].toString();
    EXPECT_NE(results[r].message().find("nosuchif0"), std::string::npos) << results[r].toString();
  }
  EXPECT_NE(results[0].message().find("rank 1 could not set up its transport"), std::string::npos)
      << results[0].toString();
}

TEST(TransportSetting, ChoosesFromTheTable) {
  Config c;
  Result<TransportChoice> d = chooseTransports(c);
  ASSERT_TRUE(d.isOk()) << d.status().toString();
  EXPECT_EQ(d.value().interNode, "tcp");
  EXPECT_EQ(d.value().intraNode, shmBuiltIn() ? "shm" : "tcp");
  EXPECT_TRUE(d.value().intraFallback);
  c.transport = "tcp";
  c.intraTransport = "tcp";  // the node's ranks talk over tcp too: nothing to route
  d = chooseTransports(c);
  ASSERT_TRUE(d.isOk()) << d.status().toString();
  EXPECT_EQ(d.value().intraNode, "tcp");
  EXPECT_FALSE(d.value().intraFallback);
  // Every row built in is listed once, with its scope.
  bool tcp = false;
  for (const TransportInfo& t : builtInTransports()) {
    if (t.name == "tcp") tcp = t.scope == TransportScope::kInterNode;
    if (t.name == "shm") {
      EXPECT_EQ(t.scope, TransportScope::kIntraNode);
    }
  }
  EXPECT_TRUE(tcp);
}

// This process's nanoccl segments still named in /dev/shm.
size_t segmentsOfThisProcess() {
  size_t n = 0;
  const std::string suffix = "-" + std::to_string(getpid());
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      n += name.rfind("nanoccl-", 0) == 0 && name.size() > suffix.size() &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    }
    closedir(d);
  }
  return n;
}

TEST(IntraTransport, ASetupThatTimesOutLeavesNoSegmentBehind) {
  if (!shmBuiltIn()) GTEST_SKIP() << "no shm in this build";
  // Ranks 0 and 1 share node a; node b's ranks announce themselves, then never connect (they
  // died during setup, as in the soak): setup times out and unlinks what it created.
  auto store = std::make_shared<InMemoryStore>();
  PrefixStore p("nanoccl/intra-timeout", store);
  for (int r = 2; r < 4; ++r) {
    ASSERT_TRUE(p.set("auth/" + std::to_string(r), "the store").isOk());
    ASSERT_TRUE(p.set("node/" + std::to_string(r), "b").isOk());
  }
  std::vector<Status> results(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      CommunicatorOptions co;
      co.rank = r;
      co.size = 4;
      co.store = store;
      co.commId = "intra-timeout";
      co.config = worldConfig(worldOf("aabb", "auto", "auto"));
      co.timeout = std::chrono::milliseconds(1500);
      co.nodeId = "a";
      results[r] = Communicator::create(co).status();
    });
  }
  for (auto& t : threads) t.join();
  for (const Status& st : results) EXPECT_EQ(st.code(), StatusCode::kTimeout) << st.toString();
  EXPECT_EQ(segmentsOfThisProcess(), 0u);
}

TEST(IntraTransport, AMismatchOnInterleavedNodesFailsEveryRankNamingBoth) {
  if (!shmBuiltIn()) GTEST_SKIP() << "no shm in this build";
  Comms comms;
  WorldOptions o = worldOf("abab", "recursive_doubling");
  o.timeout = std::chrono::milliseconds(5000);
  NANOCCL_MAKE_WORLD_OR_SKIP(o, comms);
  // Rank 2 (local rank 1 of node a, with rank 0) allreduces 8 elements, the others 16: it
  // talks to its local peer over shm, to the others over tcp.
  std::vector<std::vector<float>> b(4, std::vector<float>(16, 1.0f));
  std::vector<std::shared_ptr<Task>> tasks;
  for (int r = 0; r < 4; ++r) {
    tasks.push_back(
        comms[r]->allreduce(b[r].data(), r == 2 ? 8 : 16, DataType::kFloat32, ReduceOp::kSum));
  }
  const std::vector<Status> st = waitAll(tasks);
  for (int r = 0; r < 4; ++r) {
    EXPECT_FALSE(st[r].isOk()) << "rank " << r;
    EXPECT_EQ(st[r].message().find("caller's deadline"), std::string::npos) << "rank " << r;
  }
  // Whoever detected it names the calls of both sides.
  bool named = false;
  for (const Status& s : st) {
    named = named || (s.message().find("x 8") != std::string::npos &&
                      s.message().find("x 16") != std::string::npos);
  }
  EXPECT_TRUE(named);
}

}  // namespace
}  // namespace nanoccl::colltest
