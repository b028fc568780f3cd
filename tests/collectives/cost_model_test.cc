// The cost model (collectives/cost_model.h) and the planner's use of it: which row and codec a
// link profile leads to, and a whole world choosing the codec under compression "auto".
#include "collectives/cost_model.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iterator>
#include <thread>

#include "collectives/codec/codec.h"
#include "collectives/device/host_device.h"
#include "collectives/planner.h"
#include "tests/collectives/test_util.h"

namespace nanoccl {
namespace {

using detail::CallArgs;
using detail::Plan;

// 1 Gbit/s between nodes, shared memory within: compression pays for large messages.
LinkProfile slowLinks() {
  LinkProfile p;
  p.shape = "2x2";
  p.transport = "tcp";
  p.nsocks = Config().nsocks;
  p.measured = "2026-11-24T00:00:00Z";
  p.inter = {true, 60, 117, 118};
  p.intra = {true, 8, 4000, 4000};
  p.reduceMBps = 8000;
  p.cpuShare = 1;
  p.codecs = {{"fp16", 6000, 6000, 5000},
              {"bf16", 6000, 6000, 5000},
              {"int8", 3000, 4000, 3500},
              {"int4", 2000, 3000, 2500}};
  return p;
}

// Links far faster than the codecs: compression costs more than it saves.
LinkProfile fastLinks() {
  LinkProfile p = slowLinks();
  p.inter = {true, 20, 20000, 20000};
  p.intra = {true, 5, 20000, 20000};
  for (CodecRates& c : p.codecs) c = {c.name, 400, 400, 400};
  return p;
}

// slowLinks() for 3 nodes of one rank.
const LinkProfile& slowProfileOf3() {
  static const LinkProfile p = [] {
    LinkProfile q = slowLinks();
    q.shape = "3x1";
    q.intra = LinkClassProfile{};
    return q;
  }();
  return p;
}

CallArgs allreduce(size_t bytes, DataType dtype = DataType::kFloat32) {
  CallArgs a;
  a.op = OpType::kAllreduce;
  a.dtype = dtype;
  a.redop = ReduceOp::kSum;
  a.count = bytes / dataTypeSize(dtype);
  return a;
}

const Topology k2x2 = Topology::fromNodeIds({"a", "a", "b", "b"});

Plan planned(CallArgs args, const LinkProfile* p, Config c = Config()) {
  Result<Plan> plan = detail::plan(args, k2x2, c, p);
  EXPECT_TRUE(plan.isOk()) << plan.status().toString();
  return plan.isOk() ? plan.value() : Plan{};
}

std::string codecName(const Plan& p) { return p.codec == nullptr ? "none" : p.codec->name; }

// The allreduce row of that name on k2x2, as NANOCCL_ALGO names one (null: none).
const detail::AlgorithmRow* allreduceRow(const char* name) {
  Config c;
  c.algo = name;
  Result<const detail::AlgorithmRow*> row = detail::planAlgorithm(allreduce(64 << 20), k2x2, c);
  return row.isOk() ? row.value() : nullptr;
}

TEST(CostModel, SlowLinksTakeTheCodecForLargeMessagesAndLosslessForSmallOnes) {
  const LinkProfile p = slowLinks();
  CallArgs large = allreduce(256 << 20);
  large.codecAuto = true;
  const Plan big = planned(large, &p);
  EXPECT_STREQ(big.row->name, "hierarchical");
  EXPECT_EQ(codecName(big), "int8");
  EXPECT_TRUE(std::isfinite(big.predictedSeconds));
  // 2 x 256 MB x (1/2) across a 117 MB/s link, a quarter of it under int8: about 0.6 s.
  EXPECT_GT(big.predictedSeconds, 0.3);
  EXPECT_LT(big.predictedSeconds, 1.5);

  CallArgs tiny = allreduce(4);
  tiny.codecAuto = true;
  const Plan small = planned(tiny, &p);
  EXPECT_STREQ(small.row->name, "recursive_doubling");
  EXPECT_EQ(codecName(small), "none");
}

TEST(CostModel, CodecsSlowerThanTheLinkAreLeftOut) {
  const LinkProfile p = fastLinks();
  CallArgs large = allreduce(256 << 20);
  large.codecAuto = true;
  const Plan plan = planned(large, &p);
  EXPECT_EQ(codecName(plan), "none");
  EXPECT_STREQ(plan.row->name, "hierarchical");
}

TEST(CostModel, OnlyAllowedCodecsAreChosen) {
  const LinkProfile p = slowLinks();
  CallArgs large = allreduce(256 << 20);
  large.codecAuto = true;
  Config c;
  c.compressionAllow = "none,bf16";
  EXPECT_EQ(codecName(planned(large, &p, c)), "bf16");
  c.compressionAllow = "none,bf16,int8,int4";
  EXPECT_EQ(codecName(planned(large, &p, c)), "int4");
  c.compressionAllow = "none";
  EXPECT_EQ(codecName(planned(large, &p, c)), "none");
}

TEST(CostModel, PredictionsGrowWithSizeAndShrinkWithBandwidth) {
  const LinkProfile slow = slowLinks();
  const LinkProfile fast = fastLinks();
  for (const detail::AlgorithmRow& row : detail::algorithmTable()) {
    if (row.op != OpType::kAllreduce || row.supports(allreduce(4), k2x2).code() != StatusCode::kOk) {
      continue;
    }
    if (row.device) continue;  // host-memory calls only here; one device row a topology, unpriced
    double last = 0;
    for (size_t bytes = 4; bytes <= (size_t{256} << 20); bytes *= 16) {
      const double t = detail::predictSeconds(row, allreduce(bytes), k2x2, slow, 1 << 20);
      ASSERT_TRUE(std::isfinite(t)) << row.name;
      EXPECT_GE(t, last) << row.name << " at " << bytes;
      EXPECT_LT(detail::predictSeconds(row, allreduce(bytes), k2x2, fast, 1 << 20), t) << row.name;
      last = t;
    }
  }
}

TEST(CostModel, ForcedSettingsWin) {
  const LinkProfile p = slowLinks();
  CallArgs large = allreduce(256 << 20);
  large.codecAuto = true;
  Config c;
  c.algo = "ring";  // lossless: auto compression has nothing to compress with
  Plan plan = planned(large, &p, c);
  EXPECT_STREQ(plan.row->name, "ring");
  EXPECT_EQ(codecName(plan), "none");

  // A fixed codec keeps its lossy row whatever the profile says.
  const LinkProfile fast = fastLinks();
  CallArgs fixed = allreduce(256 << 20);
  Result<const codec::Codec*> int8 = codec::findCodec("int8");
  ASSERT_TRUE(int8.isOk());
  fixed.codec = int8.value();
  plan = planned(fixed, &fast);
  EXPECT_STREQ(plan.row->name, "hierarchical");
  EXPECT_EQ(codecName(plan), "int8");
}

// NANOCCL_ALGO=compressed (one rank a node) with compression "auto": the row needs a codec,
// so it gets one of the allowed codecs (the fastest predicted; without a profile the first).
TEST(CostModel, AForcedCompressedRowTakesAnAllowedCodec) {
  const Topology flat = Topology::fromNodeIds({"a", "b", "c"});
  CallArgs large = allreduce(64 << 20);
  large.codecAuto = true;
  Config c;
  c.algo = "compressed";
  for (const LinkProfile* p : {static_cast<const LinkProfile*>(nullptr), &slowProfileOf3()}) {
    Result<Plan> plan = detail::plan(large, flat, c, p);
    ASSERT_TRUE(plan.isOk()) << plan.status().toString();
    EXPECT_STREQ(plan.value().row->name, "compressed");
    ASSERT_NE(plan.value().codec, nullptr);
    EXPECT_EQ(std::string(plan.value().codec->name), p == nullptr ? "bf16" : "int8");
  }
  c.compressionAllow = "none";  // nothing to compress with: the forced row cannot run
  EXPECT_FALSE(detail::plan(large, flat, c, nullptr).isOk());
}

TEST(CostModel, WithoutAProfileTheRulesStandAndAutoIsLossless) {
  CallArgs large = allreduce(256 << 20);
  large.codecAuto = true;
  const Plan plan = planned(large, nullptr);
  EXPECT_STREQ(plan.row->name, "hierarchical");
  EXPECT_EQ(codecName(plan), "none");
  EXPECT_FALSE(std::isfinite(plan.predictedSeconds));
}

TEST(CostModel, OpsTheModelDoesNotCoverKeepTheRules) {
  const LinkProfile p = slowLinks();
  CallArgs b;
  b.op = OpType::kBroadcast;
  b.dtype = DataType::kFloat32;
  b.count = 1 << 20;
  b.root = 0;
  Result<const detail::AlgorithmRow*> ruled = detail::planAlgorithm(b, k2x2, Config());
  ASSERT_TRUE(ruled.isOk());
  const Plan plan = planned(b, &p);
  EXPECT_EQ(plan.row, ruled.value());
  EXPECT_FALSE(std::isfinite(plan.predictedSeconds));
}

// ---- device rows ----------------------------------------------------------------------------

// A host device that reports the rates of a GPU: copies of `copy` MB/s each way, node stages on
// links of `node` MB/s (0: the node's transport).
class RatedDevice : public HostDevice {
 public:
  RatedDevice(double copy, double node) : copy_(copy), node_(node) {}
  double copyMBps() const override { return copy_; }
  double nodeMBps() const override { return node_; }

