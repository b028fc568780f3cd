// The CUDA codec kernels (codec_cuda.h). Per element they run codec_math.h, the code the scalar
// CPU kernels run, compiled with -fmad=false -prec-div=true -ftz=false (collectives/codec/
// CMakeLists.txt) so every float operation is the same IEEE operation as on the CPU and the
// streams and decoded values are the same bits.
//
// Shapes: the int8/int4 encoders give one warp to one block of the stream (amax by warp
// shuffles, then each lane codes every 32nd element); the int decoders do the same, so a block's
// scale is read once per warp; the 16-bit and none kernels are element-wise grid-stride loops.
// Thread 0 of CTA 0 of each encoder also writes the header and the zero padding, so an encode is
// one launch.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "collectives/codec/codec_cuda.h"
#include "collectives/codec/codec_internal.h"
#include "collectives/codec/codec_math.h"

namespace nanoccl::codec {
namespace {

using internal::Layout;
using internal::Sink;

constexpr int kThreads = 256;
constexpr int kWarp = 32;
constexpr size_t kMaxCtas = 1 << 16;  // grid-stride loops cover the rest

// What the encoders write besides the payload: the header, and two zero-padding runs.
struct Frame {
  uint8_t header[kHeaderBytes];
  uint64_t pad1Offset, pad2Offset;  // each run is under 16 bytes
  uint32_t pad1Bytes, pad2Bytes;
};

__device__ void writeFrame(uint8_t* out, const Frame& f) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  for (size_t i = 0; i < kHeaderBytes; ++i) out[i] = f.header[i];
  for (uint32_t i = 0; i < f.pad1Bytes; ++i) out[f.pad1Offset + i] = 0;
  for (uint32_t i = 0; i < f.pad2Bytes; ++i) out[f.pad2Offset + i] = 0;
}

enum Format : int { kNone = 0, kFp16, kBf16, kInt8, kInt4 };

template <int kSink>
__device__ float sink(const float* dst, float d) {
  if constexpr (kSink == static_cast<int>(Sink::kStore)) {
    return math::sinkStore(0.0f, d);
  } else if constexpr (kSink == static_cast<int>(Sink::kAccumulate)) {
    return math::sinkAccumulate(*dst, d);
  } else {
    return math::sinkResidual(*dst, d);
  }
}

// ---- none / fp16 / bf16 ---------------------------------------------------------------------

template <int kFormat>
__global__ void encodeElementsKernel(const float* in, size_t n, uint8_t* out, Frame frame) {
  writeFrame(out, frame);
  uint8_t* payload = out + kHeaderBytes;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    if constexpr (kFormat == kNone) {
      // Copied as bits: the lossless codec keeps NaN payloads.
      reinterpret_cast<uint32_t*>(payload)[i] = reinterpret_cast<const uint32_t*>(in)[i];
    } else if constexpr (kFormat == kFp16) {
      reinterpret_cast<uint16_t*>(payload)[i] = math::toHalf(in[i]);
    } else {
      reinterpret_cast<uint16_t*>(payload)[i] = math::toBf16(in[i]);
    }
  }
}

template <int kFormat, int kSink>
__global__ void decodeElementsKernel(const uint8_t* in, size_t n, float* dst) {
  const uint8_t* payload = in + kHeaderBytes;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    float d;
    if constexpr (kFormat == kNone) {
      d = math::bitsFloat(reinterpret_cast<const uint32_t*>(payload)[i]);
    } else if constexpr (kFormat == kFp16) {
      d = math::fromHalf(reinterpret_cast<const uint16_t*>(payload)[i]);
    } else {
      d = math::fromBf16(reinterpret_cast<const uint16_t*>(payload)[i]);
    }
    dst[i] = sink<kSink>(dst + i, d);
  }
}

// ---- int8 / int4 ----------------------------------------------------------------------------

