// Compressed collectives on emulated topologies (ranks as threads with node ids): every rank
// ends with the same bits, the error stays within what the codec allows, error feedback keeps
// the long-run sum, only what crosses nodes shrinks, and calls that must stay lossless do.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "tests/collectives/test_util.h"

namespace nanoccl::colltest {
namespace {

using Comms = std::vector<std::shared_ptr<Communicator>>;

std::vector<std::string> nodeIdsOf(const std::string& letters) {
  std::vector<std::string> ids;
  for (char c : letters) ids.push_back(std::string("emulated-node-") + c);
  return ids;
}

int nodesOf(const std::string& letters) {
  std::string s = letters;
  std::sort(s.begin(), s.end());
  return static_cast<int>(std::unique(s.begin(), s.end()) - s.begin());
}

WorldOptions compressedWorld(const std::string& letters, const std::string& codec,
                             const std::string& algo = "auto", int timeoutMs = 20000) {
  WorldOptions o;
  o.size = static_cast<int>(letters.size());
  o.nodeIds = nodeIdsOf(letters);
  o.algo = algo;
  o.compression = codec;
  o.compressionMinBytes = 0;
  o.timeout = std::chrono::milliseconds(timeoutMs);
  return o;
}

// Rank r's input: smooth, signed, |x| <= 1, different on every rank.
std::vector<float> inputOf(int r, size_t count) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) {
    v[i] = static_cast<float>(std::sin(0.001 * static_cast<double>(i) * (r + 1) + r) *
                              (0.5 + 0.5 * std::cos(0.0137 * static_cast<double>(i))));
  }
  return v;
}

// Half the codec's resolution at a magnitude of 1: the largest error one encoding of values
// up to 1 may make (codec.h), with a little room for the float rounding terms.
double unitError(const std::string& codec) {
  if (codec == "fp16") return std::ldexp(1.0, -11);
  if (codec == "bf16") return std::ldexp(1.0, -8);
  if (codec == "int8") return 1.0 / 254;
  if (codec == "int4") return 1.0 / 14;
  return 0;
}

// Each rank's input is encoded at most once (as part of its node's partial sum, |sum| <= the
// node's ranks) and the total once more (|total| <= n): the error is at most 2n units.
double errorBound(const std::string& codec, int n) { return 2.0 * n * unitError(codec) * 1.05; }

uint64_t callsOf(const CommStats& st, const std::string& key) {
  for (const auto& [k, n] : st.callsPerAlgorithm) {
    if (k == key) return n;
  }
  return 0;
}

struct CompressedCase {
  std::string shape;  // one letter per rank, naming its node
  std::string codec;
  size_t count = 100003;  // not a multiple of any block
  ReduceOp op = ReduceOp::kSum;
};

void PrintTo(const CompressedCase& c, std::ostream* os) {
  *os << c.shape << " " << c.codec << " x" << c.count << " " << reduceOpName(c.op);
}

std::string caseName(const ::testing::TestParamInfo<CompressedCase>& info) {
  const CompressedCase& c = info.param;
  return c.shape + "_" + c.codec + "_c" + std::to_string(c.count) + "_" + reduceOpName(c.op);
}

class CompressedAllreduce : public ::testing::TestWithParam<CompressedCase> {};

