// Codecs: lossy (or lossless "none") encodings of float32 buffers for the inter-node bytes of
// compressed collectives. One table row per codec (docs/design.md, convention 3); the compressed
// reduce-scatter calls encode() on what it sends and decodeAccumulate() on what it receives.
//
//   name   encoded element               error (per element, x the input)
//   none   float32, bit for bit          0
//   fp16   IEEE binary16, nearest even   |x| < 65520: half an fp16 ulp of x; larger: +-inf
//   bf16   bfloat16, nearest even        half a bf16 ulp of x (2^-9 relative); past 3.39e38: inf
//   int8   int8 in [-127, 127] x scale   scale/2 (+ float rounding, see below); scale = amax/127
//   int4   int4 in [-7, 7] x scale       scale/2 (+ float rounding); scale = amax/7
// amax is the largest |x| of the element's block (blockSize consecutive elements; the last block
// of a buffer may be shorter). With stochastic rounding the int codes round down or up at random
// with the probabilities that make the expected value x (to 2^-24 of a scale): the error is then
// at most scale * (1 + 2^-16) + 2^-142 instead of about half that, but unbiased.
//
// ---- Encoded stream (little-endian) -------------------------------------------------------
//   [0, 16)            header: u8 codec id, u8 version (1), u16 flags (bit 0: stochastic
//                      rounding), u32 blockSize (0 for none/fp16/bf16), u64 element count
//   none/fp16/bf16     [16, ...) the elements, 4/2/2 bytes each
//   int8/int4          [16, ...) one float32 scale per block; then, at the next multiple of 16,
//                      the codes: int8 one byte each; int4 two per byte, element 2k in the low
//                      nibble and 2k+1 in the high one, both two's complement
// Every region is zero-padded to a multiple of 16 bytes, so
//   encodedBytes = 16 + pad16(4 * nblocks) + pad16(codeBytes)   (int8/int4, nblocks = ceil(n/B))
//   encodedBytes = 16 + pad16(elementBytes * n)                  (none/fp16/bf16)
// and encode() writes every one of those bytes: equal inputs give equal streams, on every ISA
// and on the GPU (codec_cuda.h). The caller owns both buffers. On the CPU the stream must be
// 4-byte aligned (the GPU wants 16); its regions are 16-byte aligned relative to its start, so
// streams laid end to end stay aligned.
// decode() reads the header and checks it against the byte count and the caller's count, so a
// stream cut short or meant for another buffer is an error, not a read past the end.
//
// ---- Documented edge cases (the tests check each) ------------------------------------------
// - Zeros: a block whose amax is 0 (or whose amax/127 underflows to 0) has scale 0 and all
//   codes 0; it decodes to +0. No NaN.
// - NaN and +-inf: fp16/bf16 keep them (NaN stays NaN, inf stays inf; a finite x that rounds
//   past the format's range becomes inf). int8/int4: a NaN or an inf anywhere in a block makes
//   its scale NaN and its codes 0, and the whole block decodes to NaN: never silently finite.
// - NaN bits: decode() and decodeAccumulate() write only the quiet NaN 0x7fc00000 (none's
//   decode() excepted: it is a byte copy), whatever NaN the input or dst held, so results agree
//   bit for bit across ISAs and with the GPU.
// - Subnormals: encoded like any other value; for int8/int4 the bound is then
//   scale * (1/2 + 2^-16) + 2^-142 (the scale itself is a subnormal with few significant bits).
// - Lengths that are not a multiple of the block: the last block is shorter and its scale
//   comes from its own elements only; for int4 with an odd count, the unused nibble is 0.
// - The float rounding term: with scale a normal float, |x - decode(x)| <= scale * (1/2 + 2^-16).
// - Near FLT_MAX: the scale is amax/127 (amax/7) except when 127 * scale (7 * scale) would round
//   to inf; then it is one ulp less, so every block of finite values decodes to finite values.
//
// Stochastic rounding is reproducible: the random numbers are a counter-based hash of
// (seed, block index, position in the block), so the same input, params and seed give the same
// bytes everywhere. Callers vary the seed per step, rank and chunk (the same seed on the same
// data gives the same rounding every time).
//
// All functions are thread-safe and keep no state. They assume the default floating-point
// environment (round to nearest, no flush-to-zero). The CPU kernels (scalar, AVX2, AVX-512) are
// chosen with the reduction kernels' variant (common/reduce.h, NANOCCL_REDUCE_ISA lowers it) and
// give the same bits. encode() of float16/bfloat16 input converts through a stack buffer; it
// allocates only for blocks above 8192 elements. Nothing else allocates.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/dtype.h"
#include "common/status.h"