template <int kFormat>
__global__ void encodeQuantKernel(const float* in, size_t n, uint32_t blockSize, bool stochastic,
                                  uint64_t seed, uint8_t* out, size_t codesOffset, Frame frame) {
  writeFrame(out, frame);
  constexpr float kMax = kFormat == kInt8 ? 127.0f : 7.0f;
  float* scales = reinterpret_cast<float*>(out + kHeaderBytes);
  uint8_t* codes = out + codesOffset;
  const unsigned lane = threadIdx.x % kWarp;
  const size_t nblocks = (n + blockSize - 1) / blockSize;
  const size_t warps = static_cast<size_t>(gridDim.x) * blockDim.x / kWarp;
  for (size_t b = (blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x) / kWarp;
       b < nblocks; b += warps) {
    const size_t start = b * blockSize;
    const uint32_t len = static_cast<uint32_t>(n - start < blockSize ? n - start : blockSize);
    const float* x = in + start;
    uint32_t amax = 0;
    for (uint32_t i = lane; i < len; i += kWarp) {
      amax = max(amax, math::floatBits(x[i]) & math::kAbsMask);
    }
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
      amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
    }
    const float scale = math::blockScale(amax, kMax);
    if (lane == 0) scales[b] = scale;
    const bool quantizes = math::scaleQuantizes(scale);
    const uint32_t key = stochastic ? math::blockKey(seed, b) : 0;
    auto code = [&](uint32_t i) -> int32_t {
      if (!quantizes) return 0;
      const float u = stochastic ? math::uniform(key, i) : 0.0f;
      return math::quantize(x[i], scale, kMax, stochastic, u);
    };
    if constexpr (kFormat == kInt8) {
      for (uint32_t i = lane; i < len; i += kWarp) codes[start + i] = static_cast<uint8_t>(code(i));
    } else {
      uint8_t* c = codes + start / 2;
      for (uint32_t p = lane; 2 * p < len; p += kWarp) {
        const uint8_t hi = 2 * p + 1 < len ? math::nibble(code(2 * p + 1)) : 0;
        c[p] = static_cast<uint8_t>(math::nibble(code(2 * p)) | (hi << 4));
      }
    }
  }
}

template <int kFormat, int kSink>
__global__ void decodeQuantKernel(const uint8_t* in, size_t n, uint32_t blockSize,
                                  size_t codesOffset, float* dst) {
  const float* scales = reinterpret_cast<const float*>(in + kHeaderBytes);
  const uint8_t* codes = in + codesOffset;
  const unsigned lane = threadIdx.x % kWarp;
  const size_t nblocks = (n + blockSize - 1) / blockSize;
  const size_t warps = static_cast<size_t>(gridDim.x) * blockDim.x / kWarp;
  for (size_t b = (blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x) / kWarp;
       b < nblocks; b += warps) {
    const size_t start = b * blockSize;
    const uint32_t len = static_cast<uint32_t>(n - start < blockSize ? n - start : blockSize);
    const float scale = math::decodeScale(scales[b]);
    float* d = dst + start;
    for (uint32_t i = lane; i < len; i += kWarp) {
      const size_t e = start + i;
      int32_t q;
      if constexpr (kFormat == kInt8) {
        q = static_cast<int8_t>(codes[e]);
      } else {
        q = math::fromNibble(codes[e / 2] >> (4 * (e & 1)));
      }
      d[i] = sink<kSink>(d + i, math::dequantize(q, scale));
    }
  }
}

// ---- Error feedback's first step --------------------------------------------------------------

// residual = input + residual with the CPU's NaN bits (common/reduce_scalar.cc addFloat on x86:
// a NaN in the first operand wins, quieted; else a NaN in the second, quieted; inf - inf gives
// the x86 default NaN 0xffc00000), so fp16/bf16/none streams encode the CPU's x bit for bit.
__global__ void addIntoKernel(const float* input, float* residual, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float a = input[i], b = residual[i];
    float r = a + b;
    if (math::isNan(a)) {
      r = math::bitsFloat(math::floatBits(a) | 0x00400000u);
    } else if (math::isNan(b)) {
      r = math::bitsFloat(math::floatBits(b) | 0x00400000u);
    } else if (math::isNan(r)) {
      r = math::bitsFloat(0xffc00000u);
    }
    residual[i] = r;
  }
}

// ---- Host side ------------------------------------------------------------------------------

unsigned ctasFor(size_t threads) {
  const size_t ctas = (threads + kThreads - 1) / kThreads;
  return static_cast<unsigned>(ctas == 0 ? 1 : (ctas < kMaxCtas ? ctas : kMaxCtas));
}

