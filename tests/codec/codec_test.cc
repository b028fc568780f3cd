// The codecs against references computed here (fp16/bf16: common/dtype.h's conversions;
// int8/int4: the per-block scale and the documented error bound), the documented edge cases,
// 16-bit inputs, bad arguments and streams, and the CUDA stubs of a CPU build. Every vector
// variant against the scalar one, decodeAccumulate, error feedback and stochastic rounding are in
// codec_variants_test.cc; the helpers both use in codec_test_util.h.
#include "collectives/codec/codec.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "collectives/codec/codec_cuda.h"
#include "collectives/codec/codec_internal.h"
#include "tests/codec/codec_test_util.h"

namespace nanoccl::codec::codectest {
namespace {

// ---- The table --------------------------------------------------------------------------------

TEST(CodecTable, NamesAndLookup) {
  EXPECT_EQ(knownCodecNames(), "none, fp16, bf16, int8, int4");
  for (const Codec* c : allCodecs()) {
    EXPECT_EQ(&codecById(c->id), c);
    const Result<const Codec*> found = findCodec(c->name);
    ASSERT_TRUE(found.isOk());
    EXPECT_EQ(found.value(), c);
  }
  const Result<const Codec*> upper = findCodec("INT8");
  ASSERT_TRUE(upper.isOk());
  EXPECT_EQ(upper.value()->id, CodecId::kInt8);

  const Result<const Codec*> unknown = findCodec("int3");
  ASSERT_FALSE(unknown.isOk());
  EXPECT_EQ(unknown.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("int3"), std::string::npos);
  EXPECT_NE(unknown.status().message().find("none, fp16, bf16, int8, int4"), std::string::npos);
  EXPECT_FALSE(findCodec("").isOk());
  EXPECT_FALSE(findCodec("int88").isOk());

  EXPECT_EQ(codecById(CodecId::kInt8).defaultBlockSize, 256u);
  EXPECT_EQ(codecById(CodecId::kInt4).defaultBlockSize, 64u);
}

TEST(CodecTable, EncodedBytes) {
  const CodecParams p;
  EXPECT_EQ(codecById(CodecId::kNone).encodedBytes(0, p), 16u);
  EXPECT_EQ(codecById(CodecId::kNone).encodedBytes(3, p), 16u + 16u);
  EXPECT_EQ(codecById(CodecId::kFp16).encodedBytes(9, p), 16u + 32u);
  EXPECT_EQ(codecById(CodecId::kBf16).encodedBytes(8, p), 16u + 16u);
  // int8, block 256: 1000 elements = 4 blocks -> 16 scale bytes, 1000 codes -> 1008.
  EXPECT_EQ(codecById(CodecId::kInt8).encodedBytes(1000, p), 16u + 16u + 1008u);
  EXPECT_EQ(codecById(CodecId::kInt8).encodedBytes(0, p), 16u);
  // int4, block 64: 1001 elements = 16 blocks -> 64 scale bytes, 501 code bytes -> 512.
  EXPECT_EQ(codecById(CodecId::kInt4).encodedBytes(1001, p), 16u + 64u + 512u);
  CodecParams b32;
  b32.blockSize = 32;
  EXPECT_EQ(codecById(CodecId::kInt4).encodedBytes(33, b32), 16u + 16u + 32u);
  // The compression ratio the design counts on, for a large buffer.
  const size_t n = 1 << 24;
  const double fp32 = 4.0 * n;
  // int8: 256 codes + a 4-byte scale per 1024 input bytes; int4: 32 + 4 bytes per 256.
  EXPECT_NEAR(fp32 / codecById(CodecId::kInt8).encodedBytes(n, p), 1024.0 / 260, 1e-3);
  EXPECT_NEAR(fp32 / codecById(CodecId::kInt4).encodedBytes(n, p), 256.0 / 36, 1e-3);
  // Invalid block sizes give 0; the non-block codecs ignore the field.
  for (const uint32_t bad : {16u, 33u, 100u, kMaxBlockSize + kBlockAlign}) {
    CodecParams q;
    q.blockSize = bad;
    EXPECT_EQ(codecById(CodecId::kInt8).encodedBytes(10, q), 0u) << bad;
    EXPECT_EQ(codecById(CodecId::kFp16).encodedBytes(10, q), 16u + 32u) << bad;
  }
}

TEST(CodecTable, ResolveBlockSize) {
  CodecParams p;
  EXPECT_EQ(resolveBlockSize(codecById(CodecId::kInt8), p).value(), 256u);
  EXPECT_EQ(resolveBlockSize(codecById(CodecId::kInt4), p).value(), 64u);
  EXPECT_EQ(resolveBlockSize(codecById(CodecId::kBf16), p).value(), 0u);
  p.blockSize = 96;
  EXPECT_EQ(resolveBlockSize(codecById(CodecId::kInt4), p).value(), 96u);
  p.blockSize = 48;
  const Result<uint32_t> bad = resolveBlockSize(codecById(CodecId::kInt4), p);
  ASSERT_FALSE(bad.isOk());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("48"), std::string::npos);
}

// ---- Layout -----------------------------------------------------------------------------------

TEST(CodecLayout, HeaderPaddingAndInspect) {
  const std::vector<float> x = randomFloats(1001, 1, false);
  for (const Codec* c : allCodecs()) {
    for (const bool sr : {false, true}) {
      CodecParams p;
      p.stochasticRounding = sr;
      p.seed = 7;
      const std::vector<uint8_t> s = encodeOn(internal::activeIsa(), *c, x.data(), x.size(), p);
      EXPECT_EQ(s.size() % 16, 0u);
      EXPECT_EQ(s[0], static_cast<uint8_t>(c->id));
      EXPECT_EQ(s[1], kStreamVersion);
      Result<StreamInfo> info = inspectStream(s.data(), s.size());
      ASSERT_TRUE(info.isOk()) << info.status().toString();
      EXPECT_EQ(info->codec, c->id);
      EXPECT_EQ(info->count, x.size());
      EXPECT_EQ(info->bytes, s.size());
      EXPECT_EQ(info->blockSize, c->defaultBlockSize);
      EXPECT_EQ(info->stochasticRounding, sr && isQuant(*c));
      if (isQuant(*c)) {
        const size_t nblocks = (x.size() + c->defaultBlockSize - 1) / c->defaultBlockSize;
        const size_t codesAt = 16 + (4 * nblocks + 15) / 16 * 16;
        for (size_t i = 16 + 4 * nblocks; i < codesAt; ++i) EXPECT_EQ(s[i], 0) << c->name << i;
        const size_t codeBytes = c->id == CodecId::kInt8 ? x.size() : (x.size() + 1) / 2;
        for (size_t i = codesAt + codeBytes; i < s.size(); ++i) EXPECT_EQ(s[i], 0) << c->name;
        if (c->id == CodecId::kInt4) {
          EXPECT_EQ(s[codesAt + codeBytes - 1] >> 4, 0) << "unused nibble of an odd count";
        }
      } else {
        const size_t width = c->id == CodecId::kNone ? 4 : 2;
        for (size_t i = 16 + width * x.size(); i < s.size(); ++i) EXPECT_EQ(s[i], 0) << c->name;
      }
    }
  }
}

TEST(CodecLayout, LargerBuffersAreFine) {
  const std::vector<float> x = randomFloats(100, 2, false);
  const Codec& c = codecById(CodecId::kInt8);
  const size_t bytes = c.encodedBytes(x.size(), {});
  std::vector<uint8_t> slot(bytes + 100, kCanaryByte);
  ASSERT_TRUE(
      c.encode(x.data(), DataType::kFloat32, x.size(), {}, slot.data(), slot.size()).isOk());
  for (size_t i = bytes; i < slot.size(); ++i) EXPECT_EQ(slot[i], kCanaryByte);
  std::vector<float> y(x.size());
  ASSERT_TRUE(c.decode(slot.data(), slot.size(), y.data(), y.size()).isOk());
}

// ---- fp16 / bf16 / none: exact ----------------------------------------------------------------

TEST(CodecFloat, Fp16AndBf16RoundToNearestEven) {
  std::vector<float> x = randomFloats(5000, 3, true);
  // Ties and the edges of fp16's range, by hand.
  const float hand[] = {1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 65504.0f, 65519.0f, 65520.0f,
                        0x1p-24f,        0x1p-25f,            0x1.8p-25f, 1.0f + 0x1p-8f,
                        1.0f + 3 * 0x1p-8f};
  x.insert(x.end(), std::begin(hand), std::end(hand));
  for (const CodecId id : {CodecId::kFp16, CodecId::kBf16}) {
    const Codec& c = codecById(id);
    const std::vector<uint8_t> s = encodeOn(internal::activeIsa(), c, x.data(), x.size(), {});
    const std::vector<float> y = decodeStore(c, s, x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      uint16_t code;
      std::memcpy(&code, s.data() + kHeaderBytes + 2 * i, 2);
      const uint16_t want = id == CodecId::kFp16 ? floatToHalf(x[i]) : floatToBFloat16(x[i]);
      ASSERT_EQ(code, want) << c.name << " x=" << x[i] << " i=" << i;
      const float back = id == CodecId::kFp16 ? halfToFloat(want) : bfloat16ToFloat(want);
      if (std::isnan(x[i])) {
        EXPECT_EQ(bitsOf(y[i]), kCanonicalNan) << "decode writes the canonical NaN";
      } else {
        EXPECT_EQ(bitsOf(y[i]), bitsOf(back)) << c.name << " x=" << x[i];
      }
    }
  }
  // The hand-checked values.
  EXPECT_EQ(floatToHalf(1.0f + 0x1p-11f), 0x3c00);  // tie -> even
  EXPECT_EQ(floatToHalf(1.0f + 3 * 0x1p-11f), 0x3c02);
  EXPECT_EQ(floatToHalf(65519.0f), 0x7bff);
  EXPECT_EQ(floatToHalf(65520.0f), 0x7c00);
  EXPECT_EQ(floatToBFloat16(1.0f + 0x1p-8f), 0x3f80);
  EXPECT_EQ(floatToBFloat16(1.0f + 3 * 0x1p-8f), 0x3f82);
}

TEST(CodecFloat, NoneIsExact) {
  const std::vector<float> x = randomFloats(777, 4, true);
  const Codec& c = codecById(CodecId::kNone);
  const std::vector<uint8_t> s = encodeOn(internal::activeIsa(), c, x.data(), x.size(), {});
  const std::vector<float> y = decodeStore(c, s, x.size());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(bitsOf(y[i]), bitsOf(x[i])) << i;
}

// ---- int8 / int4: scale and error bound ----------------------------------------------------

// The bound codec.h documents, with `unit` = 1/2 (nearest) or 1 (stochastic rounding).
double errorBound(float scale, double unit) {
  return scale * (unit + std::ldexp(1.0, -16)) + std::ldexp(1.0, -142);
}

void checkQuantRoundTrip(const Codec& c, uint32_t block, size_t n, bool stochastic,
                         uint64_t seed) {
  SCOPED_TRACE(std::string(c.name) + " block=" + std::to_string(block) + " n=" +
               std::to_string(n) + (stochastic ? " sr" : ""));
  const std::vector<float> x = blockyFloats(n, block, seed);
  CodecParams p;
  p.blockSize = block;
  p.stochasticRounding = stochastic;
  p.seed = seed;
  const std::vector<uint8_t> s = encodeOn(internal::activeIsa(), c, x.data(), n, p);
  const std::vector<float> y = decodeStore(c, s, n);
  for (size_t b = 0, start = 0; start < n; ++b, start += block) {
    const size_t len = std::min<size_t>(block, n - start);
    // The reference scale, from the block's own elements.
    bool finite = true;
    float amax = 0.0f;
    for (size_t i = 0; i < len; ++i) {
      if (!std::isfinite(x[start + i])) finite = false;
      amax = std::max(amax, std::fabs(x[start + i]));
    }
    const float scale = streamScale(s, b);
    if (!finite) {
      EXPECT_EQ(bitsOf(scale), kCanonicalNan) << "block " << b;
      for (size_t i = 0; i < len; ++i) {
        ASSERT_EQ(bitsOf(y[start + i]), kCanonicalNan) << "block with NaN/inf, element " << i;
      }
      continue;
    }
    ASSERT_EQ(bitsOf(scale), bitsOf(amax / maxCode(c))) << "block " << b;
    for (size_t i = 0; i < len; ++i) {
      const float xi = x[start + i], yi = y[start + i];
      ASSERT_TRUE(std::isfinite(yi)) << "x=" << xi;
      const double err = std::fabs(static_cast<double>(xi) - static_cast<double>(yi));
      ASSERT_LE(err, errorBound(scale, stochastic ? 1.0 : 0.5))
          << "block " << b << " element " << i << " x=" << xi << " decoded=" << yi
          << " scale=" << scale;
      if (scale == 0.0f) {
        ASSERT_EQ(bitsOf(yi), 0u) << "zero blocks decode to +0";
      }
      // Every decoded value is code * scale with the code in range.
      if (scale > 0.0f && std::isnormal(scale)) {
        const float code = std::round(yi / scale);
        ASSERT_LE(std::fabs(code), maxCode(c));
      }
    }
  }
}

TEST(CodecQuant, ErrorBoundsPerBlockSize) {
  const size_t lengths[] = {1, 31, 32, 33, 255, 1000, 4097};
  for (const CodecId id : {CodecId::kInt8, CodecId::kInt4}) {
    for (const uint32_t block : {32u, 64u, 96u, 256u, 1024u}) {
      for (const size_t n : lengths) {
        for (const bool sr : {false, true}) {
          checkQuantRoundTrip(codecById(id), block, n, sr, 11 + n + block);
        }
      }
    }
  }
  // Long blocks and many blocks.
  checkQuantRoundTrip(codecById(CodecId::kInt8), 65536, 200000, false, 5);
  checkQuantRoundTrip(codecById(CodecId::kInt4), 64, 300001, true, 6);
}

TEST(CodecQuant, NearestIsNearest) {
  // Codes that land on .5 in code units round to even; the largest magnitude maps to +-max.
  const Codec& c = codecById(CodecId::kInt8);
  std::vector<float> x(32, 0.0f);
  x[0] = 127.0f;  // scale 1
  x[1] = 2.5f;
  x[2] = 3.5f;
  x[3] = -2.5f;
  x[4] = 0.49999997f;
  x[5] = -127.0f;
  x[6] = 1e-3f;
  const std::vector<uint8_t> s = encodeOn(internal::activeIsa(), c, x.data(), x.size(), {});
  ASSERT_EQ(streamScale(s, 0), 1.0f);
  const auto* codes = reinterpret_cast<const int8_t*>(s.data() + 32);
  EXPECT_EQ(codes[0], 127);
  EXPECT_EQ(codes[1], 2);
  EXPECT_EQ(codes[2], 4);
  EXPECT_EQ(codes[3], -2);
  EXPECT_EQ(codes[4], 0);
  EXPECT_EQ(codes[5], -127);
  EXPECT_EQ(codes[6], 0);
  // int4: nibbles, two's complement, element 0 low.
  std::vector<float> z(32, 0.0f);
  z[0] = 7.0f;
  z[1] = -7.0f;
  z[2] = -1.0f;
  z[3] = 2.6f;
  const std::vector<uint8_t> s4 =
      encodeOn(internal::activeIsa(), codecById(CodecId::kInt4), z.data(), z.size(), {});
  EXPECT_EQ(streamScale(s4, 0), 1.0f);
  EXPECT_EQ(s4[32], 0x97);  // 7 | (-7 & 0xf) << 4
  EXPECT_EQ(s4[33], 0x3f);  // -1 & 0xf | 3 << 4
  EXPECT_EQ(s4[34], 0x00);
}

// ---- Edge cases -------------------------------------------------------------------------------

TEST(CodecEdge, ZerosGiveZeroScaleAndNoNan) {
  for (const CodecId id : {CodecId::kInt8, CodecId::kInt4}) {
    const Codec& c = codecById(id);
    std::vector<float> x(300, 0.0f);
    x[17] = -0.0f;
    const std::vector<uint8_t> s = encodeOn(internal::activeIsa(), c, x.data(), x.size(), {});
    for (size_t b = 0; b * c.defaultBlockSize < x.size(); ++b) EXPECT_EQ(streamScale(s, b), 0.0f);
    const std::vector<float> y = decodeStore(c, s, x.size());
    for (const float v : y) ASSERT_EQ(bitsOf(v), 0u);
    std::vector<float> acc(x.size(), 2.0f);
    ASSERT_TRUE(c.decodeAccumulate(s.data(), s.size(), acc.data(), acc.size()).isOk());
    for (const float v : acc) ASSERT_EQ(v, 2.0f);
  }
}

TEST(CodecEdge, NanAndInfPoisonTheirBlockOnly) {
  for (const CodecId id : {CodecId::kInt8, CodecId::kInt4}) {
    const Codec& c = codecById(id);
    const uint32_t block = c.defaultBlockSize;
    for (const float bad : {std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), floatOf(0xff800001u)}) {
      std::vector<float> x = randomFloats(3 * block, 8, false);
      x[block + 5] = bad;  // the middle block
      const std::vector<uint8_t> s = encodeOn(internal::activeIsa(), c, x.data(), x.size(), {});
      EXPECT_TRUE(std::isfinite(streamScale(s, 0)));
      EXPECT_EQ(bitsOf(streamScale(s, 1)), kCanonicalNan);
      EXPECT_TRUE(std::isfinite(streamScale(s, 2)));
      const std::vector<float> y = decodeStore(c, s, x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        if (i >= block && i < 2 * block) {
          ASSERT_EQ(bitsOf(y[i]), kCanonicalNan) << i;
        } else {
          ASSERT_TRUE(std::isfinite(y[i])) << i;
        }
      }
    }
  }
  // fp16/bf16 keep inf as inf and NaN as NaN; a finite value past fp16's range becomes inf.
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const float x[] = {kInf, -kInf, std::numeric_limits<float>::quiet_NaN(), 1e6f, -1e6f};
  for (const CodecId id : {CodecId::kFp16, CodecId::kBf16}) {
    const Codec& c = codecById(id);
    const std::vector<uint8_t> s = encodeOn(internal::activeIsa(), c, x, std::size(x), {});
    const std::vector<float> y = decodeStore(c, s, std::size(x));
    EXPECT_EQ(y[0], std::numeric_limits<float>::infinity());
    EXPECT_EQ(y[1], -std::numeric_limits<float>::infinity());
    EXPECT_EQ(bitsOf(y[2]), kCanonicalNan);
    if (id == CodecId::kFp16) {
      EXPECT_EQ(y[3], std::numeric_limits<float>::infinity());
      EXPECT_EQ(y[4], -std::numeric_limits<float>::infinity());
    } else {
      EXPECT_NEAR(y[3], 1e6f, 1e6f / 256);
    }
  }
}