namespace nanoccl::codec {

// The order is part of the wire format (the header carries the value): append only.
enum class CodecId : uint8_t { kNone = 0, kFp16, kBf16, kInt8, kInt4, kNumCodecs };

constexpr size_t kHeaderBytes = 16;
constexpr uint8_t kStreamVersion = 1;
// Block sizes of the int codecs: multiples of kBlockAlign (the vector kernels' step), at most
// kMaxBlockSize.
constexpr uint32_t kBlockAlign = 32;
constexpr uint32_t kMaxBlockSize = 1u << 20;

struct CodecParams {
  // Elements per scale, for int8/int4; 0 takes the codec's default (Codec::defaultBlockSize).
  // Ignored by none, fp16 and bf16.
  uint32_t blockSize = 0;
  // Round int8/int4 codes up or down at random (unbiased) instead of to nearest.
  bool stochasticRounding = false;
  // The random stream of stochastic rounding (see above); unused without it.
  uint64_t seed = 0;
};

// One codec. Every function checks its arguments and returns kInvalidArgument on bad ones
// (a buffer too small, a count that does not match the stream, a bad block size); a stream whose
// header is malformed or of another codec is kProtocolError (it came from a peer).
struct Codec {
  CodecId id;
  const char* name;         // "none", "fp16", "bf16", "int8", "int4"
  uint32_t defaultBlockSize;  // 256 for int8, 64 for int4, 0 for the others
  // Bytes encode() writes for `count` elements with these params; 0 when the params are invalid
  // (a valid stream is never shorter than kHeaderBytes).
  size_t (*encodedBytes)(size_t count, const CodecParams& params);
  // Encodes `count` elements of `input` (float32; float16 and bfloat16 are converted exactly to
  // float32 first) into out[0, encodedBytes). outBytes may be larger: the rest is untouched.
  Status (*encode)(const void* input, DataType inputType, size_t count, const CodecParams& params,
                   void* out, size_t outBytes);
  // out[i] = decoded element i, for the `count` elements of the stream in encoded[0, bytes).
  // `bytes` may exceed the stream's size (a fixed-size slot): the rest is ignored.
  Status (*decode)(const void* encoded, size_t bytes, float* out, size_t count);
  // dst[i] = dst[i] + decoded element i (float32 sum; NaN results as documented above).
  Status (*decodeAccumulate)(const void* encoded, size_t bytes, float* dst, size_t count);
};

// The table, in CodecId order, kNumCodecs rows.
const Codec* codecTable();
const Codec& codecById(CodecId id);
// Looks a codec up by name (case-insensitive); kInvalidArgument names the known ones.
Result<const Codec*> findCodec(std::string_view name);
// "none, fp16, bf16, int8, int4"
std::string knownCodecNames();

// The block size params give for this codec (its default when 0), or kInvalidArgument.
Result<uint32_t> resolveBlockSize(const Codec& codec, const CodecParams& params);

// What a stream's header says, checked against its byte count (kProtocolError when it does not
// hold together: unknown codec or version, bad block size, shorter than it claims).
struct StreamInfo {
  CodecId codec;
  uint32_t blockSize;  // 0 for none/fp16/bf16
  bool stochasticRounding;
  uint64_t count;
  size_t bytes;        // the stream's encodedBytes
};
Result<StreamInfo> inspectStream(const void* encoded, size_t bytes);

// Error feedback (EF-SGD), one step on one bucket:
//   x = input + residual;  out = encode(x);  residual = x - decode(out)
// so that, summed over steps, decoded == inputs + initial residual - final residual (up to the
// float rounding of x). The caller owns the residual (zero it before the first step). Where
// x - decode(out) is not finite (a block with NaN or inf), the residual is set to 0: one bad step
// does not poison every later one. For "none" the residual stays 0.
Status encodeWithFeedback(const Codec& codec, const float* input, float* residual, size_t count,
                          const CodecParams& params, void* out, size_t outBytes);

}  // namespace nanoccl::codec