 private:
  double copy_;
  double node_;
};

CallArgs onDevice(OpType op, size_t bytes, std::shared_ptr<Device> device, int ranks) {
  CallArgs a;
  a.op = op;
  a.dtype = DataType::kFloat32;
  a.redop = ReduceOp::kSum;
  a.count = bytes / 4;
  a.device = std::move(device);
  if (op == OpType::kAllgather || op == OpType::kReduceScatter) {
    a.counts.assign(static_cast<size_t>(ranks), a.count);
  }
  return a;
}

TEST(CostModel, DeviceRowsArePricedWithTheDevicesRates) {
  const LinkProfile p = slowLinks();
  auto pcie = std::make_shared<RatedDevice>(20000, 20000);
  auto slowBus = std::make_shared<RatedDevice>(50, 50);
  for (OpType op :
       {OpType::kAllreduce, OpType::kBroadcast, OpType::kAllgather, OpType::kReduceScatter}) {
    SCOPED_TRACE(opTypeName(op));
    const Plan fast = planned(onDevice(op, 64 << 20, pcie, 4), &p);
    ASSERT_NE(fast.row, nullptr);
    EXPECT_STREQ(fast.row->name, "device_staged");
    EXPECT_TRUE(std::isfinite(fast.predictedSeconds));
    EXPECT_GT(fast.predictedSeconds, 0);
    // Copies slower than the link set the pace.
    const Plan slow = planned(onDevice(op, 64 << 20, slowBus, 4), &p);
    EXPECT_GT(slow.predictedSeconds, 2 * fast.predictedSeconds);
  }
  // Fast copies hide behind the link: the staged allreduce costs about the host path's
  // hierarchical one (the same stages, plus a copy of one chunk each way).
  const Plan host = planned(allreduce(64 << 20), &p);
  const Plan staged = planned(onDevice(OpType::kAllreduce, 64 << 20, pcie, 4), &p);
  EXPECT_STREQ(host.row->name, "hierarchical");
  EXPECT_GT(staged.predictedSeconds, 0.7 * host.predictedSeconds);
  EXPECT_LT(staged.predictedSeconds, 1.5 * host.predictedSeconds);
  // 32 MB shards at 50 MB/s down and up: a copy's time at least.
  const Plan choked = planned(onDevice(OpType::kAllreduce, 64 << 20, slowBus, 4), &p);
  EXPECT_GT(choked.predictedSeconds, (32 << 20) / 50e6);

  // Under compression "auto" the staged allreduce takes the codec the host path would.
  CallArgs big = onDevice(OpType::kAllreduce, 256 << 20, pcie, 4);
  big.codecAuto = true;
  const Plan compressed = planned(big, &p);
  EXPECT_STREQ(compressed.row->name, "device_staged");
  EXPECT_EQ(codecName(compressed), "int8");
  big.codecAuto = false;
  EXPECT_LT(compressed.predictedSeconds, planned(big, &p).predictedSeconds);

  // One node: device_node, on the device's own links (NCCL) or the node transport's.
  const Topology oneNode = Topology::fromNodeIds({"a", "a"});
  LinkProfile q = slowLinks();
  q.shape = "1x2";
  auto nccl = std::make_shared<RatedDevice>(20000, 20000);
  auto shm = std::make_shared<RatedDevice>(20000, 0);  // the profile's intra: 4000 MB/s
  Result<Plan> onNccl = detail::plan(onDevice(OpType::kAllreduce, 64 << 20, nccl, 2), oneNode,
                                     Config(), &q);
  Result<Plan> onShm = detail::plan(onDevice(OpType::kAllreduce, 64 << 20, shm, 2), oneNode,
                                    Config(), &q);
  ASSERT_TRUE(onNccl.isOk() && onShm.isOk());
  EXPECT_STREQ(onNccl.value().row->name, "device_node");
  EXPECT_TRUE(std::isfinite(onNccl.value().predictedSeconds));
  EXPECT_GT(onShm.value().predictedSeconds, 2 * onNccl.value().predictedSeconds);
}

// ---- a world under compression "auto" ----------------------------------------------------------

class AutoWorld : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/nanoccl_cost_XXXXXX";
    dir_ = ::mkdtemp(tmpl);
  }
  void TearDown() override { (void)std::system(("rm -rf '" + dir_ + "'").c_str()); }