TEST_P(CompressedAllreduce, SameBitsEverywhereWithinTheCodecsError) {
  const CompressedCase& c = GetParam();
  Comms comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(compressedWorld(c.shape, c.codec), comms);
  const int n = static_cast<int>(comms.size());
  std::vector<std::vector<float>> bufs;
  std::vector<double> exact(c.count, 0.0);
  for (int r = 0; r < n; ++r) {
    bufs.push_back(inputOf(r, c.count));
    for (size_t i = 0; i < c.count; ++i) exact[i] += bufs[r][i];
  }
  std::vector<std::shared_ptr<Task>> tasks;
  for (int r = 0; r < n; ++r) {
    tasks.push_back(comms[r]->allreduce(bufs[r].data(), c.count, DataType::kFloat32, c.op));
  }
  expectAllOk(tasks);
  for (int r = 1; r < n; ++r) {
    ASSERT_EQ(std::memcmp(bufs[r].data(), bufs[0].data(), c.count * sizeof(float)), 0)
        << "rank " << r << " differs from rank 0";
  }
  const double scale = c.op == ReduceOp::kAvg ? 1.0 / n : 1.0;
  double worst = 0;
  for (size_t i = 0; i < c.count; ++i) {
    worst = std::max(worst, std::abs(bufs[0][i] - exact[i] * scale));
  }
  EXPECT_LE(worst, errorBound(c.codec, n) * scale);
  EXPECT_GT(worst, 0.0) << "lossless: was the codec applied?";

  // The planner chose a lossy row, and only the inter-node bytes shrank: per node at most the
  // lossless optimum 2(m-1)/m x size times the codec's ratio (plus headers and scales).
  const bool hierarchical = Topology::fromNodeIds(nodeIdsOf(c.shape)).hierarchical();
  const double ratio = c.codec == "fp16" || c.codec == "bf16" ? 0.5
                       : c.codec == "int8"                    ? 0.26
                                                              : 0.15;
  const int m = nodesOf(c.shape);
  uint64_t inter = 0;
  for (int r = 0; r < n; ++r) {
    const CommStats st = comms[r]->stats();
    EXPECT_EQ(callsOf(st, hierarchical ? "allreduce/hierarchical" : "allreduce/compressed"), 1u)
        << "rank " << r;
    inter += st.interNodeBytesSent;
  }
  const double ideal = 2.0 * (m - 1) / m * c.count * sizeof(float) * m;  // all nodes
  EXPECT_LE(static_cast<double>(inter), ideal * ratio * 1.02) << "inter-node bytes " << inter;
  EXPECT_GE(static_cast<double>(inter), ideal * ratio * 0.8) << "inter-node bytes " << inter;
}

std::vector<CompressedCase> allreduceCases() {
  std::vector<CompressedCase> out;
  for (const char* shape : {"aabb", "abc", "aab", "abab", "aaabbb", "aabbcc"}) {
    for (const char* codec : {"fp16", "bf16", "int8", "int4"}) {
      out.push_back({shape, codec});
    }
  }
  out.push_back({"aabb", "int8", 100003, ReduceOp::kAvg});
  out.push_back({"abc", "int4", 100003, ReduceOp::kAvg});
  out.push_back({"aabb", "int8", 3000017});  // the pipelined hierarchical allreduce (12 MB)
  out.push_back({"ab", "bf16", 3000017});    // several chunks per segment
  return out;
}

INSTANTIATE_TEST_SUITE_P(Shapes, CompressedAllreduce, ::testing::ValuesIn(allreduceCases()),
                         caseName);

