// Every vector variant of the codecs against the scalar one, bit for bit (codec_internal.h gives
// the per-ISA entry points; storing, and with the error-feedback residual sink), decodeAccumulate,
// error feedback and stochastic rounding. The references and edge cases are in codec_test.cc;
// the helpers both use in codec_test_util.h.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "collectives/codec/codec.h"
#include "collectives/codec/codec_internal.h"
#include "tests/codec/codec_test_util.h"

namespace nanoccl::codec::codectest {
namespace {

// ---- Every variant against the scalar one, bit for bit ---------------------------------------

void checkVariantsAgree(const Codec& c, size_t n, uint32_t block, bool sr, uint64_t seed) {
  SCOPED_TRACE(std::string(c.name) + " n=" + std::to_string(n) + " block=" +
               std::to_string(block) + (sr ? " sr" : ""));
  const std::vector<float> x =
      isQuant(c) ? blockyFloats(n, block, seed) : randomFloats(n, seed, true);
  // dst for the accumulating sinks: ordinary values, NaNs with payloads, infinities.
  const std::vector<float> dst = randomFloats(n, seed + 1, true);
  CodecParams p;
  p.blockSize = block;
  p.stochasticRounding = sr;
  p.seed = seed * 31;
  const std::vector<uint8_t> ref = encodeOn(Isa::kScalar, c, x.data(), n, p);
  std::vector<float> refOut[3];
  for (size_t k = 0; k < 3; ++k) refOut[k] = decodeOn(Isa::kScalar, static_cast<Sink>(k), ref, dst);
  for (const Isa isa : supportedIsas()) {
    if (isa == Isa::kScalar) continue;
    SCOPED_TRACE(reduce_internal::isaName(isa));
    const std::vector<uint8_t> got = encodeOn(isa, c, x.data(), n, p);
    ASSERT_EQ(got.size(), ref.size());
    for (size_t i = 0; i < ref.size(); ++i) ASSERT_EQ(got[i], ref[i]) << "stream byte " << i;
    for (size_t k = 0; k < 3; ++k) {
      const std::vector<float> out = decodeOn(isa, static_cast<Sink>(k), ref, dst);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(bitsOf(out[i]), bitsOf(refOut[k][i])) << "sink " << k << " element " << i;
      }
    }
  }
}

TEST(CodecVariants, BitIdenticalToScalar) {
  if (supportedIsas().size() < 2) GTEST_SKIP() << "this CPU runs the scalar kernels only";
  const size_t lengths[] = {0, 1, 7, 15, 16, 17, 31, 32, 33, 63, 64, 65, 255, 256, 257, 1000,
                            4097, 65537};
  for (const Codec* c : allCodecs()) {
    const std::vector<uint32_t> blocks =
        isQuant(*c) ? std::vector<uint32_t>{32, 64, 96, 256, 1024} : std::vector<uint32_t>{0};
    for (const uint32_t block : blocks) {
      for (const size_t n : lengths) {
        for (const bool sr : {false, true}) {
          if (sr && !isQuant(*c)) continue;
          checkVariantsAgree(*c, n, block, sr, 100 + n * 7 + block);
        }
      }
    }
  }
}

TEST(CodecVariants, ResidualSinkBitIdentical) {
  if (supportedIsas().size() < 2) GTEST_SKIP() << "this CPU runs the scalar kernels only";
  for (const Codec* c : allCodecs()) {
    const std::vector<float> in = randomFloats(3000, 77, true);
    std::vector<float> refResidual = randomFloats(3000, 78, false);
    std::vector<uint8_t> refStream(c->encodedBytes(in.size(), {}));
    const std::vector<float> start = refResidual;
    ASSERT_TRUE(internal::encodeWithFeedbackWith(Isa::kScalar, *c, in.data(), refResidual.data(),
                                                 in.size(), {}, refStream.data(),
                                                 refStream.size())
                    .isOk());
    for (const Isa isa : supportedIsas()) {
      std::vector<float> residual = start;
      std::vector<uint8_t> stream(refStream.size());
      ASSERT_TRUE(internal::encodeWithFeedbackWith(isa, *c, in.data(), residual.data(), in.size(),
                                                   {}, stream.data(), stream.size())
                      .isOk());
      EXPECT_EQ(stream, refStream) << c->name << " " << reduce_internal::isaName(isa);
      for (size_t i = 0; i < in.size(); ++i) {
        ASSERT_EQ(bitsOf(residual[i]), bitsOf(refResidual[i]))
            << c->name << " " << reduce_internal::isaName(isa) << " " << i;
      }
    }
  }
}

// ---- decodeAccumulate ---------------------------------------------------------------------------

TEST(CodecAccumulate, AddsTheDecodedValues) {
  for (const Codec* c : allCodecs()) {
    const std::vector<float> x = randomFloats(1000, 21, false);
    const std::vector<uint8_t> s = encodeOn(internal::activeIsa(), *c, x.data(), x.size(), {});
    const std::vector<float> y = decodeStore(*c, s, x.size());
    std::vector<float> acc = randomFloats(1000, 22, false);
    const std::vector<float> before = acc;
    ASSERT_TRUE(c->decodeAccumulate(s.data(), s.size(), acc.data(), acc.size()).isOk());
    for (size_t i = 0; i < acc.size(); ++i) ASSERT_EQ(acc[i], before[i] + y[i]) << c->name << i;
  }
  // NaN from either side comes out as the canonical NaN.
  const Codec& c = codecById(CodecId::kBf16);
  const float x[] = {1.0f, std::numeric_limits<float>::quiet_NaN(), 2.0f};
  const std::vector<uint8_t> s = encodeOn(internal::activeIsa(), c, x, 3, {});
  float acc[] = {floatOf(0xffc00001u), 1.0f, std::numeric_limits<float>::infinity()};
  ASSERT_TRUE(c.decodeAccumulate(s.data(), s.size(), acc, 3).isOk());
  EXPECT_EQ(bitsOf(acc[0]), kCanonicalNan);
  EXPECT_EQ(bitsOf(acc[1]), kCanonicalNan);
  EXPECT_EQ(acc[2], std::numeric_limits<float>::infinity());
}

// ---- Error feedback -----------------------------------------------------------------------------

TEST(CodecFeedback, DecodedSumsToInputsMinusResidual) {
  const size_t n = 5000, steps = 25;
  for (const Codec* c : allCodecs()) {
    for (const bool sr : {false, true}) {
      if (sr && !isQuant(*c)) continue;
      SCOPED_TRACE(std::string(c->name) + (sr ? " sr" : ""));
      CodecParams p;
      p.stochasticRounding = sr;
      std::vector<float> residual(n, 0.0f);
      std::vector<double> sumDecoded(n, 0.0), sumInputs(n, 0.0), roundingSlack(n, 0.0);
      std::vector<uint8_t> stream(c->encodedBytes(n, p));
      for (size_t t = 0; t < steps; ++t) {
        p.seed = t;
        const std::vector<float> in = randomFloats(n, 1000 + t, false);
        for (size_t i = 0; i < n; ++i) {
          // x = input + residual rounds once per step: half an ulp of x.
          roundingSlack[i] += std::ldexp(std::fabs(in[i] + residual[i]), -24);
        }
        ASSERT_TRUE(encodeWithFeedback(*c, in.data(), residual.data(), n, p, stream.data(),
                                       stream.size())
                        .isOk());
        const std::vector<float> y = decodeStore(*c, stream, n);
        for (size_t i = 0; i < n; ++i) {
          sumDecoded[i] += y[i];
          sumInputs[i] += in[i];
          // residual = x - decoded is exact but where decoded is far from x (stochastic rounding
          // of a small x): half an ulp of the residual.
          roundingSlack[i] += std::ldexp(std::fabs(residual[i]), -24);
        }
      }
      for (size_t i = 0; i < n; ++i) {
        const double want = sumInputs[i] - residual[i];
        ASSERT_LE(std::fabs(sumDecoded[i] - want), roundingSlack[i] + 1e-30)
            << "element " << i << " decoded sum " << sumDecoded[i] << " want " << want;
        if (c->id == CodecId::kNone) {
          ASSERT_EQ(residual[i], 0.0f);
        }
      }
    }
  }
}

TEST(CodecFeedback, ResidualIsWhatDecodingLost) {
  const Codec& c = codecById(CodecId::kInt4);
  const std::vector<float> in = randomFloats(640, 31, false);
  std::vector<float> residual = randomFloats(640, 32, false);
  std::vector<float> x(640);
  for (size_t i = 0; i < x.size(); ++i) x[i] = in[i] + residual[i];
  std::vector<uint8_t> stream(c.encodedBytes(640, {}));
  ASSERT_TRUE(encodeWithFeedback(c, in.data(), residual.data(), 640, {}, stream.data(),
                                 stream.size())
                  .isOk());
  // The stream is encode(x), and the residual x - decode(stream).
  EXPECT_EQ(stream, encodeOn(internal::activeIsa(), c, x.data(), x.size(), {}));
  const std::vector<float> y = decodeStore(c, stream, 640);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(residual[i], x[i] - y[i]) << i;
}

TEST(CodecFeedback, NonFiniteStepLeavesNoPoison) {
  const Codec& c = codecById(CodecId::kInt8);
  const size_t n = 512;
  std::vector<float> in = randomFloats(n, 41, false);
  std::vector<float> residual(n, 0.0f);
  in[3] = std::numeric_limits<float>::infinity();
  std::vector<uint8_t> stream(c.encodedBytes(n, {}));
  ASSERT_TRUE(encodeWithFeedback(c, in.data(), residual.data(), n, {}, stream.data(), stream.size())
                  .isOk());
  for (size_t i = 0; i < 256; ++i) ASSERT_EQ(residual[i], 0.0f) << "the poisoned block resets";
  for (size_t i = 256; i < n; ++i) ASSERT_TRUE(std::isfinite(residual[i]));
  in[3] = 1.0f;
  ASSERT_TRUE(encodeWithFeedback(c, in.data(), residual.data(), n, {}, stream.data(), stream.size())
                  .isOk());
  const std::vector<float> y = decodeStore(c, stream, n);
  for (size_t i = 0; i < n; ++i) ASSERT_TRUE(std::isfinite(y[i])) << i;
}

// ---- Stochastic rounding ------------------------------------------------------------------------

TEST(CodecStochastic, UnbiasedAndReproducible) {
  // Every block: one element at 127 (scale 1) and the rest at 0.3 code units, which nearest
  // rounding always sends to 0. Stochastic rounding must give 0.3 on average.
  const Codec& c = codecById(CodecId::kInt8);
  const size_t block = 256, blocks = 4096, n = block * blocks;
  std::vector<float> x(n, 0.3f);
  for (size_t b = 0; b < blocks; ++b) x[b * block] = 127.0f;
  CodecParams p;
  p.stochasticRounding = true;
  p.seed = 12345;
  const std::vector<uint8_t> s = encodeOn(internal::activeIsa(), c, x.data(), n, p);
  const std::vector<float> y = decodeStore(c, s, n);
  double sum = 0.0;
  size_t count = 0;
  for (size_t i = 0; i < n; ++i) {
    if (i % block == 0) continue;
    ASSERT_TRUE(y[i] == 0.0f || y[i] == 1.0f) << y[i];
    sum += y[i];
    ++count;
  }
  // Bernoulli(0.3): the mean of ~1M draws is within 5 standard deviations (~0.0023).
  const double mean = sum / count;
  EXPECT_NEAR(mean, 0.3, 5 * std::sqrt(0.3 * 0.7 / count)) << mean;

  // Nearest rounding is biased on the same input.
  const std::vector<float> yn =
      decodeStore(c, encodeOn(internal::activeIsa(), c, x.data(), n, {}), n);
  EXPECT_EQ(yn[1], 0.0f);

  // Same seed, same stream; another seed, another stream.
  EXPECT_EQ(encodeOn(internal::activeIsa(), c, x.data(), n, p), s);
  p.seed = 12346;
  EXPECT_NE(encodeOn(internal::activeIsa(), c, x.data(), n, p), s);
}

TEST(CodecStochastic, UnbiasedOnRandomData) {
  // Averaged over many seeds, the decoded value converges on x for every element, both codecs.
  for (const CodecId id : {CodecId::kInt8, CodecId::kInt4}) {
    const Codec& c = codecById(id);
    const size_t n = 256, rounds = 2000;
    const std::vector<float> x = randomFloats(n, 51, false);
    std::vector<double> mean(n, 0.0);
    std::vector<uint8_t> s(c.encodedBytes(n, {}));
    std::vector<float> y(n);
    CodecParams p;
    p.stochasticRounding = true;
    for (size_t r = 0; r < rounds; ++r) {
      p.seed = r;
      ASSERT_TRUE(c.encode(x.data(), DataType::kFloat32, n, p, s.data(), s.size()).isOk());
      ASSERT_TRUE(c.decode(s.data(), s.size(), y.data(), n).isOk());
      for (size_t i = 0; i < n; ++i) mean[i] += y[i] / static_cast<double>(rounds);
    }
    for (size_t i = 0; i < n; ++i) {
      const float scale = streamScale(s, i / c.defaultBlockSize);
      // Each draw is within one scale; 6 standard deviations of the mean of `rounds` draws.
      EXPECT_NEAR(mean[i], x[i], 6 * 0.5 * scale / std::sqrt(static_cast<double>(rounds)))
          << c.name << " element " << i;
    }
  }
}

}  // namespace
}  // namespace nanoccl::codec::codectest
