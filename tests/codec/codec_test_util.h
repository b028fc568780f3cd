// Helpers of the CPU codec tests (codec_test.cc, codec_variants_test.cc): bit casts, the codec
// table as a list, the instruction sets this CPU runs, inputs (random floats over many binades,
// blocks of different character), and calls into a codec through a chosen variant with canary
// bytes after the stream.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <vector>

#include "collectives/codec/codec.h"
#include "collectives/codec/codec_internal.h"

namespace nanoccl::codec::codectest {

using internal::Isa;
using internal::Sink;

constexpr size_t kCanary = 64;  // bytes after the stream that no encoder may touch
constexpr uint8_t kCanaryByte = 0xa5;
constexpr uint32_t kCanonicalNan = 0x7fc00000u;

inline uint32_t bitsOf(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
inline float floatOf(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

inline std::vector<Isa> supportedIsas() {
  std::vector<Isa> v;
  for (size_t i = 0; i < static_cast<size_t>(Isa::kNumIsas); ++i) {
    const auto isa = static_cast<Isa>(i);
    if (reduce_internal::isaCompiled(isa) && reduce_internal::cpuSupports(isa)) v.push_back(isa);
  }
  return v;
}

inline std::vector<const Codec*> allCodecs() {
  std::vector<const Codec*> v;
  for (size_t i = 0; i < static_cast<size_t>(CodecId::kNumCodecs); ++i) {
    v.push_back(&codecTable()[i]);
  }
  return v;
}

inline bool isQuant(const Codec& c) { return c.id == CodecId::kInt8 || c.id == CodecId::kInt4; }
inline float maxCode(const Codec& c) { return c.id == CodecId::kInt8 ? 127.0f : 7.0f; }

// ---- Inputs ---------------------------------------------------------------------------------

// Gradient-like values over many binades; with `specials`, one in 64 is NaN, inf, a zero, a
// subnormal or FLT_MAX.
inline std::vector<float> randomFloats(size_t n, uint64_t seed, bool specials) {
  std::mt19937_64 rng(seed);
  static const float kSpecials[] = {0.0f,
                                    -0.0f,
                                    std::numeric_limits<float>::infinity(),
                                    -std::numeric_limits<float>::infinity(),
                                    std::numeric_limits<float>::quiet_NaN(),
                                    -std::numeric_limits<float>::quiet_NaN(),
                                    floatOf(0x7f800001u),  // signaling NaN
                                    floatOf(0xffc12345u),  // NaN with a payload
                                    std::numeric_limits<float>::denorm_min(),
                                    -std::numeric_limits<float>::min() / 3,
                                    std::numeric_limits<float>::max(),
                                    65520.0f,
                                    1.0f + 0x1p-11f};
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    if (specials && rng() % 64 == 0) {
      v[i] = kSpecials[rng() % std::size(kSpecials)];
    } else {
      v[i] = std::ldexp(mant(rng), static_cast<int>(rng() % 24) - 16);
    }
  }
  return v;
}

// Blocks of different character for the quant codecs: ordinary, all zero, with one NaN, with one
// inf, all subnormal, tiny enough that the scale underflows, huge.
inline std::vector<float> blockyFloats(size_t n, uint32_t block, uint64_t seed) {
  std::vector<float> v = randomFloats(n, seed, false);
  std::mt19937_64 rng(seed ^ 0x5eed);
  for (size_t start = 0; start < n; start += block) {
    const size_t len = std::min<size_t>(block, n - start);
    float* x = v.data() + start;
    switch (rng() % 8) {
      case 0: std::fill(x, x + len, 0.0f); break;
      case 1: x[rng() % len] = std::numeric_limits<float>::quiet_NaN(); break;
      case 2: x[rng() % len] = -std::numeric_limits<float>::infinity(); break;
      case 3:
        for (size_t i = 0; i < len; ++i) x[i] *= 0x1p-130f;  // subnormal
        break;
      case 4:
        for (size_t i = 0; i < len; ++i) x[i] *= 0x1p-144f;  // scale underflows
        break;
      case 5:
        for (size_t i = 0; i < len; ++i) x[i] *= 0x1p110f;
        break;
      default: break;
    }
  }
  return v;
}

// ---- Calling a codec through a chosen variant -----------------------------------------------

// The stream, followed by kCanary canary bytes.
inline std::vector<uint8_t> encodeOn(Isa isa, const Codec& c, const float* x, size_t n,
                                     const CodecParams& p) {
  const size_t bytes = c.encodedBytes(n, p);
  EXPECT_GT(bytes, 0u);
  std::vector<uint8_t> out(bytes + kCanary, kCanaryByte);
  const Status s = internal::encodeWith(isa, c, x, DataType::kFloat32, n, p, out.data(),
                                        out.size());
  EXPECT_TRUE(s.isOk()) << s.toString();
  for (size_t i = bytes; i < out.size(); ++i) {
    EXPECT_EQ(out[i], kCanaryByte) << c.name << ": encode wrote past its stream at " << i;
  }
  out.resize(bytes);
  return out;
}

inline std::vector<float> decodeOn(Isa isa, Sink sink, const std::vector<uint8_t>& stream,
                                   std::vector<float> dst) {
  const Status s = internal::decodeWith(isa, sink, stream.data(), stream.size(), dst.data(),
                                        dst.size());
  EXPECT_TRUE(s.isOk()) << s.toString();
  return dst;
}

inline std::vector<float> decodeStore(const Codec& c, const std::vector<uint8_t>& stream,
                                      size_t n) {
  std::vector<float> out(n, 1234.5f);
  const Status s = c.decode(stream.data(), stream.size(), out.data(), n);
  EXPECT_TRUE(s.isOk()) << s.toString();
  return out;
}

inline float streamScale(const std::vector<uint8_t>& stream, size_t block) {
  float s;
  std::memcpy(&s, stream.data() + kHeaderBytes + 4 * block, 4);
  return s;
}

}  // namespace nanoccl::codec::codectest