// Error feedback: the same gradient every step. Without it, round-to-nearest makes the same
// error every step, so the sum of the results drifts away linearly; with it, what one step
// loses the next one adds back, so the drift stays within about one step's error.
TEST(CompressedErrorFeedback, KeepsTheLongRunSum) {
  Comms comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(compressedWorld("aabb", "none"), comms);
  const int n = 4;
  constexpr size_t kCount = 20011;
  constexpr int kSteps = 20;
  std::vector<double> exact(kCount, 0.0);
  for (int r = 0; r < n; ++r) {
    const std::vector<float> in = inputOf(r, kCount);
    for (size_t i = 0; i < kCount; ++i) exact[i] += in[i];
  }
  auto drift = [&](bool feedback) {
    std::vector<std::vector<float>> residual(n, std::vector<float>(kCount, 0.0f));
    std::vector<double> total(kCount, 0.0);
    for (int step = 0; step < kSteps; ++step) {
      std::vector<std::vector<float>> bufs;
      std::vector<std::shared_ptr<Task>> tasks;
      for (int r = 0; r < n; ++r) bufs.push_back(inputOf(r, kCount));
      for (int r = 0; r < n; ++r) {
        CompressionRequest req;
        req.codec = "int4";
        req.residual = feedback ? residual[r].data() : nullptr;
        tasks.push_back(comms[r]->allreduceCompressed(bufs[r].data(), kCount, DataType::kFloat32,
                                                      ReduceOp::kSum, req));
      }
      expectAllOk(tasks);
      for (size_t i = 0; i < kCount; ++i) total[i] += bufs[0][i];
    }
    double worst = 0;
    for (size_t i = 0; i < kCount; ++i) {
      worst = std::max(worst, std::abs(total[i] - kSteps * exact[i]));
    }
    return worst;
  };
  const double with = drift(true);
  const double without = drift(false);
  EXPECT_LE(with, 2 * errorBound("int4", n)) << "with feedback";
  EXPECT_GT(without, 4 * with) << "without feedback " << without << ", with " << with;
}

class CompressedReduceScatter : public ::testing::TestWithParam<std::string> {};

TEST_P(CompressedReduceScatter, EachRankGetsItsSumWithinTheCodecsError) {
  Comms comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(compressedWorld(GetParam(), "int8"), comms);
  const int n = static_cast<int>(comms.size());
  std::vector<size_t> counts(n);
  for (int r = 0; r < n; ++r) counts[r] = 30011 + 977 * static_cast<size_t>(r);
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  std::vector<std::vector<float>> in, out(n);
  std::vector<double> exact(total, 0.0);
  for (int r = 0; r < n; ++r) {
    in.push_back(inputOf(r, total));
    for (size_t i = 0; i < total; ++i) exact[i] += in[r][i];
    out[r].assign(counts[r], 0.0f);
  }
  std::vector<std::shared_ptr<Task>> tasks;
  for (int r = 0; r < n; ++r) {
    tasks.push_back(comms[r]->reduceScatter(in[r].data(), out[r].data(), counts,
                                            DataType::kFloat32, ReduceOp::kSum));
  }
  expectAllOk(tasks);
  size_t at = 0;
  double worst = 0;
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < counts[r]; ++i) {
      worst = std::max(worst, std::abs(out[r][i] - exact[at + i]));
    }
    at += counts[r];
  }
  EXPECT_LE(worst, errorBound("int8", n));
  EXPECT_GT(worst, 0.0);
  const bool hierarchical = Topology::fromNodeIds(nodeIdsOf(GetParam())).hierarchical();
  EXPECT_EQ(callsOf(comms[0]->stats(),
                    hierarchical ? "reduce_scatter/hierarchical" : "reduce_scatter/compressed"),
            1u);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CompressedReduceScatter,
                         ::testing::Values("aabb", "abc", "aab", "abbab"));

// float16 / bfloat16 under int8: what crosses nodes is widened to float32, encoded and
// accumulated in float32, and rounded back. Every rank ends with the same bits; the error is
// the float32 call's plus the roundings to the input type (inside the node and at the end); the inter-node bytes are int8's (one byte per element, from float32),
// not the lossless half-precision call's two; sum, avg and premul_sum (what FSDP2 sends).
struct HalfCase {
  std::string shape;
  DataType dtype;
  ReduceOp op;
  bool reduceScatter = false;
};

std::string halfCaseName(const ::testing::TestParamInfo<HalfCase>& info) {
  const HalfCase& c = info.param;
  return c.shape + "_" + dataTypeName(c.dtype) + "_" + reduceOpName(c.op) +
         (c.reduceScatter ? "_reduce_scatter" : "_allreduce");
}

class CompressedHalf : public ::testing::TestWithParam<HalfCase> {};