  // A 2x2 world whose link profile is `p` (from the file), compression "auto".
  void makeWorld(const LinkProfile& p, std::vector<std::shared_ptr<Communicator>>& comms) {
    const std::string file = dir_ + "/p.txt";
    ASSERT_TRUE(saveProfile(p, file).isOk());
    colltest::WorldOptions o;
    o.size = 4;
    o.nodeIds = {"a", "a", "b", "b"};
    o.configure = [file](int, Config& c) {
      c.compression = "auto";  // turns tuning "off" into "cached": the file above
      c.tuningFile = file;
    };
    NANOCCL_MAKE_WORLD_OR_SKIP(o, comms);
  }

  // An allreduce of `count` floats: the values every rank got, and its stats afterwards.
  std::vector<std::vector<float>> run(std::vector<std::shared_ptr<Communicator>>& comms,
                                      size_t count) {
    std::vector<std::vector<float>> bufs(comms.size(), std::vector<float>(count));
    for (size_t r = 0; r < comms.size(); ++r) {
      for (size_t i = 0; i < count; ++i) {
        bufs[r][i] = std::sin(static_cast<float>(i) * 0.001f) * static_cast<float>(r + 1);
      }
    }
    std::vector<std::shared_ptr<Task>> tasks;
    for (size_t r = 0; r < comms.size(); ++r) {
      tasks.push_back(comms[r]->allreduce(bufs[r].data(), count, DataType::kFloat32,
                                          ReduceOp::kSum));
    }
    colltest::expectAllOk(tasks);
    return bufs;
  }

