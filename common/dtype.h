// Element types and reductions: the vocabulary every layer shares.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace nanoccl {

// The order is part of the wire format (frame headers carry the value): append only.
enum class DataType : uint8_t {
  kFloat32 = 0,
  kFloat64,
  kFloat16,
  kBFloat16,
  kInt8,
  kUInt8,
  kInt16,
  kInt32,
  kInt64,
  kBool,
  kComplex64,
  kComplex128,
  kNumTypes,
};

size_t dataTypeSize(DataType t);
const char* dataTypeName(DataType t);  // "float32", "bfloat16", ...
bool isFloatingPoint(DataType t);      // float32/64, float16, bfloat16
bool isComplex(DataType t);

// The order is part of the wire format: append only.
enum class ReduceOp : uint8_t {
  kSum = 0,
  kProduct,
  kMin,
  kMax,
  kAvg,        // sum, then divide by the number of ranks (integer division for integers)
  kBand,
  kBor,
  kBxor,
  kPremulSum,  // each rank's input is multiplied by a factor before the sum
  kNumOps,
};

const char* reduceOpName(ReduceOp op);  // "sum", "avg", ...

// Whether `op` is defined on `t`: bitwise ops need integers or bool, MIN/MAX no complex.
bool reduceOpSupported(ReduceOp op, DataType t);

// IEEE half and bfloat16 conversions (round to nearest even, NaN preserved).
inline float halfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

inline uint16_t floatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) {  // inf or NaN
    return static_cast<uint16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0));
  }
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (absx < 0x38800000u) {  // result is subnormal or zero
    if (absx < 0x33000000u) return static_cast<uint16_t>(sign);
    const uint32_t e = absx >> 23;
    const uint32_t m = (absx & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14..24
    uint32_t h = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t h = ((absx >> 13) - ((127 - 15) << 10));
  const uint32_t rem = absx & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

inline float bfloat16ToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

inline uint16_t floatToBFloat16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN
  const uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

}  // namespace nanoccl