TEST_P(CompressedHalf, SameBitsEverywhereWithinTheCodecsErrorPlusOneRounding) {
  const HalfCase& c = GetParam();
  Comms comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(compressedWorld(c.shape, "int8"), comms);
  const int n = static_cast<int>(comms.size());
  const bool bf16 = c.dtype == DataType::kBFloat16;
  auto toHalf = [&](float f) { return bf16 ? floatToBFloat16(f) : floatToHalf(f); };
  auto toFloat = [&](uint16_t h) { return bf16 ? bfloat16ToFloat(h) : halfToFloat(h); };
  const double factor = c.op == ReduceOp::kPremulSum ? 0.375 : 1.0;
  const double scale = c.op == ReduceOp::kAvg ? 1.0 / n : factor;
  std::vector<size_t> counts(n);
  for (int r = 0; r < n; ++r) counts[r] = c.reduceScatter ? 20011 + 331 * r : 0;
  const size_t total = c.reduceScatter ? std::accumulate(counts.begin(), counts.end(), size_t{0})
                                       : size_t{100003};
  std::vector<std::vector<uint16_t>> in(n), out(n);
  std::vector<double> exact(total, 0.0);
  for (int r = 0; r < n; ++r) {
    const std::vector<float> v = inputOf(r, total);
    for (float f : v) in[r].push_back(toHalf(f));
    for (size_t i = 0; i < total; ++i) exact[i] += toFloat(in[r][i]) * scale;
    out[r] = c.reduceScatter ? std::vector<uint16_t>(counts[r]) : in[r];
  }
  std::vector<std::shared_ptr<Task>> tasks;
  for (int r = 0; r < n; ++r) {
    tasks.push_back(c.reduceScatter ? comms[r]->reduceScatter(in[r].data(), out[r].data(),
                                                              counts, c.dtype, c.op, factor)
                                    : comms[r]->allreduce(out[r].data(), total, c.dtype, c.op,
                                                          factor));
  }
  expectAllOk(tasks);
  // One rounding to the input type: half an ulp, 2^-9 (bfloat16) or 2^-12 (float16) relative.
  const double rounding = bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
  double worst = 0;
  size_t at = 0;
  for (int r = 0; r < n; ++r) {
    if (!c.reduceScatter && r > 0) {
      ASSERT_EQ(out[r], out[0]) << "rank " << r << " differs from rank 0";
      continue;
    }
    for (size_t i = 0; i < out[r].size(); ++i) {
      const double want = exact[at + i];
      const double err = std::abs(toFloat(out[r][i]) - want);
      worst = std::max(worst, err);
      // The codec's bound, the final rounding, and per input up to two roundings on the way
      // (premul_sum's scaling, the node's partial sum), each at most half an ulp of 1.
      ASSERT_LE(err, (errorBound("int8", n) + n * rounding) * std::abs(scale) +
                         std::abs(want) * rounding)
          << "rank " << r << " element " << i;
    }
    at += out[r].size();
  }
  EXPECT_GT(worst, 0.0);
  // The int8 codec carried the inter-node leg: about a quarter of float32's bytes, well under
  // the lossless half-precision call's half.
  uint64_t inter = 0;
  for (int r = 0; r < n; ++r) inter += comms[r]->stats().interNodeBytesSent;
  const int m = nodesOf(c.shape);
  const double f32Ideal = (c.reduceScatter ? 1.0 : 2.0) * (m - 1) / m * total * sizeof(float) * m;
  EXPECT_LE(static_cast<double>(inter), f32Ideal * 0.26 * 1.02) << "inter-node bytes " << inter;
  EXPECT_GT(inter, 0u);
}

std::vector<HalfCase> halfCases() {
  std::vector<HalfCase> out;
  for (const char* shape : {"aabb", "abc", "aab"}) {
    for (DataType t : {DataType::kBFloat16, DataType::kFloat16}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kPremulSum}) {
        out.push_back({shape, t, op, false});
      }
      out.push_back({shape, t, ReduceOp::kSum, true});
    }
  }
  out.push_back({"aabb", DataType::kBFloat16, ReduceOp::kAvg, true});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Shapes, CompressedHalf, ::testing::ValuesIn(halfCases()), halfCaseName);