TEST(CodecEdge, SubnormalsAndExtremes) {
  for (const CodecId id : {CodecId::kInt8, CodecId::kInt4}) {
    const Codec& c = codecById(id);
    // A block of subnormals, a block whose scale underflows to 0, a block at FLT_MAX.
    std::vector<float> x(96);
    for (size_t i = 0; i < 32; ++i) x[i] = std::numeric_limits<float>::denorm_min() * (i * 37.0f);
    for (size_t i = 32; i < 64; ++i) x[i] = std::numeric_limits<float>::denorm_min() * (i % 2);
    for (size_t i = 64; i < 96; ++i) {
      x[i] = std::numeric_limits<float>::max() * ((i % 2 ? -1.0f : 1.0f) / (1 + i % 7));
    }
    CodecParams p;
    p.blockSize = 32;
    const std::vector<uint8_t> s = encodeOn(internal::activeIsa(), c, x.data(), x.size(), p);
    EXPECT_GT(streamScale(s, 0), 0.0f);
    EXPECT_EQ(streamScale(s, 1), 0.0f) << "amax/max underflows: the block flushes to zero";
    const std::vector<float> y = decodeStore(c, s, x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      const float scale = streamScale(s, i / 32);
      ASSERT_TRUE(std::isfinite(y[i])) << i;
      ASSERT_LE(std::fabs(static_cast<double>(x[i]) - y[i]), errorBound(scale, 0.5)) << i;
    }
  }
}

