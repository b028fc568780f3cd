// The portable codec kernels: the reference every vectorized variant must match bit for bit,
// written as loops over codec_math.h (the same per-element code the CUDA kernels run). Built with
// the baseline target flags and -ffp-contract=off.
#include <algorithm>

#include "collectives/codec/codec_internal.h"
#include "collectives/codec/codec_math.h"

namespace nanoccl::codec::internal {
namespace {

using namespace math;  // NOLINT: this file is codec_math.h applied to arrays

using SinkFn = float (*)(float, float);

template <SinkFn kSink>
void decodeF32(const float* in, size_t n, float* dst) {
  for (size_t i = 0; i < n; ++i) dst[i] = kSink(dst[i], in[i]);
}

template <uint16_t (*kTo)(float)>
void encodeHalf(const float* in, size_t n, uint16_t* out) {
  for (size_t i = 0; i < n; ++i) out[i] = kTo(in[i]);
}

template <float (*kFrom)(uint16_t), SinkFn kSink>
void decodeHalf(const uint16_t* in, size_t n, float* dst) {
  for (size_t i = 0; i < n; ++i) dst[i] = kSink(dst[i], kFrom(in[i]));
}

template <Quant kQuant>
constexpr float kMaxCode = kQuant == Quant::kInt8 ? 127.0f : 7.0f;

template <Quant kQuant>
void encodeQuant(const float* in, size_t n, const QuantArgs& args, float* scales,
                 uint8_t* codes) {
  const size_t block = args.blockSize;
  for (size_t b = 0, start = 0; start < n; ++b, start += block) {
    const size_t len = std::min(block, n - start);
    const float* x = in + start;
    uint32_t amaxBits = 0;
    for (size_t i = 0; i < len; ++i) amaxBits = std::max(amaxBits, floatBits(x[i]) & kAbsMask);
    const float scale = blockScale(amaxBits, kMaxCode<kQuant>);
    scales[b] = scale;
    const bool quantizes = scaleQuantizes(scale);
    const uint32_t key = args.stochastic ? blockKey(args.seed, args.firstBlock + b) : 0;
    auto code = [&](size_t i) -> int32_t {
      if (!quantizes) return 0;
      const float u = args.stochastic ? uniform(key, static_cast<uint32_t>(i)) : 0.0f;
      return quantize(x[i], scale, kMaxCode<kQuant>, args.stochastic, u);
    };
    if constexpr (kQuant == Quant::kInt8) {
      for (size_t i = 0; i < len; ++i) codes[start + i] = static_cast<uint8_t>(code(i));
    } else {
      // start is even: the block size is a multiple of kBlockAlign.
      uint8_t* c = codes + start / 2;
      for (size_t i = 0; i < len; i += 2) {
        const uint8_t hi = i + 1 < len ? nibble(code(i + 1)) : 0;
        c[i / 2] = static_cast<uint8_t>(nibble(code(i)) | (hi << 4));
      }
    }
  }
}

template <Quant kQuant, SinkFn kSink>
void decodeQuant(const float* scales, const uint8_t* codes, size_t n, uint32_t blockSize,
                 float* dst) {
  for (size_t b = 0, start = 0; start < n; ++b, start += blockSize) {
    const size_t len = std::min<size_t>(blockSize, n - start);
    const float scale = decodeScale(scales[b]);
    float* d = dst + start;
    for (size_t i = 0; i < len; ++i) {
      const size_t e = start + i;
      int32_t q;
      if constexpr (kQuant == Quant::kInt8) {
        q = static_cast<int8_t>(codes[e]);
      } else {
        q = fromNibble(codes[e / 2] >> (4 * (e & 1)));
      }
      d[i] = kSink(d[i], dequantize(q, scale));
    }
  }
}

template <Quant kQuant>
void setQuant(KernelTable& t) {
  const auto q = static_cast<size_t>(kQuant);
  t.encodeQuant[q] = encodeQuant<kQuant>;
  t.decodeQuant[q][static_cast<size_t>(Sink::kStore)] = decodeQuant<kQuant, sinkStore>;
  t.decodeQuant[q][static_cast<size_t>(Sink::kAccumulate)] = decodeQuant<kQuant, sinkAccumulate>;
  t.decodeQuant[q][static_cast<size_t>(Sink::kResidual)] = decodeQuant<kQuant, sinkResidual>;
}

}  // namespace

void fillScalarKernels(KernelTable& t) {
  constexpr auto kStore = static_cast<size_t>(Sink::kStore);
  constexpr auto kAccumulate = static_cast<size_t>(Sink::kAccumulate);
  constexpr auto kResidual = static_cast<size_t>(Sink::kResidual);
  t.encodeFp16 = encodeHalf<toHalf>;
  t.encodeBf16 = encodeHalf<toBf16>;
  t.decodeFp16[kStore] = decodeHalf<fromHalf, sinkStore>;
  t.decodeFp16[kAccumulate] = decodeHalf<fromHalf, sinkAccumulate>;
  t.decodeFp16[kResidual] = decodeHalf<fromHalf, sinkResidual>;
  t.decodeBf16[kStore] = decodeHalf<fromBf16, sinkStore>;
  t.decodeBf16[kAccumulate] = decodeHalf<fromBf16, sinkAccumulate>;
  t.decodeBf16[kResidual] = decodeHalf<fromBf16, sinkResidual>;
  t.decodeF32[kStore] = decodeF32<sinkStore>;
  t.decodeF32[kAccumulate] = decodeF32<sinkAccumulate>;
  t.decodeF32[kResidual] = decodeF32<sinkResidual>;
  setQuant<Quant::kInt8>(t);
  setQuant<Quant::kInt4>(t);
}

}  // namespace nanoccl::codec::internal
