// Hierarchical collectives on emulated topologies: ranks as threads, each given a node id, so
// one process holds several "nodes". Every collective with a "hierarchical" row is checked
// against the same references as the flat suites, on both engines and both intra-node
// transports; then the planner's choice, the inter-node byte counts, the errors and faults.
#include <dirent.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <numeric>

#include "collectives/planner.h"
#include "tests/collectives/test_util.h"

namespace nanoccl::colltest {
namespace {

// A topology written one letter per rank, the letter naming its node: "aabb" is 2x2 with
// contiguous nodes, "abab" the same with the nodes interleaved.
struct Shape {
  std::string name;
  std::string letters;
};

std::vector<std::string> nodeIdsOf(const std::string& letters) {
  std::vector<std::string> ids;
  for (char c : letters) ids.push_back(std::string("emulated-node-") + c);
  return ids;
}

std::vector<Shape> allShapes() {
  return {
      {"2x2", "aabb"},     {"3x2", "aabbcc"},
      {"2x3", "aaabbb"},   {"2p1", "aab"},  // uneven, a one-rank node
      {"3p1p2", "aaabcc"},                  // uneven, the one-rank node in the middle
      {"2x2i", "abab"},                     // interleaved: a node's ranks are not contiguous
      {"2p3i", "abbab"},  // interleaved and uneven: node b has a rank beyond the shards
      {"1x4", "aaaa"},    // flat: one node
      {"4x1", "abcd"},    // flat: one rank per node
  };
}

Shape shapeNamed(const std::string& name) {
  for (const Shape& s : allShapes()) {
    if (s.name == name) return s;
  }
  ADD_FAILURE() << "no shape " << name;
  return {};
}

bool isHierarchical(const Shape& s) {
  return Topology::fromNodeIds(nodeIdsOf(s.letters)).hierarchical();
}

struct HierCase {
  std::string shape;
  std::string engine = "epoll";
  std::string intra = "shm";
  size_t count = 1023;
  std::string algo = "hierarchical";
  bool full = false;
};

std::string hierCaseName(const ::testing::TestParamInfo<HierCase>& info) {
  const HierCase& c = info.param;
  return c.shape + "_" + c.engine + "_" + c.intra + "_c" + std::to_string(c.count) + "_" + c.algo +
         (c.full ? "_full" : "");
}

WorldOptions hierWorld(const std::string& shapeName, const std::string& algo,
                       const std::string& engine = "epoll", const std::string& intra = "auto",
                       int timeoutMs = 10000) {
  const Shape s = shapeNamed(shapeName);
  WorldOptions o;
  o.size = static_cast<int>(s.letters.size());
  o.nodeIds = nodeIdsOf(s.letters);
  o.algo = algo;
  o.engine = engine;
  o.intraTransport = intra;
  o.timeout = std::chrono::milliseconds(timeoutMs);
  return o;
}

uint64_t callsOf(const CommStats& st, const std::string& key) {
  for (const auto& [k, n] : st.callsPerAlgorithm) {
    if (k == key) return n;
  }
  return 0;
}

size_t sumOf(const std::vector<size_t>& v) {
  return std::accumulate(v.begin(), v.end(), size_t{0});
}

// Equal, uneven, and uneven with empty ranks (as the flat exchange suite).
std::vector<std::vector<size_t>> countPatterns(size_t count, int n) {
  std::vector<std::vector<size_t>> out;
  out.push_back(std::vector<size_t>(n, count));
  if (count == 0 || count > 100000) return out;
  std::vector<size_t> uneven(n), holes(n);
  for (int r = 0; r < n; ++r) {
    uneven[r] = count + static_cast<size_t>(r) * (count / 4 + 1);
    holes[r] = r % 2 == 1 ? 0 : count + static_cast<size_t>(r);
  }
  out.push_back(uneven);
  out.push_back(holes);
  return out;
}

using Comms = std::vector<std::shared_ptr<Communicator>>;

void checkAllreduce(const Comms& comms, const Case& c) {
  const int n = static_cast<int>(comms.size());
  for (const Combo& combo : combosFor(c)) {
    SCOPED_TRACE("allreduce " + comboName(combo));
    const DataType t = combo.dtype;
    const ReduceOp op = combo.op;
    std::vector<std::vector<char>> bufs;
    for (int r = 0; r < n; ++r) {
      bufs.push_back(makeBuffer(t, c.count, [&](size_t i) { return inputValue(t, op, r, i); }));
    }
    std::vector<std::shared_ptr<Task>> tasks;
    for (int r = 0; r < n; ++r) {
      tasks.push_back(comms[r]->allreduce(bufs[r].data(), c.count, t, op, kPremulFactor));
    }
    expectAllOk(tasks);
    std::vector<Value> want(c.count);
    for (size_t i = 0; i < c.count; ++i) {
      want[i] = referenceReduce(t, op, n, [&](int q) { return inputValue(t, op, q, i); });
    }
    for (int r = 0; r < n; ++r) {
      expectBuffer(
          t, bufs[r].data(), c.count, [&](size_t i) { return want[i]; },
          "rank " + std::to_string(r));
      EXPECT_EQ(0, std::memcmp(bufs[r].data(), bufs[0].data(), c.count * dataTypeSize(t)))
          << "rank " << r << " differs from rank 0";
    }
    if (::testing::Test::HasFailure()) return;
  }
}

void checkReduceScatter(const Comms& comms, const Case& c) {
  const int n = static_cast<int>(comms.size());
  const std::vector<std::vector<size_t>> patterns = countPatterns(c.count, n);
  int k = 0;
  for (const Combo& combo : combosFor(c)) {
    const std::vector<size_t>& counts = patterns[k++ % patterns.size()];
    SCOPED_TRACE("reduce_scatter " + comboName(combo) + " pattern " +
                 std::to_string((k - 1) % patterns.size()));
    const DataType t = combo.dtype;
    const ReduceOp op = combo.op;
    const size_t es = dataTypeSize(t);
    const std::vector<size_t> offs = detail::prefixOffsets(counts);
    const size_t total = sumOf(counts);
    std::vector<std::vector<char>> sends, recvs;
    for (int r = 0; r < n; ++r) {
      sends.push_back(makeBuffer(t, total, [&](size_t i) { return inputValue(t, op, r, i); }));
      recvs.emplace_back(std::max<size_t>(counts[r], 1) * es, 0);
    }
    const std::vector<std::vector<char>> sendCopies = sends;
    std::vector<std::shared_ptr<Task>> tasks;
    for (int r = 0; r < n; ++r) {
      tasks.push_back(
          comms[r]->reduceScatter(sends[r].data(), recvs[r].data(), counts, t, op, kPremulFactor));
    }
    expectAllOk(tasks);
    for (int r = 0; r < n; ++r) {
      expectBuffer(
          t, recvs[r].data(), counts[r],
          [&](size_t j) {
            return referenceReduce(t, op, n,
                                   [&](int q) { return inputValue(t, op, q, offs[r] + j); });
          },
          "rank " + std::to_string(r));
      EXPECT_EQ(sends[r], sendCopies[r]) << "rank " << r << "'s send buffer was modified";
    }
    if (::testing::Test::HasFailure()) return;
  }
}

void checkAllgather(const Comms& comms, const Case& c) {
  const int n = static_cast<int>(comms.size());
  auto value = [](DataType t, int r, size_t j) {
    return inputValue(t, ReduceOp::kSum, r * 17 + 3, j);
  };
  int variant = 0;
  for (const std::vector<size_t>& counts : countPatterns(c.count, n)) {
    const std::vector<size_t> offs = detail::prefixOffsets(counts);
    const size_t total = sumOf(counts);
    for (DataType t : dataTypesFor(c)) {
      const bool inPlace = (variant++ % 2) == 1;
      SCOPED_TRACE(std::string("allgather ") + dataTypeName(t) + (inPlace ? " in place" : ""));
      const size_t es = dataTypeSize(t);
      std::vector<std::vector<char>> sends, recvs;
      for (int r = 0; r < n; ++r) {
        sends.push_back(makeBuffer(t, counts[r], [&](size_t j) { return value(t, r, j); }));
        recvs.emplace_back(std::max<size_t>(total, 1) * es, 0);
        if (inPlace && counts[r] > 0) {
          std::memcpy(recvs[r].data() + offs[r] * es, sends[r].data(), counts[r] * es);
        }
      }
      std::vector<std::shared_ptr<Task>> tasks;
      for (int r = 0; r < n; ++r) {
        const void* send = inPlace ? recvs[r].data() + offs[r] * es : sends[r].data();
        tasks.push_back(comms[r]->allgather(send, counts[r], recvs[r].data(), counts, t));
      }
      expectAllOk(tasks);
      for (int r = 0; r < n; ++r) {
        for (int q = 0; q < n; ++q) {
          expectBuffer(
              t, recvs[r].data() + offs[q] * es, counts[q],
              [&](size_t j) { return value(t, q, j); },
              "rank " + std::to_string(r) + ", piece of rank " + std::to_string(q));
        }
      }
      if (::testing::Test::HasFailure()) return;
    }
  }
}

void checkBroadcast(const Comms& comms, const Case& c) {
  const int n = static_cast<int>(comms.size());
  int k = 0;
  // Every rank is the root once (and then some): roots on one-rank nodes, on local ranks
  // beyond the shards and on interleaved nodes all take their own path.
  std::vector<DataType> types = dataTypesFor(c);
  while (static_cast<int>(types.size()) < n) types.push_back(types[types.size() % 2]);
  for (DataType t : types) {
    const int root = (k++ * 3 + n - 1) % n;
    SCOPED_TRACE(std::string("broadcast ") + dataTypeName(t) + " root " + std::to_string(root));
    std::vector<std::vector<char>> bufs;
    for (int r = 0; r < n; ++r) {
      bufs.push_back(
          makeBuffer(t, c.count, [&](size_t i) { return inputValue(t, ReduceOp::kSum, r, i); }));
    }
    const std::vector<char> expected = bufs[root];
    std::vector<std::shared_ptr<Task>> tasks;
    for (int r = 0; r < n; ++r) {
      tasks.push_back(comms[r]->broadcast(bufs[r].data(), c.count, t, root));
    }
    expectAllOk(tasks);
    for (int r = 0; r < n; ++r) EXPECT_EQ(bufs[r], expected) << "rank " << r;
    if (::testing::Test::HasFailure()) return;
  }
}

class HierarchicalTest : public ::testing::TestWithParam<HierCase> {};

TEST_P(HierarchicalTest, MatchesReference) {
  const HierCase& hc = GetParam();
  const Shape shape = shapeNamed(hc.shape);
  Comms comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(hierWorld(hc.shape, hc.algo, hc.engine, hc.intra), comms);
  EXPECT_EQ(comms[0]->topology().hierarchical(), isHierarchical(shape))
      << comms[0]->topology().describe();
  Case c;
  c.size = static_cast<int>(comms.size());
  c.count = hc.count;
  c.full = hc.full;
  checkAllreduce(comms, c);
  checkReduceScatter(comms, c);
  checkAllgather(comms, c);
  checkBroadcast(comms, c);

  // What the planner chose: hierarchical where the topology is (forced, or auto at these
  // sizes), flat otherwise.
  const bool hierarchical = isHierarchical(shape);
  for (int r = 0; r < c.size; ++r) {
    const CommStats st = comms[r]->stats();
    for (const char* op : {"allreduce", "reduce_scatter", "allgather", "broadcast"}) {
      const uint64_t calls = callsOf(st, std::string(op) + "/hierarchical");
      if (hierarchical) {
        EXPECT_GT(calls, 0u) << "rank " << r << ": " << op << " did not run hierarchical";
      } else {
        EXPECT_EQ(calls, 0u) << "rank " << r << ": " << op
                             << " ran hierarchical on a flat topology";
      }
    }
    // Every byte is in one link class, and the classes add up to the per-op counts.
    uint64_t perOp = 0, perPeer = 0;
    for (uint64_t b : st.bytesSentPerOp) perOp += b;
    for (const PeerCounters& p : st.perPeer) perPeer += p.bytesSent;
    EXPECT_EQ(perOp, perPeer) << "rank " << r;
    EXPECT_EQ(st.intraNodeBytesSent + st.interNodeBytesSent, perPeer) << "rank " << r;
  }
}

std::vector<HierCase> hierCases() {
  std::vector<HierCase> out;
  for (const Shape& s : allShapes()) {
    if (!isHierarchical(s)) {
      // Flat shapes: auto must stay flat, on both engines; results as always.
      out.push_back({s.name, "epoll", "auto", 1023, "auto"});
      out.push_back({s.name, "uring", "auto", kLargeCount / 4, "auto"});
      continue;
    }
    out.push_back({s.name, "epoll", "shm", 1023, "hierarchical"});
    out.push_back({s.name, "uring", "tcp", 1023, "hierarchical"});
    out.push_back({s.name, "epoll", "tcp", 1, "hierarchical"});
  }
  // Every dtype x reduction on an even and an uneven shape.
  out.push_back({"2x2", "uring", "shm", 257, "hierarchical", true});
  out.push_back({"2p1", "epoll", "tcp", 257, "hierarchical", true});
  // Counts smaller than the shards, and nothing at all.
  out.push_back({"2x3", "uring", "shm", 2, "hierarchical"});
  out.push_back({"3p1p2", "epoll", "shm", 0, "hierarchical"});
  // Large messages: the planner picks hierarchical by itself, the pipelines run many chunks.
  out.push_back({"2x2", "epoll", "shm", kLargeCount, "auto"});
  out.push_back({"2p1", "uring", "tcp", kLargeCount, "auto"});
  out.push_back({"2x3", "uring", "shm", kLargeCount / 2, "auto"});
  out.push_back({"2p3i", "epoll", "tcp", kLargeCount / 2, "auto"});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Shapes, HierarchicalTest, ::testing::ValuesIn(hierCases()), hierCaseName);

// Allreduces of several pipeline blocks (kPipelineBlockBytes, 4 MB): the three stages run at
// once on different blocks, every scaling rule still applied once.
class HierarchicalPipeline : public ::testing::TestWithParam<HierCase> {};

TEST_P(HierarchicalPipeline, LargeAllreduceMatchesReference) {
  const HierCase& hc = GetParam();
  Comms comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(hierWorld(hc.shape, hc.algo, hc.engine, hc.intra), comms);
  Case c;
  c.size = static_cast<int>(comms.size());
  c.count = hc.count;
  for (const Combo combo :
       {Combo{DataType::kFloat32, ReduceOp::kSum}, Combo{DataType::kInt32, ReduceOp::kMax},
        Combo{DataType::kBFloat16, ReduceOp::kAvg}, Combo{DataType::kFloat32, ReduceOp::kPremulSum},
        Combo{DataType::kInt64, ReduceOp::kAvg}}) {
    SCOPED_TRACE(comboName(combo));
    const DataType t = combo.dtype;
    const ReduceOp op = combo.op;
    std::vector<std::vector<char>> bufs;
    for (int r = 0; r < c.size; ++r) {
      bufs.push_back(makeBuffer(t, c.count, [&](size_t i) { return inputValue(t, op, r, i); }));
    }
    std::vector<std::shared_ptr<Task>> tasks;
    for (int r = 0; r < c.size; ++r) {
      tasks.push_back(comms[r]->allreduce(bufs[r].data(), c.count, t, op, kPremulFactor));
    }
    expectAllOk(tasks);
    // inputValue repeats every 11 elements: compare against one period of references.
    std::vector<Value> want(11 * 7);
    for (size_t i = 0; i < want.size(); ++i) {
      want[i] = referenceReduce(t, op, c.size, [&](int q) { return inputValue(t, op, q, i); });
    }
    for (int r = 0; r < c.size; ++r) {
      expectBuffer(
          t, bufs[r].data(), c.count, [&](size_t i) { return want[i % want.size()]; },
          "rank " + std::to_string(r));
      EXPECT_EQ(0, std::memcmp(bufs[r].data(), bufs[0].data(), c.count * dataTypeSize(t)))
          << "rank " << r << " differs from rank 0";
    }
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_EQ(callsOf(comms[0]->stats(), "allreduce/hierarchical"), 5u);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, HierarchicalPipeline,
    ::testing::Values(HierCase{"2x2", "epoll", "shm", (size_t{3} << 20) + 7, "auto"},
                      HierCase{"2p1", "uring", "tcp", (size_t{5} << 20) / 2 + 1, "auto"},
                      HierCase{"2p3i", "epoll", "shm", (size_t{5} << 20) / 2 + 3, "auto"},
                      HierCase{"3p1p2", "uring", "shm", (size_t{9} << 20) / 4, "auto"}),
    hierCaseName);

// The planner alone: by topology and size, and what NANOCCL_ALGO forces.
TEST(HierarchicalPlanner, PicksByTopologyAndSize) {
  detail::CallArgs small;
  small.op = OpType::kAllreduce;
  small.dtype = DataType::kFloat32;
  small.count = 16;
  detail::CallArgs large = small;
  large.count = 1 << 20;
  const Topology twoByTwo = Topology::fromNodeIds(nodeIdsOf("aabb"));
  const Topology oneByFour = Topology::fromNodeIds(nodeIdsOf("aaaa"));
  const Topology fourByOne = Topology::fromNodeIds(nodeIdsOf("abcd"));
  ASSERT_TRUE(twoByTwo.hierarchical());
  ASSERT_FALSE(oneByFour.hierarchical());
  ASSERT_FALSE(fourByOne.hierarchical());
  Config c;
  auto name = [&](const detail::CallArgs& a, const Topology& t) -> std::string {
    auto row = detail::planAlgorithm(a, t, c);
    return row.isOk() ? row.value()->name : "error: " + row.status().message();
  };
  EXPECT_EQ(name(large, twoByTwo), "hierarchical");
  EXPECT_EQ(name(small, twoByTwo), "recursive_doubling");
  EXPECT_EQ(name(large, oneByFour), "ring");
  EXPECT_EQ(name(large, fourByOne), "ring");
  for (OpType op : {OpType::kAllgather, OpType::kReduceScatter}) {
    detail::CallArgs a;
    a.op = op;
    a.dtype = DataType::kFloat32;
    a.counts = {1 << 18, 1 << 18, 1 << 18, 1 << 18};
    EXPECT_EQ(name(a, twoByTwo), "hierarchical") << opTypeName(op);
    EXPECT_EQ(name(a, oneByFour), "ring") << opTypeName(op);
  }
  detail::CallArgs bcast = large;
  bcast.op = OpType::kBroadcast;
  bcast.root = 1;
  EXPECT_EQ(name(bcast, twoByTwo), "hierarchical");

  c.algo = "ring";  // flat, whatever the topology
  EXPECT_EQ(name(large, twoByTwo), "ring");
  c.algo = "hierarchical";
  EXPECT_EQ(name(small, twoByTwo), "hierarchical");
  detail::CallArgs reduce = large;
  reduce.op = OpType::kReduce;
  reduce.root = 0;
  EXPECT_EQ(name(reduce, twoByTwo), "ring");  // no hierarchical reduce: auto
  for (const Topology* flat : {&oneByFour, &fourByOne}) {
    auto row = detail::planAlgorithm(large, *flat, c);
    ASSERT_FALSE(row.isOk());
    EXPECT_EQ(row.status().code(), StatusCode::kInvalidArgument);
    const std::string& m = row.status().message();
    EXPECT_NE(m.find("NANOCCL_ALGO"), std::string::npos) << m;
    EXPECT_NE(m.find("topology is flat"), std::string::npos) << m;
    EXPECT_NE(m.find(flat->describe()), std::string::npos) << m;
  }
}

TEST(HierarchicalTopology, NodesNumberedByLowestRank) {
  const Topology t = Topology::fromNodeIds(nodeIdsOf("babca"));
  ASSERT_EQ(t.numNodes(), 3);
  EXPECT_EQ(t.nodeRanks[0], (std::vector<int>{0, 2}));
  EXPECT_EQ(t.nodeRanks[1], (std::vector<int>{1, 4}));
  EXPECT_EQ(t.nodeRanks[2], (std::vector<int>{3}));
  EXPECT_EQ(t.localRankOf, (std::vector<int>{0, 0, 1, 0, 1}));
  EXPECT_EQ(t.minLocalSize(), 1);
  EXPECT_EQ(t.maxLocalSize(), 2);
  EXPECT_TRUE(t.hierarchical());
  EXPECT_EQ(t.describe(), "3 nodes: [0 2] [1 4] [3]");
  EXPECT_FALSE(defaultNodeId().empty());
}

// NANOCCL_NODE_ID (Config::nodeId) wins over CommunicatorOptions::nodeId.
TEST(HierarchicalTopology, ConfigNodeIdOverridesOptions) {
  WorldOptions o = hierWorld("2x2", "auto");
  o.nodeIds = nodeIdsOf("abab");  // what the options say...
  auto store = std::make_shared<InMemoryStore>();
  std::vector<Result<std::shared_ptr<Communicator>>> results(
      4, Result<std::shared_ptr<Communicator>>(Status()));
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back([&, r] {
      CommunicatorOptions co;
      co.rank = r;
      co.size = 4;
      co.store = store;
      co.commId = "override";
      co.config = worldConfig(o);
      co.config.nodeId = r < 2 ? "env-a" : "env-b";  // ...and what the environment says
      co.nodeId = o.nodeIds[r];
      co.timeout = o.timeout;
      results[r] = Communicator::create(co);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(results[r].isOk()) << results[r].status().toString();
    EXPECT_EQ(results[r].value()->topology().describe(), "2 nodes: [0 1] [2 3]");
  }
}

// Inter-node bytes per node per allreduce: within 5% of the ideal 2(m-1)/m x size, read from
// the stats as the study reads them.
class InterNodeBytes : public ::testing::TestWithParam<std::string> {};

TEST_P(InterNodeBytes, AllreduceNearIdeal) {
  Comms comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(hierWorld(GetParam(), "auto"), comms);
  const Topology& topo = comms[0]->topology();
  const int n = static_cast<int>(comms.size());
  const int m = topo.numNodes();
  constexpr size_t kCount = (size_t{1} << 20) + 5;  // 4 MB of float32
  const double bytes = static_cast<double>(kCount * sizeof(float));

  auto interPerNode = [&](const std::vector<CommStats>& before, bool sent) {
    std::vector<double> perNode(m, 0.0);
    for (int r = 0; r < n; ++r) {
      const CommStats after = comms[r]->stats();
      perNode[topo.nodeOf[r]] += static_cast<double>(
          sent ? after.interNodeBytesSent - before[r].interNodeBytesSent
               : after.interNodeBytesReceived - before[r].interNodeBytesReceived);
    }
    return perNode;
  };
  std::vector<CommStats> before;
  for (int r = 0; r < n; ++r) before.push_back(comms[r]->stats());
  std::vector<std::vector<float>> bufs(n, std::vector<float>(kCount, 1.0f));
  std::vector<std::shared_ptr<Task>> tasks;
  for (int r = 0; r < n; ++r) {
    tasks.push_back(
        comms[r]->allreduce(bufs[r].data(), kCount, DataType::kFloat32, ReduceOp::kSum));
  }
  expectAllOk(tasks);
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(bufs[r][kCount - 1], static_cast<float>(n));
    EXPECT_EQ(callsOf(comms[r]->stats(), "allreduce/hierarchical"), 1u) << "rank " << r;
  }
  const double ideal = 2.0 * (m - 1) / m * bytes;
  for (bool sent : {true, false}) {
    const std::vector<double> perNode = interPerNode(before, sent);
    for (int k = 0; k < m; ++k) {
      EXPECT_NEAR(perNode[k], ideal, 0.05 * ideal)
          << "node " << k << (sent ? " sent " : " received ") << perNode[k] << " bytes, ideal "
          << ideal;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, InterNodeBytes,
                         ::testing::Values("2x2", "3x2", "2x3", "2p1", "3p1p2", "2x2i", "2p3i"));

// The flat ring on 2x2 sends 1.5x the size across nodes per node; hierarchical sends 1x.
TEST(InterNodeBytesFlat, RingSendsMoreAcrossNodes) {
  constexpr size_t kCount = size_t{1} << 19;
  std::vector<double> inter;
  for (const char* algo : {"ring", "hierarchical"}) {
    Comms comms;
    NANOCCL_MAKE_WORLD_OR_SKIP(hierWorld("2x2", algo), comms);
    std::vector<std::vector<float>> bufs(4, std::vector<float>(kCount, 2.0f));
    std::vector<std::shared_ptr<Task>> tasks;
    for (int r = 0; r < 4; ++r) {
      tasks.push_back(
          comms[r]->allreduce(bufs[r].data(), kCount, DataType::kFloat32, ReduceOp::kSum));
    }
    expectAllOk(tasks);
    double total = 0;
    for (int r = 0; r < 4; ++r) total += static_cast<double>(comms[r]->stats().interNodeBytesSent);
    inter.push_back(total / 2);  // per node
  }
  const double bytes = kCount * sizeof(float);
  EXPECT_NEAR(inter[0], 1.5 * bytes, 0.05 * bytes);
  EXPECT_NEAR(inter[1], 1.0 * bytes, 0.05 * bytes);
}

// NANOCCL_ALGO=hierarchical on a flat topology: every op with a hierarchical row fails at
// once with an argument error that says why; other ops and the communicator go on.
class ForcedOnFlat : public ::testing::TestWithParam<std::string> {};

TEST_P(ForcedOnFlat, ClearErrorAndStillUsable) {
  Comms comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(hierWorld(GetParam(), "hierarchical"), comms);
  const int n = static_cast<int>(comms.size());
  std::vector<std::vector<float>> bufs(n, std::vector<float>(64 * n, 1.0f));
  const std::vector<size_t> counts(n, 16);
  for (int r = 0; r < n; ++r) {
    Communicator& c = *comms[r];
    for (const auto& task :
         {c.allreduce(bufs[r].data(), 16, DataType::kFloat32, ReduceOp::kSum),
          c.reduceScatter(bufs[r].data(), bufs[r].data() + 32 * n, counts, DataType::kFloat32,
                          ReduceOp::kSum),
          c.allgather(bufs[r].data(), 16, bufs[r].data() + 32 * n, counts, DataType::kFloat32),
          c.broadcast(bufs[r].data(), 16, DataType::kFloat32, 0)}) {
      ASSERT_TRUE(task->test()) << "not failed at once";
      const Status& s = task->status();
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.toString();
      EXPECT_NE(s.message().find("'hierarchical' (NANOCCL_ALGO)"), std::string::npos)
          << s.toString();
      EXPECT_NE(s.message().find("topology is flat"), std::string::npos) << s.toString();
      EXPECT_NE(s.message().find("NANOCCL_NODE_ID"), std::string::npos) << s.toString();
    }
  }
  // No sequence number was used: a reduce (no hierarchical row: auto) still works.
  std::vector<std::shared_ptr<Task>> tasks;
  for (int r = 0; r < n; ++r) {
    tasks.push_back(comms[r]->reduce(bufs[r].data(), 16, DataType::kFloat32, ReduceOp::kSum, 0));
  }
  expectAllOk(tasks);
  EXPECT_EQ(bufs[0][15], static_cast<float>(n));
}

INSTANTIATE_TEST_SUITE_P(Shapes, ForcedOnFlat, ::testing::Values("1x4", "4x1"));

// A peer gone in the middle of a hierarchical allreduce: every other rank fails, on whichever
// sub-communicator it waits, through the broken connections and the aborts they set off, well
// before the 20 s timeout.
class HierarchicalFaults : public ::testing::TestWithParam<std::string> {};

// 16 MB: the pipelined allreduce, whose helper threads must all stop.
TEST_P(HierarchicalFaults, PeerDestroyedMidAllreduce) {
  Comms comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(hierWorld("2x2", "hierarchical", "epoll", GetParam(), 20000), comms);
  constexpr size_t kCount = size_t{4} << 20;
  std::vector<std::vector<float>> bufs(4, std::vector<float>(kCount, 1.0f));
  std::vector<std::shared_ptr<Task>> tasks;
  for (int r = 0; r < 3; ++r) {
    tasks.push_back(
        comms[r]->allreduce(bufs[r].data(), kCount, DataType::kFloat32, ReduceOp::kSum));
  }
  ASSERT_TRUE(waitUntilSending(comms, 3)) << "the allreduce never started";
  comms[3].reset();
  const std::vector<Status> st = waitAll(tasks, std::chrono::seconds(40));
  for (int r = 0; r < 3; ++r) {
    EXPECT_FALSE(st[r].isOk()) << "rank " << r;
    EXPECT_NE(st[r].code(), StatusCode::kTimeout) << "rank " << r << ": " << st[r].toString();
    EXPECT_EQ(st[r].message().find("caller's deadline"), std::string::npos) << "rank " << r;
  }
}

// 4 MB: the allreduce that runs its stages one after another.
TEST_P(HierarchicalFaults, PeerAbortsMidAllreduce) {
  Comms comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(hierWorld("2x3", "hierarchical", "uring", GetParam(), 20000), comms);
  constexpr size_t kCount = size_t{1} << 20;
  std::vector<std::vector<float>> bufs(6, std::vector<float>(kCount, 1.0f));
  std::vector<std::shared_ptr<Task>> tasks;
  for (int r = 0; r < 5; ++r) {
    tasks.push_back(
        comms[r]->allreduce(bufs[r].data(), kCount, DataType::kFloat32, ReduceOp::kSum));
  }
  ASSERT_TRUE(waitUntilSending(comms, 5)) << "the allreduce never started";
  comms[5]->abort(abortedError("test abort by rank 5"));
  tasks.push_back(comms[5]->allreduce(bufs[5].data(), kCount, DataType::kFloat32, ReduceOp::kSum));
  const std::vector<Status> st = waitAll(tasks, std::chrono::seconds(40));
  for (size_t r = 0; r < st.size(); ++r) {
    EXPECT_FALSE(st[r].isOk()) << "rank " << r;
    EXPECT_NE(st[r].code(), StatusCode::kTimeout) << "rank " << r << ": " << st[r].toString();
    EXPECT_NE(st[r].message().find("test abort by rank 5"), std::string::npos)
        << "rank " << r << ": " << st[r].toString();
  }
}

INSTANTIATE_TEST_SUITE_P(Intra, HierarchicalFaults, ::testing::Values("shm", "tcp"));

// Ranks that disagree about the count of a hierarchical call: the fingerprint travels on the
// sub-communicators too, so it is a mismatch that every rank hears of.
TEST(HierarchicalMismatch, CountInsideTheStages) {
  Comms comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(hierWorld("2x2", "hierarchical", "epoll", "shm", 5000), comms);
  std::vector<std::vector<float>> bufs(4, std::vector<float>(5000, 1.0f));
  std::vector<std::shared_ptr<Task>> tasks;
  for (int r = 0; r < 4; ++r) {
    tasks.push_back(comms[r]->allreduce(bufs[r].data(), r == 3 ? 4000 : 4096, DataType::kFloat32,
                                        ReduceOp::kSum));
  }
  const std::vector<Status> st = waitAll(tasks, std::chrono::seconds(40));
  bool mismatch = false;
  for (int r = 0; r < 4; ++r) {
    EXPECT_FALSE(st[r].isOk()) << "rank " << r;
    EXPECT_EQ(st[r].message().find("caller's deadline"), std::string::npos) << "rank " << r;
    mismatch = mismatch || st[r].code() == StatusCode::kMismatch;
  }
  EXPECT_TRUE(mismatch) << st[3].toString();
}

// Counts on both sides of the planner's size threshold: one rank runs the flat small-message
// algorithm, the others the hierarchical one, on different transports. Nobody can see the
// other's fingerprint, so this ends in a timeout, on every rank, not a hang.
TEST(HierarchicalMismatch, CountAcrossThePlannerThreshold) {
  Comms comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(hierWorld("2x2", "auto", "epoll", "tcp", 1500), comms);
  std::vector<std::vector<float>> bufs(4, std::vector<float>(100000, 1.0f));
  std::vector<std::shared_ptr<Task>> tasks;
  for (int r = 0; r < 4; ++r) {
    tasks.push_back(comms[r]->allreduce(bufs[r].data(), r == 0 ? 100 : 100000, DataType::kFloat32,
                                        ReduceOp::kSum));
  }
  const std::vector<Status> st = waitAll(tasks, std::chrono::seconds(40));
  for (int r = 0; r < 4; ++r) {
    EXPECT_FALSE(st[r].isOk()) << "rank " << r;
    EXPECT_EQ(st[r].message().find("caller's deadline"), std::string::npos) << "rank " << r;
  }
}

int threadCount() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}

// Threads named "nanoccl-<role>" of this process: how many have `role`.
int threadsOf(const std::string& role) {
  int n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      std::ifstream f(std::string("/proc/self/task/") + e->d_name + "/comm");
      std::string name;
      n += std::getline(f, name) && name == "nanoccl-" + role;
    }
    closedir(d);
  }
  return n;
}

// The groups ride the communicator's transport (no progress thread of their own), the
// pipeline's helper is started by the first pipelined call and kept, and everything ends with
// the communicators.
TEST(HierarchicalLifecycle, NoThreadsOfTheirOwnNonePerCallNoneLeft) {
  const int before = threadCount();
  {
    Comms comms;
    NANOCCL_MAKE_WORLD_OR_SKIP(hierWorld("2p3i", "hierarchical", "uring", "shm"), comms);
    EXPECT_EQ(threadsOf("tcp"), 5);
    EXPECT_EQ(threadsOf("shm"), 5);
    EXPECT_EQ(threadsOf("stage"), 0);
    constexpr size_t kCount = size_t{3} << 20;  // 12 MB: 3 blocks
    std::vector<std::vector<float>> bufs(5, std::vector<float>(kCount, 1.0f));
    for (int call = 0; call < 2; ++call) {
      std::vector<std::shared_ptr<Task>> tasks;
      for (int r = 0; r < 5; ++r) {
        tasks.push_back(
            comms[r]->allreduce(bufs[r].data(), kCount, DataType::kFloat32, ReduceOp::kSum));
      }
      expectAllOk(tasks);
      // Nodes of 2 and 3 ranks: 2 shards, carried by local ranks 0 and 1 of each node.
      EXPECT_EQ(threadsOf("stage"), 4);
      EXPECT_EQ(threadsOf("tcp") + threadsOf("shm"), 10);
    }
    EXPECT_EQ(bufs[4][kCount - 1], 25.0f);
  }
  EXPECT_EQ(threadCount(), before);
}

// Not a check: the timing asked for in the hierarchy issue, run by hand with
//   nanoccl_collectives_hier_test --gtest_also_run_disabled_tests --gtest_filter='*Perf*'
// (2 emulated nodes x 2 ranks as threads of one process on loopback; NANOCCL_PERF_MB sets the
// size).
TEST(HierarchicalPerf, DISABLED_Allreduce64MBRingVersusHierarchical) {
  size_t mb = 64;
  if (const char* v = std::getenv("NANOCCL_PERF_MB")) mb = std::strtoull(v, nullptr, 10);
  const size_t count = mb * (size_t{1} << 20) / sizeof(float);
  constexpr int kIters = 5;
  for (const char* intra : {"shm", "tcp"}) {
    for (const char* algo : {"ring", "hierarchical"}) {
      Comms comms;
      NANOCCL_MAKE_WORLD_OR_SKIP(hierWorld("2x2", algo, "epoll", intra, 120000), comms);
      std::vector<std::vector<float>> bufs(4, std::vector<float>(count, 1.0f));
      std::vector<double> ms;
      for (int it = 0; it <= kIters; ++it) {
        const auto t0 = std::chrono::steady_clock::now();
        std::vector<std::shared_ptr<Task>> tasks;
        for (int r = 0; r < 4; ++r) {
          tasks.push_back(
              comms[r]->allreduce(bufs[r].data(), count, DataType::kFloat32, ReduceOp::kSum));
        }
        for (const Status& s : waitAll(tasks, std::chrono::seconds(300))) {
          ASSERT_TRUE(s.isOk()) << s.toString();
        }
        const auto t1 = std::chrono::steady_clock::now();
        if (it > 0) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      }
      std::sort(ms.begin(), ms.end());
      const double median = ms[ms.size() / 2];
      std::printf(
          "allreduce %zu MB, 2x2, %-12s intra %s: median %.1f ms (min %.1f), algbw %.2f GB/s\n", mb,
          algo, intra, median, ms.front(), count * sizeof(float) / median / 1e6);
    }
  }
}

}  // namespace
}  // namespace nanoccl::colltest
