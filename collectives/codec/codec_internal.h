// The codec kernels' internals, for codec.cc, the tests and the benchmark only.
//
// Like the reduction kernels (common/reduce_internal.h, whose Isa, cpuSupports() and activeIsa()
// the codecs share), each instruction-set variant lives in its own translation unit compiled with
// its own target flags (codec_scalar.cc, codec_avx2.cc, codec_avx512.cc) and fills the entries of
// a KernelTable; codec.cc starts every table from the scalar one. The kernels check nothing:
// codec.cc validates the arguments and lays the stream out; a kernel gets raw regions.
// Calling a variant on a CPU without its features is SIGILL: check cpuSupports().
#pragma once

#include <cstddef>
#include <cstdint>

#include "collectives/codec/codec.h"
#include "common/reduce_internal.h"
#include "common/status.h"

namespace nanoccl::codec::internal {

using reduce_internal::Isa;

// What a decoder does with each decoded value d (codec_math.h sinkStore/...):
// store dst = d; accumulate dst = dst + d; residual dst = dst - d (0 where not finite).
enum class Sink : uint8_t { kStore = 0, kAccumulate, kResidual, kNumSinks };
constexpr size_t kNumSinks = static_cast<size_t>(Sink::kNumSinks);

// int8 or int4.
enum class Quant : uint8_t { kInt8 = 0, kInt4, kNumQuants };
constexpr size_t kNumQuants = static_cast<size_t>(Quant::kNumQuants);

struct QuantArgs {
  uint32_t blockSize;  // a multiple of kBlockAlign
  bool stochastic;
  uint64_t seed;
  uint64_t firstBlock;  // index in the stream of the first block given (the random stream)
};

// n float32 -> n float16/bfloat16 bits.
using EncodeHalfFn = void (*)(const float* in, size_t n, uint16_t* out);
// n float16/bfloat16 bits -> sink into dst[0, n).
using DecodeHalfFn = void (*)(const uint16_t* in, size_t n, float* dst);
// n float32 -> sink into dst[0, n) (the "none" codec).
using DecodeF32Fn = void (*)(const float* in, size_t n, float* dst);
// n elements from a block boundary: ceil(n / blockSize) scales, and n codes (int8: n bytes,
// int4: ceil(n / 2) bytes) starting at codes (int4: element 0 in the low nibble of codes[0]).
using EncodeQuantFn = void (*)(const float* in, size_t n, const QuantArgs& args, float* scales,
                               uint8_t* codes);
using DecodeQuantFn = void (*)(const float* scales, const uint8_t* codes, size_t n,
                               uint32_t blockSize, float* dst);

struct KernelTable {
  EncodeHalfFn encodeFp16 = nullptr;
  EncodeHalfFn encodeBf16 = nullptr;
  DecodeHalfFn decodeFp16[kNumSinks] = {};
  DecodeHalfFn decodeBf16[kNumSinks] = {};
  DecodeF32Fn decodeF32[kNumSinks] = {};
  EncodeQuantFn encodeQuant[kNumQuants] = {};
  DecodeQuantFn decodeQuant[kNumQuants][kNumSinks] = {};
};

// Where each region of a stream lies (codec.h's layout); total is encodedBytes.
struct Layout {
  size_t payloadOffset = kHeaderBytes;  // the scales (int8/int4) or the elements
  size_t payloadBytes = 0;              // unpadded
  size_t codesOffset = 0;               // int8/int4 only
  size_t codesBytes = 0;                // unpadded
  size_t total = 0;
};
// blockSize must be valid for int8/int4 (resolveBlockSize) and count at most 2^58.
Layout layoutOf(CodecId id, uint64_t count, uint32_t blockSize);
void writeHeader(uint8_t* out, CodecId id, bool stochastic, uint32_t blockSize, uint64_t count);
bool isQuant(CodecId id);

// The variant's table; valid whenever reduce_internal::isaCompiled(isa), whatever the CPU.
const KernelTable& codecKernels(Isa isa);
// The variant the public functions use: reduce_internal::activeIsa().
Isa activeIsa();

// The public codecs through a chosen variant (the tests and the benchmark compare variants with
// these; the CPU must support the variant). Same contracts as the Codec row functions; a decode
// with Sink::kResidual is the second half of encodeWithFeedback().
Status encodeWith(Isa isa, const Codec& codec, const void* input, DataType inputType, size_t count,
                  const CodecParams& params, void* out, size_t outBytes);
Status decodeWith(Isa isa, Sink sink, const void* encoded, size_t bytes, float* dst, size_t count);
Status encodeWithFeedbackWith(Isa isa, const Codec& codec, const float* input, float* residual,
                              size_t count, const CodecParams& params, void* out, size_t outBytes);

// Defined by each variant's translation unit: overwrite the entries it implements.
void fillScalarKernels(KernelTable& table);
void fillAvx2Kernels(KernelTable& table);
void fillAvx512Kernels(KernelTable& table);

}  // namespace nanoccl::codec::internal
