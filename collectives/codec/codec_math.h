// The codecs' arithmetic on one element: the definition the vector kernels (codec_simd.inc) must
// match bit for bit, compiled both into the scalar kernels (codec_scalar.cc) and into the CUDA
// kernels (codec_cuda.cu, as __host__ __device__), so the CPU and the GPU run one expression.
//
// Every function here is `static inline` (internal linkage, one copy per translation unit): an
// inline function with external linkage emitted by an AVX-512 file could be the copy the linker
// keeps for every caller (common/reduce_internal.h says more). Each operation is a single IEEE
// operation in float32; the files that include this are built with -ffp-contract=off (CPU) and
// -fmad=false (CUDA), so no multiply-add is fused.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define NANOCCL_CODEC_HD __host__ __device__
#else
#define NANOCCL_CODEC_HD
#endif

#if defined(__CUDA_ARCH__)
#define NANOCCL_CODEC_FLOOR(x) floorf(x)
#define NANOCCL_CODEC_RINT(x) rintf(x)
#else
#include <cmath>
#define NANOCCL_CODEC_FLOOR(x) std::floor(x)
// Nearest even for |x| <= 2^22 in the default environment, like cvtps2dq and the GPU's rintf:
// adding 1.5 * 2^23 leaves no fraction bits. Inline, where nearbyint() is a libm call without
// SSE4.1; -ffp-contract=off and no -ffast-math keep the compiler from folding it away.
#define NANOCCL_CODEC_RINT(x) (((x) + 0x1.8p23f) - 0x1.8p23f)
#endif

namespace nanoccl::codec::math {

// The one NaN the decoders write, and the scale of a block that held a NaN or an infinity.
constexpr uint32_t kCanonicalNan = 0x7fc00000u;
constexpr uint32_t kAbsMask = 0x7fffffffu;
constexpr uint32_t kInfBits = 0x7f800000u;

NANOCCL_CODEC_HD static inline uint32_t floatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
#endif
}

NANOCCL_CODEC_HD static inline float bitsFloat(uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float f;
  std::memcpy(&f, &b, sizeof(f));
  return f;
#endif
}

NANOCCL_CODEC_HD static inline bool isNan(float f) { return (floatBits(f) & kAbsMask) > kInfBits; }
NANOCCL_CODEC_HD static inline bool isFinite(float f) {
  return (floatBits(f) & kAbsMask) < kInfBits;
}

// ---- Random numbers of stochastic rounding -----------------------------------------------
// Counter-based: a 32-bit key per block from (seed, block index), then one integer hash per
// element of (key + position in the block). No state, so any ISA or GPU thread computes any
// element's number on its own.

NANOCCL_CODEC_HD static inline uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

NANOCCL_CODEC_HD static inline uint32_t blockKey(uint64_t seed, uint64_t block) {
  return static_cast<uint32_t>(splitmix64(seed ^ splitmix64(block)));
}

// "lowbias32" (C. Wellons): a bijection on 32 bits with good avalanche, two multiplies.
NANOCCL_CODEC_HD static inline uint32_t lowbias32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// Uniform on {0, 2^-24, ..., 1 - 2^-24}: 24 bits, so the conversion and the scaling are exact.
NANOCCL_CODEC_HD static inline float uniform(uint32_t key, uint32_t position) {
  return static_cast<float>(lowbias32(key + position) >> 8) * 0x1p-24f;
}

// ---- Blockwise quantization ----------------------------------------------------------------

// kMax: 127 (int8) or 7 (int4). amaxBits: the largest (bits & kAbsMask) of the block, so NaN and
// inf compare above every finite value without a float comparison.
// Near FLT_MAX, amax / kMax can round up far enough that kMax * scale overflows to inf: one ulp
// less keeps every decoded value finite (x = amax then clamps to kMax, an error of ~2^-23 x).
NANOCCL_CODEC_HD static inline float blockScale(uint32_t amaxBits, float kMax) {
  if (amaxBits >= kInfBits) return bitsFloat(kCanonicalNan);
  const float scale = bitsFloat(amaxBits) / kMax;
  return isFinite(scale * kMax) ? scale : bitsFloat(floatBits(scale) - 1);
}

