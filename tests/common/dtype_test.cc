#include "common/dtype.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/op.h"

namespace nanoccl {
namespace {

// ---- The type and op tables -----------------------------------------------------------------

// The enum values travel in frame headers: changing one breaks the wire format.
static_assert(static_cast<int>(DataType::kFloat32) == 0);
static_assert(static_cast<int>(DataType::kFloat64) == 1);
static_assert(static_cast<int>(DataType::kFloat16) == 2);
static_assert(static_cast<int>(DataType::kBFloat16) == 3);
static_assert(static_cast<int>(DataType::kInt8) == 4);
static_assert(static_cast<int>(DataType::kUInt8) == 5);
static_assert(static_cast<int>(DataType::kInt16) == 6);
static_assert(static_cast<int>(DataType::kInt32) == 7);
static_assert(static_cast<int>(DataType::kInt64) == 8);
static_assert(static_cast<int>(DataType::kBool) == 9);
static_assert(static_cast<int>(DataType::kComplex64) == 10);
static_assert(static_cast<int>(DataType::kComplex128) == 11);
static_assert(static_cast<int>(DataType::kNumTypes) == 12);
static_assert(static_cast<int>(ReduceOp::kSum) == 0);
static_assert(static_cast<int>(ReduceOp::kPremulSum) == 8);
static_assert(static_cast<int>(ReduceOp::kNumOps) == 9);

struct TypeRow {
  DataType type;
  const char* name;
  size_t size;
  bool floating;
  bool complex;
  bool integral;  // integer or bool: the bitwise ops apply
};

const TypeRow kTypes[] = {
    {DataType::kFloat32, "float32", 4, true, false, false},
    {DataType::kFloat64, "float64", 8, true, false, false},
    {DataType::kFloat16, "float16", 2, true, false, false},
    {DataType::kBFloat16, "bfloat16", 2, true, false, false},
    {DataType::kInt8, "int8", 1, false, false, true},
    {DataType::kUInt8, "uint8", 1, false, false, true},
    {DataType::kInt16, "int16", 2, false, false, true},
    {DataType::kInt32, "int32", 4, false, false, true},
    {DataType::kInt64, "int64", 8, false, false, true},
    {DataType::kBool, "bool", 1, false, false, true},
    {DataType::kComplex64, "complex64", 8, false, true, false},
    {DataType::kComplex128, "complex128", 16, false, true, false},
};

TEST(DataTypeTest, TableMatchesTheContract) {
  ASSERT_EQ(std::size(kTypes), static_cast<size_t>(DataType::kNumTypes));
  for (const TypeRow& row : kTypes) {
    SCOPED_TRACE(row.name);
    EXPECT_EQ(dataTypeSize(row.type), row.size);
    EXPECT_STREQ(dataTypeName(row.type), row.name);
    EXPECT_EQ(isFloatingPoint(row.type), row.floating);
    EXPECT_EQ(isComplex(row.type), row.complex);
  }
}

TEST(DataTypeTest, InvalidValuesAreHarmless) {
  for (const auto raw : {12, 13, 200, 255}) {
    const auto t = static_cast<DataType>(raw);
    EXPECT_EQ(dataTypeSize(t), 0u);
    EXPECT_STREQ(dataTypeName(t), "invalid-dtype");
    EXPECT_FALSE(isFloatingPoint(t));
    EXPECT_FALSE(isComplex(t));
    EXPECT_FALSE(reduceOpSupported(ReduceOp::kSum, t));
  }
  EXPECT_STREQ(reduceOpName(static_cast<ReduceOp>(9)), "invalid-op");
  EXPECT_FALSE(reduceOpSupported(static_cast<ReduceOp>(9), DataType::kFloat32));
  EXPECT_FALSE(reduceOpSupported(static_cast<ReduceOp>(250), DataType::kInt32));
}

TEST(ReduceOpTest, Names) {
  const char* names[] = {"sum", "product", "min", "max", "avg", "band", "bor", "bxor",
                         "premul_sum"};
  for (int i = 0; i < static_cast<int>(ReduceOp::kNumOps); ++i) {
    EXPECT_STREQ(reduceOpName(static_cast<ReduceOp>(i)), names[i]);
  }
}

TEST(ReduceOpTest, SupportMatrix) {
  for (const TypeRow& row : kTypes) {
    for (int i = 0; i < static_cast<int>(ReduceOp::kNumOps); ++i) {
      const auto op = static_cast<ReduceOp>(i);
      bool expected = true;
      if (op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor) {
        expected = row.integral;
      } else if (op == ReduceOp::kMin || op == ReduceOp::kMax) {
        expected = !row.complex;
      }
      EXPECT_EQ(reduceOpSupported(op, row.type), expected) << row.name << " " << reduceOpName(op);
    }
  }
}

TEST(OpFingerprintTest, DescribeAndCompare) {
  OpFingerprint a;
  a.op = OpType::kAllreduce;
  a.dtype = DataType::kFloat32;
  a.redop = ReduceOp::kSum;
  a.count = 1024;
  a.seq = 7;
  EXPECT_EQ(a.describe(), "allreduce #7 (float32 x 1024, sum)");
  OpFingerprint b = a;
  EXPECT_EQ(a, b);
  b.count = 1023;
  EXPECT_NE(a, b);
  OpFingerprint c = a;
  c.codec = 3;  // int8: a call compressed on one rank and not on another is a mismatch
  EXPECT_NE(a, c);
  EXPECT_EQ(c.describe(), "allreduce #7 (float32 x 1024, sum, int8 across nodes)");

  OpFingerprint bc;
  bc.op = OpType::kBroadcast;
  bc.dtype = DataType::kInt64;
  bc.count = 8;
  bc.root = 1;
  bc.seq = 3;
  EXPECT_EQ(bc.describe(), "broadcast #3 (int64 x 8, root 1)");
  EXPECT_STREQ(opTypeName(OpType::kReduceScatter), "reduce_scatter");
  EXPECT_STREQ(opTypeName(static_cast<OpType>(200)), "invalid-op");
}

// ---- float16 --------------------------------------------------------------------------------

uint32_t bitsOf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  return x;
}
float floatOf(uint32_t x) {
  float f;
  std::memcpy(&f, &x, sizeof(f));
  return f;
}

bool halfIsNan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }
bool bf16IsNan(uint16_t b) { return (b & 0x7f80u) == 0x7f80u && (b & 0x7fu) != 0; }