Status launched(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return Status::ok();
  const std::string message = std::string(what) + ": " + cudaGetErrorName(e) + ": " +
                              cudaGetErrorString(e);
  if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) {
    return unavailableError(message);
  }
  return internalError(message);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The checks every call makes; returns the stream's layout in *layout and block size in *block.
Status checkCall(const std::string& what, const Codec& codec, const CodecParams& params,
                 const void* elements, const void* encoded, size_t encodedBytes, size_t count,
                 Layout* layout, uint32_t* block) {
  if (static_cast<size_t>(codec.id) >= static_cast<size_t>(CodecId::kNumCodecs)) {
    return invalidArgument(what + ": invalid codec");
  }
  const Result<uint32_t> b = resolveBlockSize(codec, params);
  if (!b.isOk()) return b.status().withContext(what + ": ");
  *block = b.value();
  if (codec.encodedBytes(count, params) == 0) {
    return invalidArgument(what + ": " + std::to_string(count) + " elements is too many");
  }
  *layout = internal::layoutOf(codec.id, count, *block);
  if ((count > 0 && elements == nullptr) || encoded == nullptr) {
    return invalidArgument(what + ": null buffer");
  }
  if (!aligned16(encoded)) return invalidArgument(what + ": the stream is not 16-byte aligned");
  if (encodedBytes < layout->total) {
    return invalidArgument(what + ": the stream buffer holds " + std::to_string(encodedBytes) +
                           " bytes, " + std::to_string(count) + " elements need " +
                           std::to_string(layout->total));
  }
  return Status::ok();
}

Frame frameOf(const Codec& codec, const CodecParams& params, uint32_t block, size_t count,
              const Layout& l) {
  Frame f{};
  const bool stochastic = internal::isQuant(codec.id) && params.stochasticRounding;
  internal::writeHeader(f.header, codec.id, stochastic, block, count);
  const size_t payloadEnd = l.payloadOffset + l.payloadBytes;
  f.pad1Offset = payloadEnd;
  if (internal::isQuant(codec.id)) {
    f.pad1Bytes = static_cast<uint32_t>(l.codesOffset - payloadEnd);
    f.pad2Offset = l.codesOffset + l.codesBytes;
    f.pad2Bytes = static_cast<uint32_t>(l.total - f.pad2Offset);
  } else {
    f.pad1Bytes = static_cast<uint32_t>(l.total - payloadEnd);
  }
  return f;
}

template <int kSink>
Status decodeAny(const char* name, const Codec& codec, const CodecParams& params,
                 const void* encoded, size_t bytes, float* dst, size_t count, void* stream) {
  const std::string what = std::string(name) + "(" + codec.name + ")";
  Layout l;
  uint32_t block = 0;
  NANOCCL_CHECK(checkCall(what, codec, params, dst, encoded, bytes, count, &l, &block));
  if (count == 0) return Status::ok();
  auto s = static_cast<cudaStream_t>(stream);
  const auto* in = static_cast<const uint8_t*>(encoded);
  switch (codec.id) {
    case CodecId::kNone:
      if constexpr (kSink == static_cast<int>(Sink::kStore)) {
        const cudaError_t e = cudaMemcpyAsync(dst, in + kHeaderBytes, 4 * count,
                                              cudaMemcpyDeviceToDevice, s);
        if (e != cudaSuccess) (void)cudaGetLastError();
        return e == cudaSuccess ? Status::ok()
                                : internalError(what + ": " + cudaGetErrorString(e));
      } else {
        decodeElementsKernel<kNone, kSink><<<ctasFor(count), kThreads, 0, s>>>(in, count, dst);
      }
      break;
    case CodecId::kFp16:
      decodeElementsKernel<kFp16, kSink><<<ctasFor(count), kThreads, 0, s>>>(in, count, dst);
      break;
    case CodecId::kBf16:
      decodeElementsKernel<kBf16, kSink><<<ctasFor(count), kThreads, 0, s>>>(in, count, dst);
      break;
    case CodecId::kInt8:
    case CodecId::kInt4: {
      const size_t warps = (count + block - 1) / block;
      if (codec.id == CodecId::kInt8) {
        decodeQuantKernel<kInt8, kSink>
            <<<ctasFor(warps * kWarp), kThreads, 0, s>>>(in, count, block, l.codesOffset, dst);
      } else {
        decodeQuantKernel<kInt4, kSink>
            <<<ctasFor(warps * kWarp), kThreads, 0, s>>>(in, count, block, l.codesOffset, dst);
      }
      break;
    }
    default:
      return invalidArgument(what + ": invalid codec");
  }
  return launched(what.c_str());
}

}  // namespace