// ---- 16-bit inputs ------------------------------------------------------------------------------

TEST(CodecInput, HalfAndBf16InputsEncodeAsTheirFloatValues) {
  for (const DataType t : {DataType::kFloat16, DataType::kBFloat16}) {
    for (const Codec* c : allCodecs()) {
      for (const uint32_t block : {0u, 96u, 16384u}) {
        if (block != 0 && !isQuant(*c)) continue;
        const size_t n = 40000;
        const std::vector<float> f = randomFloats(n, 61, true);
        std::vector<uint16_t> h(n);
        std::vector<float> widened(n);
        for (size_t i = 0; i < n; ++i) {
          h[i] = t == DataType::kFloat16 ? floatToHalf(f[i]) : floatToBFloat16(f[i]);
          widened[i] = t == DataType::kFloat16 ? halfToFloat(h[i]) : bfloat16ToFloat(h[i]);
        }
        CodecParams p;
        p.blockSize = block;
        p.stochasticRounding = isQuant(*c);
        p.seed = 3;
        const std::vector<uint8_t> want = encodeOn(internal::activeIsa(), *c, widened.data(), n, p);
        std::vector<uint8_t> got(want.size());
        ASSERT_TRUE(c->encode(h.data(), t, n, p, got.data(), got.size()).isOk());
        EXPECT_EQ(got, want) << c->name << " " << dataTypeName(t) << " block " << block;
      }
    }
  }
}