// The value of a half from the IEEE 754 definition, in double. For 0x7c00 (infinity) this is
// 2^16: the value IEEE rounding treats as the next step above the largest finite half.
double halfValueRef(uint16_t h) {
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  const double mag = exp == 0 ? std::ldexp(mant, -24) : std::ldexp(1024 + mant, exp - 25);
  return (h & 0x8000) ? -mag : mag;
}

// float -> half, round to nearest even, computed without bit tricks: find the two
// representable neighbours and compare with their midpoint (exact in double).
uint16_t floatToHalfRef(float f) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  if (std::isnan(f)) return sign | 0x7e00;
  const double a = std::fabs(static_cast<double>(f));
  if (a >= 65536.0) return sign | 0x7c00;
  // Largest non-negative half pattern with value <= a (the finite patterns sort like values).
  uint16_t lo = 0, hiBound = 0x7c00;
  while (hiBound - lo > 1) {
    const uint16_t mid = static_cast<uint16_t>((lo + hiBound) / 2);
    if (halfValueRef(mid) <= a) {
      lo = mid;
    } else {
      hiBound = mid;
    }
  }
  if (halfValueRef(lo) == a) return sign | lo;
  const uint16_t hi = static_cast<uint16_t>(lo + 1);
  const double midpoint = (halfValueRef(lo) + halfValueRef(hi)) / 2;
  uint16_t r;
  if (a < midpoint) {
    r = lo;
  } else if (a > midpoint) {
    r = hi;
  } else {
    r = (lo & 1) ? hi : lo;
  }
  return sign | r;
}

TEST(HalfTest, DecodesEveryValueExactly) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = halfToFloat(static_cast<uint16_t>(h));
    if (halfIsNan(static_cast<uint16_t>(h))) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << h;
      EXPECT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << h;
      // The payload moves to the top of the float mantissa.
      EXPECT_EQ(bitsOf(f) & 0x7fffffu, (h & 0x3ffu) << 13) << std::hex << h;
    } else if ((h & 0x7fff) == 0x7c00) {
      EXPECT_TRUE(std::isinf(f)) << std::hex << h;
      EXPECT_EQ(std::signbit(f), (h & 0x8000) != 0);
    } else {
      ASSERT_EQ(static_cast<double>(f), halfValueRef(static_cast<uint16_t>(h))) << std::hex << h;
      EXPECT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << h;  // -0 stays -0
    }
  }
}