// Whether a block with this scale has codes at all: scale 0 (all zero, or underflow) and NaN
// scales give all-zero codes.
NANOCCL_CODEC_HD static inline bool scaleQuantizes(float scale) {
  return scale > 0.0f && isFinite(scale);
}

// The code of x in a block with a positive finite scale. `u` is uniform() for stochastic
// rounding: the code is floor(v) + (u < frac(v)), which is floor(v) + 1 with probability frac(v)
// (to 2^-24), every step exact.
NANOCCL_CODEC_HD static inline int32_t quantize(float x, float scale, float kMax, bool stochastic,
                                                float u) {
  float v = x / scale;
  // |v| exceeds kMax only when the scale is subnormal and lost bits; never NaN here.
  v = v < -kMax ? -kMax : v;
  v = v > kMax ? kMax : v;
  if (stochastic) {
    const float whole = NANOCCL_CODEC_FLOOR(v);
    const float frac = v - whole;
    return static_cast<int32_t>(whole) + (u < frac ? 1 : 0);
  }
  return static_cast<int32_t>(NANOCCL_CODEC_RINT(v));
}

// A non-finite scale (the encoder writes NaN; a foreign stream might hold inf) decodes as NaN.
NANOCCL_CODEC_HD static inline float decodeScale(float scale) {
  return isFinite(scale) ? scale : bitsFloat(kCanonicalNan);
}

NANOCCL_CODEC_HD static inline float dequantize(int32_t q, float scale) {
  return static_cast<float>(q) * scale;
}

// int4 codes: two's complement nibbles.
NANOCCL_CODEC_HD static inline uint8_t nibble(int32_t q) { return static_cast<uint8_t>(q & 0xf); }
NANOCCL_CODEC_HD static inline int32_t fromNibble(uint32_t n) {
  return static_cast<int32_t>((n & 0xfu) ^ 8u) - 8;
}

// ---- Where decoded values go ---------------------------------------------------------------

NANOCCL_CODEC_HD static inline float canonical(float f) {
  return isNan(f) ? bitsFloat(kCanonicalNan) : f;
}
NANOCCL_CODEC_HD static inline float sinkStore(float /*dst*/, float d) { return canonical(d); }
NANOCCL_CODEC_HD static inline float sinkAccumulate(float dst, float d) {
  return canonical(dst + d);
}
// Error feedback: dst holds x; what is left of it after decoding, 0 where that is not finite.
NANOCCL_CODEC_HD static inline float sinkResidual(float dst, float d) {
  const float r = dst - d;
  return isFinite(r) ? r : 0.0f;
}

// ---- IEEE binary16 and bfloat16 (the same bits as common/dtype.h, which the tests check) ------

NANOCCL_CODEC_HD static inline uint16_t toHalf(float f) {
  const uint32_t x = floatBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t absx = x & kAbsMask;
  if (absx >= kInfBits) {  // inf or NaN
    return static_cast<uint16_t>(sign | 0x7c00u | (absx > kInfBits ? 0x200u : 0));
  }
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds past 65504
  if (absx < 0x38800000u) {  // subnormal or zero
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
  uint32_t h = (absx >> 13) - ((127 - 15) << 10);
  const uint32_t rem = absx & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

NANOCCL_CODEC_HD static inline float fromHalf(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return bitsFloat(sign);
    exp = 127 - 15 + 1;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --exp;
    }
    return bitsFloat(sign | (exp << 23) | ((mant & 0x3ffu) << 13));
  }
  if (exp == 0x1f) return bitsFloat(sign | kInfBits | (mant << 13));
  return bitsFloat(sign | ((exp + 127 - 15) << 23) | (mant << 13));
}

NANOCCL_CODEC_HD static inline uint16_t toBf16(float f) {
  const uint32_t x = floatBits(f);
  if ((x & kAbsMask) > kInfBits) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN, quiet
  const uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

NANOCCL_CODEC_HD static inline float fromBf16(uint16_t b) {
  return bitsFloat(static_cast<uint32_t>(b) << 16);
}

}  // namespace nanoccl::codec::math