// Calls that must stay lossless under NANOCCL_COMPRESSION: integer-valued inputs whose sums
// are exact in float32, so any encoding would show.
TEST(CompressedLossless, IntegersMinMaxSmallMessagesAndForcedFlatRows) {
  auto run = [](const WorldOptions& o, DataType t, ReduceOp op, size_t count) {
    Comms comms;
    EXPECT_TRUE(makeWorld(o, &comms).isOk());
    const int n = static_cast<int>(comms.size());
    std::vector<std::vector<char>> bufs;
    std::vector<std::shared_ptr<Task>> tasks;
    for (int r = 0; r < n; ++r) {
      bufs.push_back(makeBuffer(t, count, [&](size_t i) { return Value(r + i % 5, 0); }));
    }
    for (int r = 0; r < n; ++r) {
      tasks.push_back(comms[r]->allreduce(bufs[r].data(), count, t, op));
    }
    expectAllOk(tasks);
    for (size_t i = 0; i < count; i += 97) {
      const double want =
          op == ReduceOp::kSum ? n * (n - 1) / 2.0 + n * static_cast<double>(i % 5)
                               : (op == ReduceOp::kMax ? n - 1 : 0) + static_cast<double>(i % 5);
      ASSERT_EQ(readValue(t, bufs[0].data(), i).real(), want) << "element " << i;
    }
  };
  WorldOptions o = compressedWorld("aabb", "int4");
  run(o, DataType::kInt32, ReduceOp::kSum, 50000);
  run(o, DataType::kFloat32, ReduceOp::kMax, 50000);
  run(o, DataType::kFloat32, ReduceOp::kMin, 50000);
  o.compressionMinBytes = 1 << 20;
  run(o, DataType::kFloat32, ReduceOp::kSum, 50000);  // 200 KB < 1 MB
  o.compressionMinBytes = 0;
  o.algo = "ring";  // a forced lossless row
  run(o, DataType::kFloat32, ReduceOp::kSum, 50000);
  run(compressedWorld("aaaa", "int4"), DataType::kFloat32, ReduceOp::kSum, 50000);  // one node
}

// allreduceCompressed on calls it cannot compress: an argument error for that call only, and
// lossless (residual untouched) where there is no inter-node leg.
TEST(CompressedExplicit, ArgumentErrorsAndOneNode) {
  Comms comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(compressedWorld("ab", "none"), comms);
  std::vector<std::vector<int32_t>> ints(2, std::vector<int32_t>(100, 1));
  CompressionRequest req;
  for (int r = 0; r < 2; ++r) {
    const Status s = comms[r]
                         ->allreduceCompressed(ints[r].data(), 100, DataType::kInt32,
                                               ReduceOp::kSum, req)
                         ->wait(Deadline::after(std::chrono::seconds(10)));
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.toString();
    EXPECT_NE(s.message().find("float32"), std::string::npos) << s.toString();
  }
  req.codec = "int9";
  const Status bad = comms[0]
                         ->allreduceCompressed(ints[0].data(), 1, DataType::kFloat32,
                                               ReduceOp::kSum, req)
                         ->wait(Deadline::after(std::chrono::seconds(10)));
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument) << bad.toString();
  EXPECT_NE(bad.message().find("int8"), std::string::npos) << bad.toString();  // lists them
  // Still usable: nothing was sent.
  std::vector<std::shared_ptr<Task>> tasks;
  for (int r = 0; r < 2; ++r) {
    tasks.push_back(comms[r]->allreduce(ints[r].data(), 100, DataType::kInt32, ReduceOp::kSum));
  }
  expectAllOk(tasks);
  EXPECT_EQ(ints[0][99], 2);

  Comms one;
  NANOCCL_MAKE_WORLD_OR_SKIP(compressedWorld("aa", "none"), one);
  std::vector<std::vector<float>> bufs(2, std::vector<float>(1000, 3.0f));
  std::vector<std::vector<float>> residual(2, std::vector<float>(1000, 0.0f));
  tasks.clear();
  for (int r = 0; r < 2; ++r) {
    CompressionRequest q;
    q.codec = "int4";
    q.residual = residual[r].data();
    tasks.push_back(
        one[r]->allreduceCompressed(bufs[r].data(), 1000, DataType::kFloat32, ReduceOp::kSum, q));
  }
  expectAllOk(tasks);
  EXPECT_EQ(bufs[1][999], 6.0f);
  EXPECT_EQ(residual[1][999], 0.0f);
}