TEST(HalfTest, EveryValueRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t back = floatToHalf(halfToFloat(static_cast<uint16_t>(h)));
    if (halfIsNan(static_cast<uint16_t>(h))) {
      ASSERT_TRUE(halfIsNan(back)) << std::hex << h;
      EXPECT_EQ(back & 0x8000, h & 0x8000) << std::hex << h;
      EXPECT_TRUE(back & 0x200) << "NaN comes back quiet: " << std::hex << back;
    } else {
      ASSERT_EQ(back, h) << std::hex << h;
    }
  }
}

void expectHalfRounding(float f) {
  const uint16_t got = floatToHalf(f);
  const uint16_t want = floatToHalfRef(f);
  if (std::isnan(f)) {
    ASSERT_TRUE(halfIsNan(got)) << std::hex << bitsOf(f);
    ASSERT_EQ(got & 0x8000, want & 0x8000) << std::hex << bitsOf(f);
  } else {
    ASSERT_EQ(got, want) << "float bits 0x" << std::hex << bitsOf(f) << " (" << f << ")";
  }
}

TEST(HalfTest, RoundsMidpointsAndTheirNeighboursToNearestEven) {
  // Every pair of adjacent non-negative halves, including the last finite one and 2^16 (the
  // overflow threshold 65520 is their midpoint): the exact midpoint and one float ulp either
  // side, for both signs.
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    const double mid = (halfValueRef(static_cast<uint16_t>(h)) +
                        halfValueRef(static_cast<uint16_t>(h + 1))) / 2;
    const float m = static_cast<float>(mid);
    ASSERT_EQ(static_cast<double>(m), mid);  // halves have 11 bits: the midpoint fits a float
    for (const float f : {m, std::nextafter(m, 0.0f), std::nextafter(m, 1e30f)}) {
      expectHalfRounding(f);
      expectHalfRounding(-f);
    }
  }
}

TEST(HalfTest, RoundsRandomFloats) {
  std::mt19937 rng(1234);
  for (int i = 0; i < 1000000; ++i) {
    uint32_t x = rng();
    if (i % 2 == 0) {
      // Half of them with exponents around the half range, where the rounding happens.
      const uint32_t exp = 95 + rng() % 60;  // 2^-32 .. 2^27
      x = (x & 0x807fffffu) | (exp << 23);
    }
    expectHalfRounding(floatOf(x));
  }
}

