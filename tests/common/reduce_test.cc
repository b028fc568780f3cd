// The reduction kernels against a reference computed here, and every vector variant against the
// scalar one, bit for bit (reduce_internal.h gives the per-ISA tables; the choice reduceInto()
// makes is fixed at the first call, so the variants are not reached through the environment).
#include "common/reduce.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <complex>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "common/reduce_internal.h"

namespace nanoccl {
namespace {

using reduce_internal::Isa;

constexpr size_t kLengths[] = {0, 1, 7, 31, 1000, 65537};
constexpr size_t kCanary = 64;  // bytes after the end that no kernel may touch

std::vector<DataType> allTypes() {
  std::vector<DataType> v;
  for (int i = 0; i < static_cast<int>(DataType::kNumTypes); ++i) {
    v.push_back(static_cast<DataType>(i));
  }
  return v;
}

std::vector<ReduceOp> allOps() {
  std::vector<ReduceOp> v;
  for (int i = 0; i < static_cast<int>(ReduceOp::kNumOps); ++i) {
    v.push_back(static_cast<ReduceOp>(i));
  }
  return v;
}

// ---- Inputs ---------------------------------------------------------------------------------

template <typename F>
F randomFloat(std::mt19937_64& rng) {
  // One in eight is a special value; the rest spread over many binades, both signs.
  static const F kSpecials[] = {F(0),
                                -F(0),
                                std::numeric_limits<F>::infinity(),
                                -std::numeric_limits<F>::infinity(),
                                std::numeric_limits<F>::quiet_NaN(),
                                -std::numeric_limits<F>::quiet_NaN(),
                                std::numeric_limits<F>::signaling_NaN(),
                                std::numeric_limits<F>::denorm_min(),
                                -std::numeric_limits<F>::min(),
                                std::numeric_limits<F>::max(),
                                F(1),
                                F(-1)};
  if (rng() % 8 == 0) return kSpecials[rng() % std::size(kSpecials)];
  std::uniform_real_distribution<F> mant(F(-1), F(1));
  return std::ldexp(mant(rng), static_cast<int>(rng() % 40) - 20);
}

// Fills n elements of type t; `specials` adds NaN, infinities, zeros of both signs, subnormals.
std::vector<uint8_t> randomBuffer(DataType t, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> buf(n * dataTypeSize(t) + kCanary);
  for (size_t i = n * dataTypeSize(t); i < buf.size(); ++i) buf[i] = 0xa5;
  uint8_t* p = buf.data();
  for (size_t i = 0; i < n; ++i) {
    switch (t) {
      case DataType::kFloat32: {
        const float f = randomFloat<float>(rng);
        std::memcpy(p + 4 * i, &f, 4);
        break;
      }
      case DataType::kFloat64: {
        const double d = randomFloat<double>(rng);
        std::memcpy(p + 8 * i, &d, 8);
        break;
      }
      case DataType::kComplex64: {
        const float f[2] = {randomFloat<float>(rng), randomFloat<float>(rng)};
        std::memcpy(p + 8 * i, f, 8);
        break;
      }
      case DataType::kComplex128: {
        const double d[2] = {randomFloat<double>(rng), randomFloat<double>(rng)};
        std::memcpy(p + 16 * i, d, 16);
        break;
      }
      case DataType::kBool:
        p[i] = rng() % 2;
        break;
      default: {
        // Integers, float16 and bfloat16: any bit pattern (for the 16-bit floats that includes
        // NaN, infinities and subnormals).
        const uint64_t r = rng();
        std::memcpy(p + dataTypeSize(t) * i, &r, dataTypeSize(t));
      }
    }
  }
  return buf;
}

// ---- The reference --------------------------------------------------------------------------

template <typename F>
F refMax(F a, F b) {
  if (std::isnan(a)) return a;
  if (std::isnan(b)) return b;
  if (a != b) return a > b ? a : b;
  return std::signbit(a) ? b : a;  // +0 over -0
}

template <typename F>
F refMin(F a, F b) {
  if (std::isnan(a)) return a;
  if (std::isnan(b)) return b;
  if (a != b) return a < b ? a : b;
  return std::signbit(a) ? a : b;  // -0 under +0
}

template <typename F>
F refFloat(ReduceOp op, F a, F b) {
  switch (op) {
    case ReduceOp::kProduct: return a * b;
    case ReduceOp::kMin: return refMin(a, b);
    case ReduceOp::kMax: return refMax(a, b);
    default: return a + b;  // sum, avg, premul_sum
  }
}

template <typename T>
T refInt(ReduceOp op, T a, T b) {
  using U = std::make_unsigned_t<T>;
  const uint64_t x = static_cast<U>(a), y = static_cast<U>(b);
  switch (op) {
    case ReduceOp::kProduct: return static_cast<T>(static_cast<U>(x * y));
    case ReduceOp::kMin: return std::min(a, b);
    case ReduceOp::kMax: return std::max(a, b);
    case ReduceOp::kBand: return static_cast<T>(a & b);
    case ReduceOp::kBor: return static_cast<T>(a | b);
    case ReduceOp::kBxor: return static_cast<T>(a ^ b);
    default: return static_cast<T>(static_cast<U>(x + y));
  }
}

uint8_t refBool(ReduceOp op, uint8_t a, uint8_t b) {
  const bool x = a != 0, y = b != 0;
  switch (op) {
    case ReduceOp::kProduct:
    case ReduceOp::kMin:
    case ReduceOp::kBand: return x && y;
    case ReduceOp::kBxor: return x != y;
    default: return x || y;  // sum, max, bor, avg, premul_sum
  }
}

template <typename T>
void refLoop(void* out, const void* a, const void* b, size_t n, T (*f)(ReduceOp, T, T),
             ReduceOp op) {
  for (size_t i = 0; i < n; ++i) {
    T x, y;
    std::memcpy(&x, static_cast<const T*>(a) + i, sizeof(T));
    std::memcpy(&y, static_cast<const T*>(b) + i, sizeof(T));
    const T r = f(op, x, y);
    std::memcpy(static_cast<T*>(out) + i, &r, sizeof(T));
  }
}

uint16_t refHalf(ReduceOp op, uint16_t a, uint16_t b) {
  return floatToHalf(refFloat(op, halfToFloat(a), halfToFloat(b)));
}
uint16_t refBf16(ReduceOp op, uint16_t a, uint16_t b) {
  return floatToBFloat16(refFloat(op, bfloat16ToFloat(a), bfloat16ToFloat(b)));
}

template <typename F>
void refComplex(void* out, const void* a, const void* b, size_t n, ReduceOp op) {
  for (size_t i = 0; i < n; ++i) {
    F x[2], y[2], r[2];
    std::memcpy(x, static_cast<const char*>(a) + 2 * sizeof(F) * i, sizeof(x));
    std::memcpy(y, static_cast<const char*>(b) + 2 * sizeof(F) * i, sizeof(y));
    if (op == ReduceOp::kProduct) {
      r[0] = x[0] * y[0] - x[1] * y[1];
      r[1] = x[0] * y[1] + x[1] * y[0];
    } else {
      r[0] = x[0] + y[0];
      r[1] = x[1] + y[1];
    }
    std::memcpy(static_cast<char*>(out) + 2 * sizeof(F) * i, r, sizeof(r));
  }
}

void reference(void* out, const void* a, const void* b, size_t n, DataType t, ReduceOp op) {
  switch (t) {
    case DataType::kFloat32: return refLoop<float>(out, a, b, n, refFloat<float>, op);
    case DataType::kFloat64: return refLoop<double>(out, a, b, n, refFloat<double>, op);
    case DataType::kFloat16: return refLoop<uint16_t>(out, a, b, n, refHalf, op);
    case DataType::kBFloat16: return refLoop<uint16_t>(out, a, b, n, refBf16, op);
    case DataType::kInt8: return refLoop<int8_t>(out, a, b, n, refInt<int8_t>, op);
    case DataType::kUInt8: return refLoop<uint8_t>(out, a, b, n, refInt<uint8_t>, op);
    case DataType::kInt16: return refLoop<int16_t>(out, a, b, n, refInt<int16_t>, op);
    case DataType::kInt32: return refLoop<int32_t>(out, a, b, n, refInt<int32_t>, op);
    case DataType::kInt64: return refLoop<int64_t>(out, a, b, n, refInt<int64_t>, op);
    case DataType::kBool: return refLoop<uint8_t>(out, a, b, n, refBool, op);
    case DataType::kComplex64: return refComplex<float>(out, a, b, n, op);
    case DataType::kComplex128: return refComplex<double>(out, a, b, n, op);
    default: FAIL() << "unknown dtype";
  }
}

// Equal bits, except that any NaN matches any NaN: the reference may pick another NaN payload
// than the kernels where both operands are NaN. (Variants are compared on exact bits.)
bool sameElement(DataType t, const uint8_t* x, const uint8_t* y) {
  if (std::memcmp(x, y, dataTypeSize(t)) == 0) return true;
  auto bothNan = [](auto u, auto v) { return std::isnan(u) && std::isnan(v); };
  switch (t) {
    case DataType::kFloat32:
    case DataType::kComplex64: {
      for (size_t k = 0; k < dataTypeSize(t) / 4; ++k) {
        float u, v;
        std::memcpy(&u, x + 4 * k, 4);
        std::memcpy(&v, y + 4 * k, 4);
        if (std::memcmp(&u, &v, 4) != 0 && !bothNan(u, v)) return false;
      }
      return true;
    }
    case DataType::kFloat64:
    case DataType::kComplex128: {
      for (size_t k = 0; k < dataTypeSize(t) / 8; ++k) {
        double u, v;
        std::memcpy(&u, x + 8 * k, 8);
        std::memcpy(&v, y + 8 * k, 8);
        if (std::memcmp(&u, &v, 8) != 0 && !bothNan(u, v)) return false;
      }
      return true;
    }
    case DataType::kFloat16:
    case DataType::kBFloat16: {
      uint16_t u, v;
      std::memcpy(&u, x, 2);
      std::memcpy(&v, y, 2);
      return t == DataType::kFloat16 ? bothNan(halfToFloat(u), halfToFloat(v))
                                     : bothNan(bfloat16ToFloat(u), bfloat16ToFloat(v));
    }
    default:
      return false;
  }
}

std::string hexElement(DataType t, const uint8_t* p) {
  static const char* kHex = "0123456789abcdef";
  std::string s = "0x";
  for (size_t k = dataTypeSize(t); k-- > 0;) {
    s += kHex[p[k] >> 4];
    s += kHex[p[k] & 15];
  }
  return s;
}

// Compares n elements; reports the first few differences with their inputs.
::testing::AssertionResult sameBuffers(DataType t, size_t n, const std::vector<uint8_t>& got,
                                       const std::vector<uint8_t>& want,
                                       const std::vector<uint8_t>& a,
                                       const std::vector<uint8_t>& b, bool exactBits) {
  const size_t sz = dataTypeSize(t);
  int reported = 0;
  size_t bad = 0;
  std::string msg;
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* g = got.data() + i * sz;
    const uint8_t* w = want.data() + i * sz;
    const bool same = exactBits ? std::memcmp(g, w, sz) == 0 : sameElement(t, g, w);
    if (!same) {
      ++bad;
      if (reported++ < 5) {
        msg += "\n  [" + std::to_string(i) + "] a=" + hexElement(t, a.data() + i * sz) +
               " b=" + hexElement(t, b.data() + i * sz) + " got=" + hexElement(t, g) +
               " want=" + hexElement(t, w);
      }
    }
  }
  for (size_t i = n * sz; i < got.size() && i < n * sz + kCanary; ++i) {
    if (got[i] != 0xa5) {
      return ::testing::AssertionFailure() << "wrote past the end at byte " << i - n * sz;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << n << " elements differ:" << msg;
}

// ---- Kernels against the reference, through the public API ----------------------------------

struct TypeOp {
  DataType type;
  ReduceOp op;
};

std::vector<TypeOp> supportedPairs() {
  std::vector<TypeOp> v;
  for (DataType t : allTypes()) {
    for (ReduceOp op : allOps()) {
      if (reduceOpSupported(op, t)) v.push_back({t, op});
    }
  }
  return v;
}

std::string pairName(const ::testing::TestParamInfo<TypeOp>& info) {
  return std::string(dataTypeName(info.param.type)) + "_" + reduceOpName(info.param.op);
}

class ReduceTest : public ::testing::TestWithParam<TypeOp> {};

TEST_P(ReduceTest, MatchesReferenceForEveryLength) {
  const auto [t, op] = GetParam();
  const size_t sz = dataTypeSize(t);
  for (const size_t n : kLengths) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const auto a = randomBuffer(t, n, 17 * n + 1);
    const auto b = randomBuffer(t, n, 31 * n + 2);
    std::vector<uint8_t> want(a.size(), 0xa5);
    reference(want.data(), a.data(), b.data(), n, t, op);

    // out separate from both inputs.
    std::vector<uint8_t> out(a.size(), 0xa5);
    ASSERT_TRUE(reduceTo(out.data(), a.data(), b.data(), n, t, op).isOk());
    EXPECT_TRUE(sameBuffers(t, n, out, want, a, b, false)) << "reduceTo, separate output";

    // In place: dst is the first operand (what the collectives do).
    std::vector<uint8_t> dst = a;
    ASSERT_TRUE(reduceInto(dst.data(), b.data(), n, t, op).isOk());
    EXPECT_TRUE(sameBuffers(t, n, dst, want, a, b, false)) << "reduceInto";

    // out aliasing the second operand.
    std::vector<uint8_t> second = b;
    ASSERT_TRUE(reduceTo(second.data(), a.data(), second.data(), n, t, op).isOk());
    EXPECT_TRUE(sameBuffers(t, n, second, want, a, b, false)) << "reduceTo, out == b";

    // Buffers that start one element past a vector boundary.
    if (n > 1) {
      std::vector<uint8_t> shifted(a.size() + sz, 0xa5);
      ASSERT_TRUE(reduceTo(shifted.data() + sz, a.data() + sz, b.data() + sz, n - 1, t, op)
                      .isOk());
      std::vector<uint8_t> gotShifted(shifted.begin() + sz, shifted.end());
      std::vector<uint8_t> wantShifted(want.begin() + sz, want.end());
      wantShifted.resize(gotShifted.size(), 0xa5);
      for (size_t i = (n - 1) * sz; i < wantShifted.size(); ++i) wantShifted[i] = 0xa5;
      std::vector<uint8_t> as(a.begin() + sz, a.end()), bs(b.begin() + sz, b.end());
      EXPECT_TRUE(sameBuffers(t, n - 1, gotShifted, wantShifted, as, bs, false)) << "unaligned";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypesAndOps, ReduceTest, ::testing::ValuesIn(supportedPairs()),
                         pairName);

TEST(ReduceApiTest, UnsupportedOpIsRejectedAndTouchesNothing) {
  for (DataType t : allTypes()) {
    for (ReduceOp op : allOps()) {
      if (reduceOpSupported(op, t)) continue;
      auto dst = randomBuffer(t, 8, 1);
      const auto before = dst;
      const auto src = randomBuffer(t, 8, 2);
      const Status s = reduceInto(dst.data(), src.data(), 8, t, op);
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << dataTypeName(t) << " " << reduceOpName(op);
      EXPECT_NE(s.message().find(dataTypeName(t)), std::string::npos) << s.message();
      EXPECT_EQ(dst, before);
    }
  }
}

TEST(ReduceApiTest, BadArguments) {
  float x[4] = {1, 2, 3, 4};
  EXPECT_TRUE(reduceInto(nullptr, nullptr, 0, DataType::kFloat32, ReduceOp::kSum).isOk());
  EXPECT_EQ(reduceInto(nullptr, x, 4, DataType::kFloat32, ReduceOp::kSum).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(reduceTo(x, x, nullptr, 4, DataType::kFloat32, ReduceOp::kSum).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(reduceInto(x, x, 4, static_cast<DataType>(42), ReduceOp::kSum).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(reduceInto(x, x, 4, DataType::kFloat32, static_cast<ReduceOp>(42)).code(),
            StatusCode::kInvalidArgument);
}

TEST(ReduceApiTest, BoolResultsAreZeroOrOne) {
  // Any non-zero byte is true; results are canonical 0/1.
  const uint8_t a[8] = {0, 2, 0, 255, 1, 0x80, 3, 0};
  const uint8_t b[8] = {0, 0, 7, 255, 1, 0x80, 0, 1};
  const struct {
    ReduceOp op;
    uint8_t want[8];
  } cases[] = {
      {ReduceOp::kSum, {0, 1, 1, 1, 1, 1, 1, 1}},  {ReduceOp::kMax, {0, 1, 1, 1, 1, 1, 1, 1}},
      {ReduceOp::kBor, {0, 1, 1, 1, 1, 1, 1, 1}},  {ReduceOp::kProduct, {0, 0, 0, 1, 1, 1, 0, 0}},
      {ReduceOp::kMin, {0, 0, 0, 1, 1, 1, 0, 0}},  {ReduceOp::kBand, {0, 0, 0, 1, 1, 1, 0, 0}},
      {ReduceOp::kBxor, {0, 1, 1, 0, 0, 0, 1, 1}},
  };
  for (const auto& c : cases) {
    for (size_t i = 0; i < static_cast<size_t>(Isa::kNumIsas); ++i) {
      const auto isa = static_cast<Isa>(i);
      if (!reduce_internal::cpuSupports(isa)) continue;
      uint8_t out[8];
      ASSERT_TRUE(
          reduce_internal::reduceWith(isa, out, a, b, 8, DataType::kBool, c.op).isOk());
      for (int k = 0; k < 8; ++k) {
        EXPECT_EQ(out[k], c.want[k]) << reduceOpName(c.op) << " [" << k << "] on "
                                     << reduce_internal::isaName(isa);
      }
    }
  }
}

TEST(ReduceApiTest, FloatMinMaxNanAndSignedZero) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float a[4] = {nan, 1.0f, 0.0f, -0.0f};
  const float b[4] = {1.0f, nan, -0.0f, 0.0f};
  float mx[4], mn[4];
  ASSERT_TRUE(reduceTo(mx, a, b, 4, DataType::kFloat32, ReduceOp::kMax).isOk());
  ASSERT_TRUE(reduceTo(mn, a, b, 4, DataType::kFloat32, ReduceOp::kMin).isOk());
  EXPECT_TRUE(std::isnan(mx[0]) && std::isnan(mx[1]));
  EXPECT_TRUE(std::isnan(mn[0]) && std::isnan(mn[1]));
  EXPECT_FALSE(std::signbit(mx[2]));
  EXPECT_FALSE(std::signbit(mx[3]));
  EXPECT_TRUE(std::signbit(mn[2]));
  EXPECT_TRUE(std::signbit(mn[3]));
}

TEST(ReduceApiTest, ActiveIsaIsOneTheCpuRuns) {
  const std::string isa = reduceIsa();
  EXPECT_TRUE(isa == "scalar" || isa == "avx2" || isa == "avx512") << isa;
  EXPECT_TRUE(reduce_internal::cpuSupports(reduce_internal::activeIsa()));
  EXPECT_STREQ(reduce_internal::isaName(reduce_internal::activeIsa()), reduceIsa());
  EXPECT_TRUE(reduce_internal::cpuSupports(Isa::kScalar));
}

// NANOCCL_REDUCE_ISA is read once per process: each case runs in a fresh one ("threadsafe"
// death tests re-execute the binary).
void expectIsaFromEnv(const char* value, const std::string& want) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  setenv("NANOCCL_REDUCE_ISA", value, 1);
  EXPECT_EXIT(std::exit(std::string(reduceIsa()) == want ? 0 : 1), ::testing::ExitedWithCode(0),
              "")
      << "NANOCCL_REDUCE_ISA=" << value << " should give " << want;
  unsetenv("NANOCCL_REDUCE_ISA");
}

std::string bestIsa() {
  for (size_t i = static_cast<size_t>(Isa::kNumIsas); i-- > 0;) {
    if (reduce_internal::cpuSupports(static_cast<Isa>(i))) {
      return reduce_internal::isaName(static_cast<Isa>(i));
    }
  }
  return "scalar";
}

TEST(ReduceIsaDeathTest, EnvironmentLowersTheChoice) {
  expectIsaFromEnv("scalar", "scalar");
  expectIsaFromEnv("SCALAR", "scalar");
  if (reduce_internal::cpuSupports(Isa::kAvx2)) expectIsaFromEnv("avx2", "avx2");
}

TEST(ReduceIsaDeathTest, EnvironmentCannotRaiseItOrBreakIt) {
  expectIsaFromEnv("avx512", reduce_internal::cpuSupports(Isa::kAvx512) ? "avx512" : bestIsa());
  expectIsaFromEnv("sse9", bestIsa());
}

// ---- Every vector variant against the scalar one, bit for bit --------------------------------

struct IsaTypeOp {
  Isa isa;
  DataType type;
  ReduceOp op;
};

std::vector<IsaTypeOp> vectorCases() {
  std::vector<IsaTypeOp> v;
  for (size_t i = 1; i < static_cast<size_t>(Isa::kNumIsas); ++i) {
    if (!reduce_internal::isaCompiled(static_cast<Isa>(i))) continue;
    for (const TypeOp& p : supportedPairs()) v.push_back({static_cast<Isa>(i), p.type, p.op});
  }
  return v;
}

std::string isaCaseName(const ::testing::TestParamInfo<IsaTypeOp>& info) {
  return std::string(reduce_internal::isaName(info.param.isa)) + "_" +
         dataTypeName(info.param.type) + "_" + reduceOpName(info.param.op);
}

class ReduceIsaTest : public ::testing::TestWithParam<IsaTypeOp> {
 protected:
  void SetUp() override {
    if (!reduce_internal::cpuSupports(GetParam().isa)) {
      GTEST_SKIP() << "this CPU cannot run " << reduce_internal::isaName(GetParam().isa);
    }
  }
};

TEST_P(ReduceIsaTest, BitIdenticalToScalar) {
  const auto [isa, t, op] = GetParam();
  for (const size_t n : kLengths) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const auto a = randomBuffer(t, n, 7 * n + 3);
    const auto b = randomBuffer(t, n, 11 * n + 4);
    std::vector<uint8_t> want(a.size(), 0xa5), got(a.size(), 0xa5);
    ASSERT_TRUE(
        reduce_internal::reduceWith(Isa::kScalar, want.data(), a.data(), b.data(), n, t, op)
            .isOk());
    ASSERT_TRUE(reduce_internal::reduceWith(isa, got.data(), a.data(), b.data(), n, t, op).isOk());
    EXPECT_TRUE(sameBuffers(t, n, got, want, a, b, true));

    std::vector<uint8_t> inPlace = a;
    ASSERT_TRUE(
        reduce_internal::reduceWith(isa, inPlace.data(), inPlace.data(), b.data(), n, t, op)
            .isOk());
    EXPECT_TRUE(sameBuffers(t, n, inPlace, want, a, b, true)) << "in place";
  }
}

INSTANTIATE_TEST_SUITE_P(AllVariants, ReduceIsaTest, ::testing::ValuesIn(vectorCases()),
                         isaCaseName);

// Every float16 / bfloat16 value as the first operand, against operands that exercise
// rounding, overflow, subnormals, signed zeros and NaN: the F16C and integer-rounding paths
// must agree with floatToHalf()/floatToBFloat16() everywhere.
TEST(ReduceIsaExhaustiveTest, EveryHalfAndBFloat16Value) {
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  const uint16_t halfOperands[] = {0x0000, 0x8000, 0x3c00, 0xbc00, 0x3800, 0x7bff, 0xfbff,
                                   0x0001, 0x8001, 0x03ff, 0x0400, 0x7c00, 0xfc00, 0x7e00,
                                   0xfd01, 0x3555, 0x4248, 0x1400};
  const uint16_t bf16Operands[] = {0x0000, 0x8000, 0x3f80, 0xbf80, 0x3f00, 0x7f7f, 0xff7f,
                                   0x0001, 0x8001, 0x007f, 0x0080, 0x7f80, 0xff80, 0x7fc0,
                                   0xff81, 0x3eab, 0x4049, 0x1f00};
  int compared = 0;
  for (size_t i = 1; i < static_cast<size_t>(Isa::kNumIsas); ++i) {
    const auto isa = static_cast<Isa>(i);
    if (!reduce_internal::cpuSupports(isa)) continue;
    for (const DataType t : {DataType::kFloat16, DataType::kBFloat16}) {
      const auto& operands = t == DataType::kFloat16 ? halfOperands : bf16Operands;
      for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin,
                                ReduceOp::kMax}) {
        for (const uint16_t operand : operands) {
          const std::vector<uint16_t> b(65536, operand);
          std::vector<uint16_t> want(65536), got(65536);
          ASSERT_TRUE(reduce_internal::reduceWith(Isa::kScalar, want.data(), all.data(),
                                                  b.data(), 65536, t, op)
                          .isOk());
          ASSERT_TRUE(
              reduce_internal::reduceWith(isa, got.data(), all.data(), b.data(), 65536, t, op)
                  .isOk());
          for (uint32_t k = 0; k < 65536; ++k) {
            ASSERT_EQ(got[k], want[k])
                << reduce_internal::isaName(isa) << " " << dataTypeName(t) << " "
                << reduceOpName(op) << " a=0x" << std::hex << k << " b=0x" << operand;
          }
          ++compared;
        }
      }
    }
  }
  if (compared == 0) GTEST_SKIP() << "no vector variant runs on this CPU";
}

// Conversions: every float16/bfloat16 value widens exactly (to what halfToFloat() and
// bfloat16ToFloat() give; float16 NaNs come out quiet, as F16C makes them), and floats that exercise rounding ties, overflow, subnormals, signed
// zeros and NaN payloads narrow to what floatToHalf()/floatToBFloat16() give; in every variant
// the CPU runs and at every length (the vector tails).
TEST(ConvertTest, EveryVariantMatchesTheScalarConversions) {
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> floats;
  for (uint32_t bits : {0x00000000u, 0x80000000u, 0x3f800000u, 0x3f808000u, 0x3f818000u,
                        0x3f7fffffu, 0x477fe000u, 0x477ff000u, 0x7f7fffffu, 0xff7fffffu,
                        0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u, 0x7f800001u,
                        0x00000001u, 0x33800000u, 0x387fc000u, 0x38800000u, 0xb3000001u}) {
    float f;
    std::memcpy(&f, &bits, sizeof f);
    floats.push_back(f);
  }
  for (int i = 0; i < 4000; ++i) floats.push_back(std::ldexp(std::sin(0.37 * i), (i % 61) - 30));
  int compared = 0;
  for (size_t i = 0; i < static_cast<size_t>(Isa::kNumIsas); ++i) {
    const auto isa = static_cast<Isa>(i);
    if (!reduce_internal::cpuSupports(isa)) continue;
    for (const DataType t : {DataType::kFloat16, DataType::kBFloat16}) {
      const bool half = t == DataType::kFloat16;
      std::vector<float> wide(all.size());
      ASSERT_TRUE(reduce_internal::widenWith(isa, wide.data(), all.data(), all.size(), t).isOk());
      for (uint32_t k = 0; k < 65536; ++k) {
        float want = half ? halfToFloat(all[k]) : bfloat16ToFloat(all[k]);
        if (half && want != want) {
          uint32_t bits;
          std::memcpy(&bits, &want, sizeof bits);
          bits |= 0x00400000u;
          std::memcpy(&want, &bits, sizeof want);
        }
        ASSERT_EQ(std::memcmp(&wide[k], &want, sizeof want), 0)
            << reduce_internal::isaName(isa) << " widen " << dataTypeName(t) << " 0x"
            << std::hex << k;
      }
      for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{17}, size_t{33}, floats.size()}) {
        std::vector<uint16_t> narrow(n + 1, 0xabcd);
        ASSERT_TRUE(reduce_internal::narrowWith(isa, narrow.data(), floats.data(), n, t).isOk());
        for (size_t k = 0; k < n; ++k) {
          ASSERT_EQ(narrow[k], half ? floatToHalf(floats[k]) : floatToBFloat16(floats[k]))
              << reduce_internal::isaName(isa) << " narrow " << dataTypeName(t) << " #" << k;
        }
        EXPECT_EQ(narrow[n], 0xabcd) << "wrote past the end";
      }
      ++compared;
    }
  }
  EXPECT_GE(compared, 2);
  float f = 0;
  EXPECT_EQ(widenToFloat32(&f, &f, 1, DataType::kFloat32).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(narrowFromFloat32(nullptr, &f, 1, DataType::kBFloat16).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(narrowFromFloat32(nullptr, nullptr, 0, DataType::kBFloat16).isOk());
}

// ---- kAvg / kPremulSum scaling --------------------------------------------------------------

// v holds the elements' parts (two per complex element).
template <typename T>
std::vector<T> scaled(std::vector<T> v, DataType t, double factor) {
  EXPECT_TRUE(scaleInPlace(v.data(), v.size() * sizeof(T) / dataTypeSize(t), t, factor).isOk());
  return v;
}
template <typename T>
std::vector<T> divided(std::vector<T> v, DataType t, int64_t divisor) {
  EXPECT_TRUE(divideInPlace(v.data(), v.size() * sizeof(T) / dataTypeSize(t), t, divisor).isOk());
  return v;
}

TEST(ScaleTest, FloatsInTheirOwnPrecision) {
  EXPECT_EQ(scaled<float>({1.0f, -3.0f, 0.1f}, DataType::kFloat32, 0.25),
            (std::vector<float>{0.25f, -0.75f, 0.1f * 0.25f}));
  EXPECT_EQ(scaled<double>({1.0, 0.1}, DataType::kFloat64, 1.0 / 3),
            (std::vector<double>{1.0 / 3, 0.1 * (1.0 / 3)}));
  const std::vector<uint16_t> h = {floatToHalf(3.0f), floatToHalf(-1.5f)};
  EXPECT_EQ(scaled<uint16_t>(h, DataType::kFloat16, 0.5),
            (std::vector<uint16_t>{floatToHalf(1.5f), floatToHalf(-0.75f)}));
  const std::vector<uint16_t> bf = {floatToBFloat16(3.0f), floatToBFloat16(1.0f)};
  EXPECT_EQ(scaled<uint16_t>(bf, DataType::kBFloat16, 0.1),
            (std::vector<uint16_t>{floatToBFloat16(3.0f * 0.1f), floatToBFloat16(0.1f)}));
  // complex: both parts
  EXPECT_EQ(scaled<float>({2.0f, -4.0f}, DataType::kComplex64, 0.5),
            (std::vector<float>{1.0f, -2.0f}));
  EXPECT_EQ(scaled<double>({2.0, -4.0, 1.0, 8.0}, DataType::kComplex128, 0.25),
            (std::vector<double>{0.5, -1.0, 0.25, 2.0}));
}

TEST(ScaleTest, IntegersTruncateTowardZeroAndSaturate) {
  EXPECT_EQ(scaled<int32_t>({7, -7, 10, -1}, DataType::kInt32, 0.5),
            (std::vector<int32_t>{3, -3, 5, 0}));
  EXPECT_EQ(scaled<int8_t>({100, -100, 3}, DataType::kInt8, 3.0),
            (std::vector<int8_t>{127, -128, 9}));
  EXPECT_EQ(scaled<uint8_t>({200, 10}, DataType::kUInt8, -1.0), (std::vector<uint8_t>{0, 0}));
  EXPECT_EQ(scaled<uint8_t>({200, 10}, DataType::kUInt8, 2.0), (std::vector<uint8_t>{255, 20}));
  EXPECT_EQ(scaled<int16_t>({-32768, 1000}, DataType::kInt16, -1.0),
            (std::vector<int16_t>{32767, -1000}));
  EXPECT_EQ(scaled<int64_t>({std::numeric_limits<int64_t>::max(), 6}, DataType::kInt64, 2.0),
            (std::vector<int64_t>{std::numeric_limits<int64_t>::max(), 12}));
  EXPECT_EQ(scaled<uint8_t>({1, 0, 1}, DataType::kBool, 0.5), (std::vector<uint8_t>{0, 0, 0}));
  EXPECT_EQ(scaled<uint8_t>({1, 0, 1}, DataType::kBool, 2.0), (std::vector<uint8_t>{1, 0, 1}));
}

TEST(ScaleTest, DivideLikeNccl) {
  EXPECT_EQ(divided<float>({1.0f, -3.0f}, DataType::kFloat32, 3),
            (std::vector<float>{1.0f / 3.0f, -1.0f}));
  EXPECT_EQ(divided<double>({1.0}, DataType::kFloat64, 3), (std::vector<double>{1.0 / 3.0}));
  EXPECT_EQ(divided<int32_t>({7, -7, 1}, DataType::kInt32, 2), (std::vector<int32_t>{3, -3, 0}));
  EXPECT_EQ(divided<uint8_t>({255, 4}, DataType::kUInt8, 2), (std::vector<uint8_t>{127, 2}));
  EXPECT_EQ(divided<int8_t>({-128, 127}, DataType::kInt8, 1), (std::vector<int8_t>{-128, 127}));
  EXPECT_EQ(divided<int64_t>({std::numeric_limits<int64_t>::min()}, DataType::kInt64, 4),
            (std::vector<int64_t>{std::numeric_limits<int64_t>::min() / 4}));
  const std::vector<uint16_t> h = {floatToHalf(1.0f), floatToHalf(-6.0f)};
  EXPECT_EQ(divided<uint16_t>(h, DataType::kFloat16, 3),
            (std::vector<uint16_t>{floatToHalf(1.0f / 3.0f), floatToHalf(-2.0f)}));
  const std::vector<uint16_t> bf = {floatToBFloat16(1.0f)};
  EXPECT_EQ(divided<uint16_t>(bf, DataType::kBFloat16, 3),
            (std::vector<uint16_t>{floatToBFloat16(1.0f / 3.0f)}));
  EXPECT_EQ(divided<float>({3.0f, -6.0f}, DataType::kComplex64, 3),
            (std::vector<float>{1.0f, -2.0f}));
  EXPECT_EQ(divided<uint8_t>({1, 0}, DataType::kBool, 1), (std::vector<uint8_t>{1, 0}));
}

TEST(ScaleTest, BadArguments) {
  float x[2] = {1, 2};
  EXPECT_EQ(divideInPlace(x, 2, DataType::kFloat32, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(divideInPlace(x, 2, DataType::kFloat32, -2).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(divideInPlace(nullptr, 2, DataType::kFloat32, 2).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(scaleInPlace(nullptr, 2, DataType::kFloat32, 2).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(scaleInPlace(nullptr, 0, DataType::kFloat32, 2).isOk());
  EXPECT_EQ(scaleInPlace(x, 2, static_cast<DataType>(99), 2).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(x[0], 1.0f);
}

}  // namespace
}  // namespace nanoccl