// ---- Bad input ----------------------------------------------------------------------------------

TEST(CodecErrors, BadArgumentsAndStreams) {
  const Codec& c = codecById(CodecId::kInt8);
  const std::vector<float> x = randomFloats(100, 71, false);
  std::vector<uint8_t> s(c.encodedBytes(100, {}));
  // Output too small.
  Status st = c.encode(x.data(), DataType::kFloat32, 100, {}, s.data(), s.size() - 1);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("need"), std::string::npos) << st.message();
  // Unsupported input type, null buffers, bad block size.
  EXPECT_EQ(c.encode(x.data(), DataType::kInt32, 100, {}, s.data(), s.size()).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(c.encode(nullptr, DataType::kFloat32, 100, {}, s.data(), s.size()).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(c.encode(x.data(), DataType::kFloat32, 100, {}, nullptr, s.size()).code(),
            StatusCode::kInvalidArgument);
  std::vector<uint8_t> big(s.size() + 4);
  EXPECT_EQ(c.encode(x.data(), DataType::kFloat32, 100, {}, big.data() + 1, s.size()).code(),
            StatusCode::kInvalidArgument);
  CodecParams bad;
  bad.blockSize = 40;
  EXPECT_EQ(c.encode(x.data(), DataType::kFloat32, 100, bad, s.data(), s.size()).code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE(c.encode(x.data(), DataType::kFloat32, 100, {}, s.data(), s.size()).isOk());

  std::vector<float> y(100);
  // Count mismatch: the caller's fault.
  EXPECT_EQ(c.decode(s.data(), s.size(), y.data(), 99).code(), StatusCode::kInvalidArgument);
  // Truncated, garbled or foreign streams: the peer's.
  EXPECT_EQ(c.decode(s.data(), s.size() - 1, y.data(), 100).code(), StatusCode::kProtocolError);
  EXPECT_EQ(c.decode(s.data(), 8, y.data(), 100).code(), StatusCode::kProtocolError);
  EXPECT_EQ(c.decode(nullptr, 0, y.data(), 100).code(), StatusCode::kProtocolError);
  st = codecById(CodecId::kInt4).decode(s.data(), s.size(), y.data(), 100);
  EXPECT_EQ(st.code(), StatusCode::kProtocolError);
  EXPECT_NE(st.message().find("int8"), std::string::npos) << st.message();
  auto garble = [&](size_t at, uint8_t v) {
    std::vector<uint8_t> g = s;
    g[at] = v;
    return c.decode(g.data(), g.size(), y.data(), 100).code();
  };
  EXPECT_EQ(garble(0, 99), StatusCode::kProtocolError);  // unknown codec
  EXPECT_EQ(garble(1, 2), StatusCode::kProtocolError);   // version
  EXPECT_EQ(garble(2, 4), StatusCode::kProtocolError);   // flags
  EXPECT_EQ(garble(4, 33), StatusCode::kProtocolError);  // block size
  EXPECT_EQ(garble(15, 1), StatusCode::kProtocolError);  // count far beyond the bytes
  EXPECT_EQ(garble(8, 50), StatusCode::kInvalidArgument);  // a count the bytes hold, not 100
  // Feedback checks before it touches the residual.
  std::vector<float> residual(100, 1.0f);
  EXPECT_EQ(encodeWithFeedback(c, x.data(), residual.data(), 100, {}, s.data(), 10).code(),
            StatusCode::kInvalidArgument);
  for (const float r : residual) ASSERT_EQ(r, 1.0f);
}

TEST(CodecCuda, StubsOrKernels) {
  if (cudaCodecsBuilt()) GTEST_SKIP() << "CUDA build: nanoccl_codec_cuda_test covers the kernels";
  const Status s = encodeCuda(codecById(CodecId::kInt8), nullptr, 0, {}, nullptr, 0, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace nanoccl::codec::codectest