  std::string dir_;
};

TEST_F(AutoWorld, SlowLinksCompressAndStatsShowPredictedAndMeasured) {
  std::vector<std::shared_ptr<Communicator>> comms;
  makeWorld(slowLinks(), comms);
  if (comms.empty()) return;
  const size_t count = size_t{4} << 20;  // 16 MB
  const auto bufs = run(comms, count);
  double worst = 0;
  for (size_t i = 0; i < count; ++i) {
    const float want = std::sin(static_cast<float>(i) * 0.001f) * 10.0f;
    worst = std::max(worst, static_cast<double>(std::fabs(bufs[0][i] - want)));
    for (size_t r = 1; r < bufs.size(); ++r) ASSERT_EQ(bufs[r][i], bufs[0][i]) << r << " " << i;
  }
  EXPECT_GT(worst, 0);     // lossy: int8 across nodes
  EXPECT_LT(worst, 0.05);  // within int8's bound for |x| <= 10 (two nodes' sums of blocks)
  for (const auto& comm : comms) {
    const CommStats s = comm->stats();
    ASSERT_EQ(s.modelled.size(), 1u);
    EXPECT_EQ(s.modelled[0].what, "allreduce/hierarchical/int8");
    EXPECT_EQ(s.modelled[0].calls, 1u);
    EXPECT_GT(s.modelled[0].predictedSeconds, 0);
    EXPECT_GT(s.modelled[0].measuredSeconds, 0);
  }
}