// reduceScatterCompressed on a lossless communicator (FSDP2's per-unit calls, below any
// min_bytes): compressed whatever the size and the config, within int8's error; an integer
// type is an argument error for that call only.
TEST(CompressedExplicit, ReduceScatterAtAnySize) {
  Comms comms;
  WorldOptions o = compressedWorld("aabb", "none");
  o.compressionMinBytes = 1 << 20;
  NANOCCL_MAKE_WORLD_OR_SKIP(o, comms);
  const int n = static_cast<int>(comms.size());
  const std::vector<size_t> counts(n, 1001);  // 4 KB a part
  const size_t total = 1001 * static_cast<size_t>(n);
  std::vector<std::vector<float>> in, out(n, std::vector<float>(1001, 0.0f));
  std::vector<double> exact(total, 0.0);
  for (int r = 0; r < n; ++r) {
    in.push_back(inputOf(r, total));
    for (size_t i = 0; i < total; ++i) exact[i] += in[r][i];
  }
  CompressionRequest req;  // int8
  std::vector<std::shared_ptr<Task>> tasks;
  for (int r = 0; r < n; ++r) {
    tasks.push_back(comms[r]->reduceScatterCompressed(in[r].data(), out[r].data(), counts,
                                                      DataType::kFloat32, ReduceOp::kSum, req));
  }
  expectAllOk(tasks);
  double worst = 0;
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < 1001; ++i) {
      worst = std::max(worst, std::abs(out[r][i] - exact[1001 * static_cast<size_t>(r) + i]));
    }
  }
  EXPECT_LE(worst, errorBound("int8", n));
  EXPECT_GT(worst, 0.0) << "lossless: was the codec applied?";

  std::vector<std::vector<int32_t>> ints(n, std::vector<int32_t>(total, 1));
  std::vector<std::vector<int32_t>> intOut(n, std::vector<int32_t>(1001, 0));
  for (int r = 0; r < n; ++r) {
    const Status t = comms[r]
                         ->reduceScatterCompressed(ints[r].data(), intOut[r].data(), counts,
                                                   DataType::kInt32, ReduceOp::kSum, req)
                         ->wait(Deadline::after(std::chrono::seconds(10)));
    EXPECT_EQ(t.code(), StatusCode::kInvalidArgument) << t.toString();
    EXPECT_NE(t.message().find("compressed reduce_scatter takes float32"), std::string::npos)
        << t.toString();
  }
  // Still usable: nothing was sent.
  tasks.clear();
  for (int r = 0; r < n; ++r) {
    tasks.push_back(comms[r]->reduceScatter(ints[r].data(), intOut[r].data(), counts,
                                            DataType::kInt32, ReduceOp::kSum));
  }
  expectAllOk(tasks);
  EXPECT_EQ(intOut[3][1000], 4);
}

// Error feedback on reduceScatterCompressed, as KeepsTheLongRunSum above: each rank's outputs
// summed over steps stay within about one step's error of the exact sums with a residual, and
// drift away without; on the hierarchical row (the residual follows its staged layout) and on
// the flat one.
class CompressedReduceScatterFeedback : public ::testing::TestWithParam<std::string> {};