TEST(HalfTest, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(floatToHalf(0.0f), 0x0000);
  EXPECT_EQ(floatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(floatToHalf(inf), 0x7c00);
  EXPECT_EQ(floatToHalf(-inf), 0xfc00);
  EXPECT_EQ(floatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(floatToHalf(-2.0f), 0xc000);
  // Overflow: 65504 is the largest half, 65520 the midpoint to 2^16 (ties to even = inf).
  EXPECT_EQ(floatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(floatToHalf(std::nextafter(65520.0f, 0.0f)), 0x7bff);
  EXPECT_EQ(floatToHalf(65520.0f), 0x7c00);
  EXPECT_EQ(floatToHalf(-65520.0f), 0xfc00);
  EXPECT_EQ(floatToHalf(1e10f), 0x7c00);
  EXPECT_EQ(floatToHalf(FLT_MAX), 0x7c00);
  EXPECT_EQ(floatToHalf(-FLT_MAX), 0xfc00);
  // Subnormal halves: 2^-24 is the smallest; 2^-25 is a tie with 0 (even); 3*2^-25 a tie
  // between 1 and 2 ulps (2 is even).
  EXPECT_EQ(floatToHalf(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(floatToHalf(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(floatToHalf(-std::ldexp(1.0f, -25)), 0x8000);
  EXPECT_EQ(floatToHalf(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(floatToHalf(3 * std::ldexp(1.0f, -25)), 0x0002);
  EXPECT_EQ(floatToHalf(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(floatToHalf(std::ldexp(1.0f, -14) - std::ldexp(1.0f, -25)), 0x0400);  // tie, even
  EXPECT_EQ(floatToHalf(std::ldexp(1023.0f, -24)), 0x03ff);  // largest subnormal
  EXPECT_EQ(floatToHalf(FLT_MIN), 0x0000);
  EXPECT_EQ(floatToHalf(floatOf(1)), 0x0000);  // smallest float subnormal
  // NaN: stays NaN (quiet), keeps its sign, also when the payload sits only in low bits that
  // a plain shift would drop.
  for (const uint32_t nan : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fa00000u}) {
    const uint16_t h = floatToHalf(floatOf(nan));
    EXPECT_TRUE(halfIsNan(h)) << std::hex << nan;
    EXPECT_TRUE(h & 0x200) << std::hex << nan;
    EXPECT_EQ((h & 0x8000) != 0, (nan & 0x80000000u) != 0) << std::hex << nan;
  }
}

// ---- bfloat16 -------------------------------------------------------------------------------

double bf16ValueRef(uint16_t b) {
  if ((b & 0x7fff) == 0x7f80) return (b & 0x8000) ? -std::ldexp(1.0, 128) : std::ldexp(1.0, 128);
  return static_cast<double>(floatOf(static_cast<uint32_t>(b) << 16));
}

uint16_t floatToBFloat16Ref(float f) {
  const uint32_t x = bitsOf(f);
  if (std::isnan(f)) return static_cast<uint16_t>((x >> 16) | 0x40);
  // Truncation gives the neighbour toward zero; the other one is the next pattern.
  const uint16_t lo = static_cast<uint16_t>(x >> 16);
  if ((x & 0xffff) == 0) return lo;
  const uint16_t hi = static_cast<uint16_t>(lo + 1);
  const double a = std::fabs(static_cast<double>(f));
  const double midpoint = (std::fabs(bf16ValueRef(lo)) + std::fabs(bf16ValueRef(hi))) / 2;
  if (a < midpoint) return lo;
  if (a > midpoint) return hi;
  return (lo & 1) ? hi : lo;
}

TEST(BFloat16Test, EveryValueRoundTrips) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const float f = bfloat16ToFloat(static_cast<uint16_t>(b));
    ASSERT_EQ(bitsOf(f), b << 16);  // widening is exact, NaN payload included
    const uint16_t back = floatToBFloat16(f);
    if (bf16IsNan(static_cast<uint16_t>(b))) {
      ASSERT_TRUE(bf16IsNan(back)) << std::hex << b;
      EXPECT_EQ(back & 0x8000, b & 0x8000);
      EXPECT_TRUE(back & 0x40) << "NaN comes back quiet";
    } else {
      ASSERT_EQ(back, b) << std::hex << b;
    }
  }
}

void expectBf16Rounding(float f) {
  const uint16_t got = floatToBFloat16(f);
  const uint16_t want = floatToBFloat16Ref(f);
  if (std::isnan(f)) {
    ASSERT_TRUE(bf16IsNan(got)) << std::hex << bitsOf(f);
    ASSERT_EQ(got & 0x8000, want & 0x8000);
  } else {
    ASSERT_EQ(got, want) << "float bits 0x" << std::hex << bitsOf(f);
  }
}

TEST(BFloat16Test, RoundsMidpointsAndRandomFloats) {
  for (uint32_t b = 0; b < 0x7f80; ++b) {
    const uint32_t mid = (b << 16) | 0x8000;
    for (const uint32_t x : {mid, mid - 1, mid + 1}) {
      expectBf16Rounding(floatOf(x));
      expectBf16Rounding(floatOf(x | 0x80000000u));
    }
  }
  std::mt19937 rng(99);
  for (int i = 0; i < 1000000; ++i) expectBf16Rounding(floatOf(rng()));
}

TEST(BFloat16Test, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(floatToBFloat16(0.0f), 0x0000);
  EXPECT_EQ(floatToBFloat16(-0.0f), 0x8000);
  EXPECT_EQ(floatToBFloat16(1.0f), 0x3f80);
  EXPECT_EQ(floatToBFloat16(inf), 0x7f80);
  EXPECT_EQ(floatToBFloat16(-inf), 0xff80);
  EXPECT_EQ(floatToBFloat16(FLT_MAX), 0x7f80);  // rounds up to infinity
  EXPECT_EQ(floatToBFloat16(floatOf(0x3f808000u)), 0x3f80);  // tie, even stays
  EXPECT_EQ(floatToBFloat16(floatOf(0x3f818000u)), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(floatToBFloat16(floatOf(0x00000001u)), 0x0000);  // subnormals round like normals
  EXPECT_EQ(floatToBFloat16(floatOf(0x00008000u)), 0x0000);
  EXPECT_EQ(floatToBFloat16(floatOf(0x00018000u)), 0x0002);
  for (const uint32_t nan : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff80ffffu}) {
    const uint16_t b = floatToBFloat16(floatOf(nan));
    EXPECT_TRUE(bf16IsNan(b)) << std::hex << nan;
    EXPECT_EQ((b & 0x8000) != 0, (nan & 0x80000000u) != 0);
  }
}

}  // namespace
}  // namespace nanoccl