// Device calls (host devices) are planned and priced too: on slow links under "auto" the staged
// allreduce takes int8 across nodes, and stats show the prediction beside the time from the
// call's start to the device passing its end fence.
TEST_F(AutoWorld, DeviceCallsShowPredictedAndMeasured) {
  std::vector<std::shared_ptr<Communicator>> comms;
  makeWorld(slowLinks(), comms);
  if (comms.empty()) return;
  const size_t count = size_t{1} << 20;
  std::vector<std::vector<float>> bufs(comms.size(), std::vector<float>(count, 1.0f));
  std::vector<std::shared_ptr<HostDevice>> devices;
  std::vector<std::shared_ptr<Task>> tasks;
  for (size_t r = 0; r < comms.size(); ++r) {
    devices.push_back(std::make_shared<HostDevice>());
    DeviceCall call;
    call.recv = bufs[r].data();
    call.count = count;
    call.device = devices[r];
    tasks.push_back(comms[r]->deviceCall(call));
  }
  colltest::expectAllOk(tasks);
  for (size_t r = 0; r < comms.size(); ++r) {
    ASSERT_TRUE(waitFence(*devices[r], *tasks[r]->deviceEnd(), Deadline::after(std::chrono::seconds(30)),
                          "the call's end")
                    .isOk());
    EXPECT_EQ(bufs[r][count - 1], 4.0f);
  }
  for (const auto& comm : comms) {
    // The watchdog records the time once it sees the end fence passed (it polls every ms).
    CommStats s = comm->stats();
    for (int i = 0; i < 5000 && s.modelled.empty(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      s = comm->stats();
    }
    ASSERT_EQ(s.modelled.size(), 1u);
    EXPECT_EQ(s.modelled[0].what, "allreduce/device_staged/int8");  // slow links: as a host call
    EXPECT_EQ(s.modelled[0].calls, 1u);
    EXPECT_GT(s.modelled[0].predictedSeconds, 0);
    EXPECT_GT(s.modelled[0].measuredSeconds, 0);
  }
}

// One connection a peer as fast as all of them (the emulated 1 Gbit/s link): the planned calls
// carry lanes 1 in their fingerprint (an error names it) and give the same results everywhere.
TEST_F(AutoWorld, OneSocketAsFastAsAllCarriesThePlannedCalls) {
  LinkProfile p = slowLinks();
  p.inter.oneSocketMBps = p.inter.nodeMBps;
  std::vector<std::shared_ptr<Communicator>> comms;
  makeWorld(p, comms);
  if (comms.empty()) return;
  const size_t count = size_t{2} << 20;  // 8 MB
  const auto bufs = run(comms, count);
  for (size_t i = 0; i < count; i += 997) {
    for (size_t r = 1; r < bufs.size(); ++r) ASSERT_EQ(bufs[r][i], bufs[0][i]) << r << " " << i;
  }
  EXPECT_NEAR(bufs[0][1234], std::sin(1.234f) * 10.0f, 0.05);
  // The nodes disagree about the next call's size: the mismatch shows the calls as stamped.
  std::vector<std::vector<float>> wrong = {std::vector<float>(count), std::vector<float>(count),
                                           std::vector<float>(count + 4096),
                                           std::vector<float>(count + 4096)};
  std::vector<std::shared_ptr<Task>> tasks;
  for (size_t r = 0; r < comms.size(); ++r) {
    tasks.push_back(comms[r]->allreduce(wrong[r].data(), wrong[r].size(), DataType::kFloat32,
                                        ReduceOp::kSum));
  }
  const std::vector<Status> st = colltest::waitAll(tasks, std::chrono::seconds(40));
  bool named = false;
  for (size_t r = 0; r < st.size(); ++r) {
    EXPECT_FALSE(st[r].isOk()) << "rank " << r;
    named = named || (st[r].code() == StatusCode::kMismatch &&
                      st[r].message().find("1 socket a peer") != std::string::npos);
  }
  EXPECT_TRUE(named) << st[0].toString() << "\n" << st[2].toString();
}

TEST_F(AutoWorld, FastLinksStayLossless) {
  std::vector<std::shared_ptr<Communicator>> comms;
  makeWorld(fastLinks(), comms);
  if (comms.empty()) return;
  const size_t count = size_t{4} << 20;
  const auto bufs = run(comms, count);
  for (size_t r = 1; r < bufs.size(); ++r) EXPECT_EQ(bufs[r], bufs[0]);
  EXPECT_NEAR(bufs[0][1234], std::sin(1.234f) * 10.0f, 1e-5);
  const CommStats s = comms[0]->stats();
  ASSERT_EQ(s.modelled.size(), 1u);
  EXPECT_EQ(s.modelled[0].what, "allreduce/hierarchical");
}

// The chunk of the compressed exchange: weighed per call from the candidates, the same for
// every size where the candidates cut a round's segments alike, and the user's when set.
TEST(CostModel, TheCompressedChunkIsPlannedUnlessSet) {
  const LinkProfile p = slowLinks();
  for (size_t bytes : {size_t{1} << 20, size_t{64} << 20, size_t{256} << 20}) {
    CallArgs a = allreduce(bytes);
    a.codecAuto = true;
    const Plan plan = planned(a, &p);
    ASSERT_EQ(codecName(plan), "int8") << bytes;
    const auto& c = detail::kChunkCandidates;
    EXPECT_NE(std::find(std::begin(c), std::end(c), plan.codecChunkBytes), std::end(c)) << bytes;
    // No candidate is predicted faster than the one chosen.
    for (size_t chunk : c) {
      CallArgs t = a;
      t.codec = plan.codec;
      t.codecParams = plan.codecParams;
      t.codecChunkBytes = chunk;
      EXPECT_GE(detail::predictSeconds(*plan.row, t, k2x2, p, Config().chunkBytes),
                plan.predictedSeconds) << bytes << " " << chunk;
    }
  }
  // 1 MB: every round's segment (256 KiB of float32 a rank) fits one chunk of any candidate,
  // so the default wins the tie.
  CallArgs small = allreduce(1 << 20);
  small.codecAuto = true;
  EXPECT_EQ(planned(small, &p).codecChunkBytes, Config().chunkBytes);
  // Set by the user: kept, at every size; lossless calls carry no codec chunk.
  Config c;
  ASSERT_TRUE(c.set("chunk_bytes", "65536").isOk());
  EXPECT_TRUE(c.chunkBytesSet);
  CallArgs big = allreduce(256 << 20);
  big.codecAuto = true;
  EXPECT_EQ(planned(big, &p, c).codecChunkBytes, 65536u);
  EXPECT_EQ(planned(allreduce(256 << 20), &p).codecChunkBytes, 0u);
  EXPECT_FALSE(Config().chunkBytesSet);
}

// The chunk of a lossless call's passes is weighed the same way, and so is a lossy plan's node
// stages'; the user's setting wins.
TEST(CostModel, TheLosslessChunkIsPlannedUnlessSet) {
  const LinkProfile p = slowLinks();
  const Plan big = planned(allreduce(256 << 20), &p);
  ASSERT_EQ(big.codec, nullptr);
  EXPECT_EQ(big.codecChunkBytes, 0u);
  // Each chunk a message on every link of a pass: where the segments span several chunks of
  // every candidate, the model takes the largest (fewest messages).
  EXPECT_EQ(big.chunkBytes, size_t{4} << 20);
  for (size_t chunk : detail::kChunkCandidates) {
    EXPECT_GE(detail::predictSeconds(*big.row, allreduce(256 << 20), k2x2, p, chunk),
              big.predictedSeconds) << chunk;
  }
  // 64 KiB: one chunk of any candidate, so the config's wins the tie (0: config.chunkBytes).
  EXPECT_EQ(planned(allreduce(64 << 10), &p).chunkBytes, 0u);
  // A compressed plan weighs its node stages' chunk too, beside its exchange's: here the
  // largest as well, and no pair of candidates is predicted faster.
  CallArgs lossy = allreduce(256 << 20);
  lossy.codecAuto = true;
  const Plan compressed = planned(lossy, &p);
  ASSERT_NE(compressed.codec, nullptr);
  EXPECT_EQ(compressed.chunkBytes, size_t{4} << 20);
  for (size_t chunk : detail::kChunkCandidates) {
    for (size_t passes : detail::kChunkCandidates) {
      CallArgs t = lossy;
      t.codec = compressed.codec;
      t.codecParams = compressed.codecParams;
      t.codecChunkBytes = chunk;
      EXPECT_GE(detail::predictSeconds(*compressed.row, t, k2x2, p, passes),
                compressed.predictedSeconds) << chunk << " " << passes;
    }
  }
  Config c;
  ASSERT_TRUE(c.set("chunk_bytes", "65536").isOk());
  EXPECT_EQ(planned(allreduce(256 << 20), &p, c).chunkBytes, 0u);
}

// The socket count: under a profile that measured one connection, one a peer unless all of
// them measured 10% faster (25% for a compressed call); without one, one for compressed calls
// and all for lossless ones; all where the user set nsocks (or there is one).
TEST(CostModel, OneSocketUnlessAllAreClearlyFaster) {
  LinkProfile p = slowLinks();
  const Config defaults;
  EXPECT_EQ(detail::plannedLanes(defaults, &p, false), 0);  // not measured
  EXPECT_EQ(detail::plannedLanes(defaults, &p, true), 1);
  EXPECT_EQ(detail::plannedLanes(defaults, nullptr, false), 0);
  EXPECT_EQ(detail::plannedLanes(defaults, nullptr, true), 1);
  p.inter.oneSocketMBps = p.inter.nodeMBps / 1.05;
  EXPECT_EQ(detail::plannedLanes(defaults, &p, false), 1);
  CallArgs a = allreduce(64 << 20);
  a.codecAuto = true;
  EXPECT_EQ(planned(a, &p).lanes, 1);
  EXPECT_EQ(planned(allreduce(4), &p).lanes, 1);  // every planned call alike
  EXPECT_EQ(planned(a, nullptr).lanes, 0);         // no profile: auto is lossless, all of them
  CallArgs int8 = allreduce(64 << 20);
  int8.codec = codec::findCodec("int8").value();
  EXPECT_EQ(planned(int8, nullptr).lanes, 1);  // no profile, compressed: one
  Config ringAlgo;
  ASSERT_TRUE(ringAlgo.set("algo", "ring").isOk());
  EXPECT_EQ(planned(int8, nullptr, ringAlgo).lanes, 0);  // a lossless row drops the codec
  Config forced;
  ASSERT_TRUE(forced.set("nsocks", "2").isOk());
  EXPECT_EQ(detail::plannedLanes(forced, &p, false), 0);
  EXPECT_EQ(detail::plannedLanes(forced, nullptr, true), 0);
  EXPECT_EQ(planned(int8, nullptr, forced).lanes, 0);
  Config one;
  one.nsocks = 1;
  EXPECT_EQ(detail::plannedLanes(one, &p, true), 0);
  // 15% faster over all of them: enough for a lossless call, not for a compressed one.
  p.inter.oneSocketMBps = p.inter.nodeMBps / 1.15;
  EXPECT_EQ(detail::plannedLanes(defaults, &p, false), 0);
  EXPECT_EQ(detail::plannedLanes(defaults, &p, true), 1);
  EXPECT_EQ(planned(a, &p).lanes, 1);                   // auto: int8 on one connection
  EXPECT_EQ(planned(allreduce(64 << 20), &p).lanes, 0);  // lossless on all
  p.inter.oneSocketMBps = p.inter.nodeMBps / 1.5;  // one connection cannot fill the link
  EXPECT_EQ(detail::plannedLanes(defaults, &p, false), 0);
  EXPECT_EQ(detail::plannedLanes(defaults, &p, true), 0);
  // The model prices one connection at its own measured rate.
  CallArgs m = allreduce(64 << 20);
  const detail::AlgorithmRow* ring = allreduceRow("ring");
  ASSERT_NE(ring, nullptr);
  const double all = detail::predictSeconds(*ring, m, k2x2, p, 1 << 20);
  m.lanes = 1;
  EXPECT_GT(detail::predictSeconds(*ring, m, k2x2, p, 1 << 20), 1.3 * all);
}

// More chunks a round pay more messages and hide more of the turn: chunks far smaller than the
// candidates cost more than they hide, and one chunk a round exposes the turn.
TEST(CostModel, TinyChunksPayForTheirMessages) {
  LinkProfile p = slowLinks();
  CallArgs a = allreduce(64 << 20);
  a.codec = codec::findCodec("int8").value();
  const detail::AlgorithmRow* row = allreduceRow("hierarchical");
  ASSERT_NE(row, nullptr);
  auto at = [&](size_t chunk) {
    CallArgs t = a;
    t.codecChunkBytes = chunk;
    return detail::predictSeconds(*row, t, k2x2, p, 1 << 20);
  };
  EXPECT_GT(at(4 << 10), at(256 << 10));
  EXPECT_GT(at(16 << 10), at(256 << 10));
  // A slow turn (a slow codec): chunks whose wire time covers it win over one chunk a round.
  for (CodecRates& c : p.codecs) c = {c.name, 500, 500, 500};
  CallArgs big = allreduce(256 << 20);
  big.codec = a.codec;
  big.codecChunkBytes = 1 << 20;
  const double one = detail::predictSeconds(*row, big, k2x2, p, 1 << 20);
  big.codecChunkBytes = 256 << 10;
  EXPECT_LT(detail::predictSeconds(*row, big, k2x2, p, 1 << 20), one);
}

// The profile the tuner measured on the emulated 2x2 cluster at 10 Gbit/s, where 4 ranks on 2
// cores set the pace, not the link (results/tuning/grid_2x2_10gbit_fresh.txt). There a 256 MB
// int8 allreduce ran 10-13% slower in 256 KiB chunks than in 1 MiB ones, and fastest with
// 4 MiB chunks on its node stages as well: each message costs CPU time, not only wire time.
TEST(CostModel, WhereTheCpuSetsThePaceMessagesCostItsTime) {
  const Result<LinkProfile> measured = LinkProfile::parse(
      "version 1\nshape 2x2\ntransport tcp\nnsocks 2\nmeasured 2026-11-26T19:21:38Z\n"
      "inter alpha_us 30.49 pair_MBps 784.8 node_MBps 720.6\ninter_one_socket_MBps 1009\n"
      "intra alpha_us 16.32 pair_MBps 5621 node_MBps 5621\nreduce_MBps 13876\ncpu_share 0.5\n"
      "codec fp16 encode_MBps 17634 decode_MBps 13820 accumulate_MBps 18178\n"
      "codec bf16 encode_MBps 14927 decode_MBps 16769 accumulate_MBps 19090\n"
      "codec int8 encode_MBps 11338 decode_MBps 21253 accumulate_MBps 12212\n"
      "codec int4 encode_MBps 11693 decode_MBps 16243 accumulate_MBps 13002\n",
      "grid_2x2_10gbit_fresh");
  ASSERT_TRUE(measured.isOk()) << measured.status().message();
  const LinkProfile& p = measured.value();
  CallArgs a = allreduce(256 << 20);
  a.codecAuto = true;
  const Plan plan = planned(a, &p);
  ASSERT_EQ(codecName(plan), "int8");
  EXPECT_EQ(plan.lanes, 1);
  EXPECT_NE(plan.codecChunkBytes, size_t{256} << 10);  // 0: the config's 1 MiB
  EXPECT_EQ(plan.chunkBytes, size_t{4} << 20);
}

TEST(CostModelSettings, CompressionAllowIsChecked) {
  Config c;
  EXPECT_TRUE(c.set("compression", "auto").isOk());
  EXPECT_TRUE(c.set("compression_allow", "none,int4").isOk());
  const Status bad = c.set("compression_allow", "none,int3");
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("'int3' is not a codec"), std::string::npos) << bad.toString();
  EXPECT_FALSE(c.set("compression_allow", "").isOk());
  EXPECT_FALSE(c.set("compression_allow", "int8,").isOk());
}