TEST_P(CompressedReduceScatterFeedback, KeepsTheLongRunSum) {
  Comms comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(compressedWorld(GetParam(), "none"), comms);
  const int n = static_cast<int>(comms.size());
  constexpr size_t kPart = 5003;
  constexpr int kSteps = 20;
  const size_t total = kPart * static_cast<size_t>(n);
  const std::vector<size_t> counts(n, kPart);
  std::vector<double> exact(total, 0.0);
  for (int r = 0; r < n; ++r) {
    const std::vector<float> in = inputOf(r, total);
    for (size_t i = 0; i < total; ++i) exact[i] += in[i];
  }
  auto drift = [&](bool feedback) {
    std::vector<std::vector<float>> residual(n, std::vector<float>(total, 0.0f));
    std::vector<double> sums(total, 0.0);
    for (int step = 0; step < kSteps; ++step) {
      std::vector<std::vector<float>> in, out(n, std::vector<float>(kPart));
      std::vector<std::shared_ptr<Task>> tasks;
      for (int r = 0; r < n; ++r) in.push_back(inputOf(r, total));
      for (int r = 0; r < n; ++r) {
        CompressionRequest req;
        req.codec = "int4";
        req.residual = feedback ? residual[r].data() : nullptr;
        tasks.push_back(comms[r]->reduceScatterCompressed(in[r].data(), out[r].data(), counts,
                                                          DataType::kFloat32, ReduceOp::kSum,
                                                          req));
      }
      expectAllOk(tasks);
      for (int r = 0; r < n; ++r) {
        for (size_t i = 0; i < kPart; ++i) sums[r * kPart + i] += out[r][i];
      }
    }
    double worst = 0;
    for (size_t i = 0; i < total; ++i) {
      worst = std::max(worst, std::abs(sums[i] - kSteps * exact[i]));
    }
    return worst;
  };
  const double with = drift(true);
  const double without = drift(false);
  EXPECT_LE(with, 2 * errorBound("int4", n)) << "with feedback";
  EXPECT_GT(without, 4 * with) << "without feedback " << without << ", with " << with;
}

INSTANTIATE_TEST_SUITE_P(Shapes, CompressedReduceScatterFeedback,
                         ::testing::Values("aabb", "abc", "aab"));

// Ranks that disagree about compression meet a mismatch naming the codec, on every rank.
TEST(CompressedMismatch, OneRankLosslessOrAnotherCodec) {
  for (const char* other : {"none", "int4"}) {
    SCOPED_TRACE(other);
    Comms comms;
    NANOCCL_MAKE_WORLD_OR_SKIP(compressedWorld("aabb", "none", "auto", 5000), comms);
    std::vector<std::vector<float>> bufs(4, std::vector<float>(40000, 1.0f));
    std::vector<std::shared_ptr<Task>> tasks;
    for (int r = 0; r < 4; ++r) {
      CompressionRequest req;
      req.codec = r == 3 ? other : "int8";
      tasks.push_back(comms[r]->allreduceCompressed(bufs[r].data(), 40000, DataType::kFloat32,
                                                    ReduceOp::kSum, req));
    }
    const std::vector<Status> st = waitAll(tasks, std::chrono::seconds(40));
    bool named = false;
    for (int r = 0; r < 4; ++r) {
      EXPECT_FALSE(st[r].isOk()) << "rank " << r;
      EXPECT_EQ(st[r].message().find("caller's deadline"), std::string::npos) << "rank " << r;
      named = named || (st[r].code() == StatusCode::kMismatch &&
                        st[r].message().find("int8 across nodes") != std::string::npos);
    }
    EXPECT_TRUE(named) << st[0].toString() << "\n" << st[3].toString();
  }
}

}  // namespace
}  // namespace nanoccl::colltest