bool cudaCodecsBuilt() { return true; }

Status encodeCuda(const Codec& codec, const float* input, size_t count, const CodecParams& params,
                  void* out, size_t outBytes, void* stream) {
  const std::string what = std::string("encodeCuda(") + codec.name + ")";
  Layout l;
  uint32_t block = 0;
  NANOCCL_CHECK(checkCall(what, codec, params, input, out, outBytes, count, &l, &block));
  auto s = static_cast<cudaStream_t>(stream);
  auto* o = static_cast<uint8_t*>(out);
  const Frame f = frameOf(codec, params, block, count, l);
  switch (codec.id) {
    case CodecId::kNone:
    case CodecId::kFp16:
    case CodecId::kBf16:
      if (codec.id == CodecId::kNone) {
        encodeElementsKernel<kNone><<<ctasFor(count), kThreads, 0, s>>>(input, count, o, f);
      } else if (codec.id == CodecId::kFp16) {
        encodeElementsKernel<kFp16><<<ctasFor(count), kThreads, 0, s>>>(input, count, o, f);
      } else {
        encodeElementsKernel<kBf16><<<ctasFor(count), kThreads, 0, s>>>(input, count, o, f);
      }
      break;
    case CodecId::kInt8:
    case CodecId::kInt4: {
      const size_t warps = (count + block - 1) / block;
      const bool stochastic = params.stochasticRounding;
      if (codec.id == CodecId::kInt8) {
        encodeQuantKernel<kInt8><<<ctasFor(warps * kWarp), kThreads, 0, s>>>(
            input, count, block, stochastic, params.seed, o, l.codesOffset, f);
      } else {
        encodeQuantKernel<kInt4><<<ctasFor(warps * kWarp), kThreads, 0, s>>>(
            input, count, block, stochastic, params.seed, o, l.codesOffset, f);
      }
      break;
    }
    default:
      return invalidArgument(what + ": invalid codec");
  }
  return launched(what.c_str());
}

Status decodeCuda(const Codec& codec, const CodecParams& params, const void* encoded,
                  size_t bytes, float* out, size_t count, void* stream) {
  return decodeAny<static_cast<int>(Sink::kStore)>("decodeCuda", codec, params, encoded, bytes,
                                                    out, count, stream);
}

Status decodeAccumulateCuda(const Codec& codec, const CodecParams& params, const void* encoded,
                            size_t bytes, float* dst, size_t count, void* stream) {
  return decodeAny<static_cast<int>(Sink::kAccumulate)>("decodeAccumulateCuda", codec, params,
                                                         encoded, bytes, dst, count, stream);
}

Status encodeWithFeedbackCuda(const Codec& codec, const float* input, float* residual,
                              size_t count, const CodecParams& params, void* out, size_t outBytes,
                              void* stream) {
  const std::string what = std::string("encodeWithFeedbackCuda(") + codec.name + ")";
  Layout l;
  uint32_t block = 0;
  // Every check before the residual changes.
  NANOCCL_CHECK(checkCall(what, codec, params, input, out, outBytes, count, &l, &block));
  if (count > 0 && residual == nullptr) return invalidArgument(what + ": null residual");
  if (count == 0) return encodeCuda(codec, input, count, params, out, outBytes, stream);
  auto s = static_cast<cudaStream_t>(stream);
  addIntoKernel<<<ctasFor(count), kThreads, 0, s>>>(input, residual, count);
  NANOCCL_CHECK(launched(what.c_str()));
  NANOCCL_CHECK(encodeCuda(codec, residual, count, params, out, outBytes, stream));
  return decodeAny<static_cast<int>(Sink::kResidual)>("encodeWithFeedbackCuda", codec, params,
                                                       out, outBytes, residual, count, stream);
}

}  // namespace nanoccl::codec