TEST(CostModel, ARingIsNoFasterThanItsBytesOverTheLink) {
  // Each rank of a ring allreduce sends 2 (n - 1) / n of the buffer over its link, whatever the
  // chunking: on the 2x2 topology's crossing links, 256 MB take at least 384 MB / 117 MB/s.
  const LinkProfile p = slowLinks();
  const detail::AlgorithmRow* ring = allreduceRow("ring");
  ASSERT_NE(ring, nullptr);
  for (size_t bytes : {size_t{4} << 20, size_t{64} << 20, size_t{256} << 20}) {
    const double floor = 2.0 * 3 / 4 * static_cast<double>(bytes) / 117e6;
    const double t = detail::predictSeconds(*ring, allreduce(bytes), k2x2, p, 1 << 20);
    EXPECT_GE(t, floor) << bytes;
    EXPECT_LT(t, 1.3 * floor) << bytes;
  }
  // So on slow links the hierarchy (half the bytes across nodes) is planned for large calls.
  EXPECT_STREQ(planned(allreduce(256 << 20), &p).row->name, "hierarchical");
}

// ---- calls priced without a communicator (nanoccl-advise) -----------------------------------

detail::CallPrediction predicted(const std::string& op, size_t count, const std::string& codec = "",
                                 int crossing = 1, const Topology& t = k2x2) {
  Result<detail::CallPrediction> p = detail::predictCall(op, count, DataType::kFloat32, codec,
                                                         crossing, t, Config(), slowLinks());
  EXPECT_TRUE(p.isOk()) << p.status().toString();
  return p.isOk() ? p.value() : detail::CallPrediction{};
}

TEST(PredictCall, AllreduceIsWhatAGroupWouldPlan) {
  const LinkProfile p = slowLinks();
  for (const char* codec : {"", "int8"}) {
    CallArgs a = allreduce(64 << 20);
    if (*codec != 0) {
      a.codec = codec::findCodec(codec).value();
      a.codecParams.blockSize = static_cast<uint32_t>(Config().compressionBlock);
    }
    const Plan plan = planned(a, &p);
    const detail::CallPrediction got = predicted("allreduce", 16 << 20, codec);
    EXPECT_EQ(got.algorithm, plan.row->name);
    EXPECT_EQ(got.codec, *codec != 0 ? codec : "none");
    EXPECT_DOUBLE_EQ(got.seconds, plan.predictedSeconds);
  }
  // int8 puts about a quarter of the float32 bytes on the wire.
  const double ratio = predicted("allreduce", 16 << 20, "int8").wireRatio;
  EXPECT_GT(ratio, 0.25);
  EXPECT_LT(ratio, 0.3);
  EXPECT_DOUBLE_EQ(predicted("allreduce", 16 << 20).wireRatio, 1.0);
}

TEST(PredictCall, AllgatherAndBroadcastUseTheRulesRowAndGrowWithSize) {
  for (const char* op : {"allgather", "broadcast"}) {
    double last = 0;
    for (size_t count = 1 << 10; count <= (size_t{1} << 26); count *= 16) {
      const detail::CallPrediction p = predicted(op, count);
      ASSERT_TRUE(std::isfinite(p.seconds)) << op << " " << count;
      EXPECT_GT(p.seconds, last) << op << " " << count;
      last = p.seconds;
    }
    // Large ones on two nodes of two: the hierarchical row, as the rules pick it.
    EXPECT_EQ(predicted(op, 1 << 24).algorithm, "hierarchical") << op;
  }
  // 64 MB gathered over 2 nodes: each node's 32 MB cross at 118 MB/s (two shards at once).
  const double t = predicted("allgather", 16 << 20).seconds;
  EXPECT_GT(t, 0.2);
  EXPECT_LT(t, 0.6);
}

TEST(PredictCall, ThePlannerStillLeavesAllgatherToItsRules) {
  const LinkProfile p = slowLinks();
  CallArgs g;
  g.op = OpType::kAllgather;
  g.dtype = DataType::kFloat32;
  g.counts = {1 << 20, 1 << 20, 1 << 20, 1 << 20};
  g.count = 1 << 20;
  const Plan plan = planned(g, &p);
  EXPECT_FALSE(std::isfinite(plan.predictedSeconds));  // the planner does not price it
  EXPECT_TRUE(std::isfinite(
      detail::predictMovementSeconds(*plan.row, g, k2x2, p, Config().chunkBytes)));
}

TEST(PredictCall, SendsPayTheirLinkClass) {
  const double inter = predicted("send_inter", 1 << 20).seconds;
  const double intra = predicted("send_intra", 1 << 20).seconds;
  // 4 MB: 35 ms at 117 MB/s across nodes, 1 ms at 4000 MB/s within.
  EXPECT_NEAR(inter, 60e-6 + 4.0 * (1 << 20) / 117e6, 1e-6);
  EXPECT_LT(intra, inter / 10);
  // Two ranks of a node crossing at once share its 118 MB/s.
  EXPECT_GT(predicted("send_inter", 1 << 20, "", 2).seconds, 1.8 * inter);
}

TEST(PredictCall, BadArgumentsAreErrors) {
  const LinkProfile p = slowLinks();
  const auto call = [&](const std::string& op, const std::string& codec) {
    return detail::predictCall(op, 1024, DataType::kFloat32, codec, 1, k2x2, Config(), p);
  };
  const Status unknownOp = call("alltoallv", "").status();
  EXPECT_EQ(unknownOp.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(unknownOp.message().find("unknown op 'alltoallv'"), std::string::npos);
  EXPECT_EQ(call("allreduce", "int3").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(call("allgather", "int8").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(call("send_inter", "int8").status().code(), StatusCode::kInvalidArgument);
  // One node: no inter-node link in the profile is needed, and none is priced.
  LinkProfile oneNode = p;
  oneNode.inter = LinkClassProfile{};
  Result<detail::CallPrediction> local = detail::predictCall(
      "allreduce", 1 << 20, DataType::kFloat32, "int8", 1, Topology::singleNode(2), Config(),
      oneNode);
  ASSERT_TRUE(local.isOk()) << local.status().toString();
  EXPECT_EQ(local.value().codec, "none");
  EXPECT_TRUE(std::isfinite(local.value().seconds));
  EXPECT_FALSE(std::isfinite(
      detail::predictCall("send_inter", 1024, DataType::kFloat32, "", 1, k2x2, Config(), oneNode)
          .value()
          .seconds));
}

}  // namespace
}  // namespace nanoccl
