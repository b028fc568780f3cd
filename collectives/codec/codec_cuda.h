// The codecs (codec.h) on CUDA device buffers: the same streams, decoded values and residuals,
// bit for bit, as the CPU kernels on x86 (both compile codec_math.h; nanoccl_codec_cuda_test
// compares them where a GPU is present).
//
// No CUDA type appears here, so the core's headers need no CUDA: `stream` is a cudaStream_t
// passed as void* (nullptr: the legacy default stream). Builds without NANOCCL_WITH_CUDA link
// stubs that return kUnavailable, so callers need no #if.
//
// Who owns what: the caller owns every buffer; all pointers are device (or managed) pointers,
// `out`/`encoded` 16-byte aligned (cudaMalloc gives 256), and they must stay valid until the
// stream reaches the call. Every call is asynchronous on `stream`: it checks its arguments,
// launches, and returns; kInternal if the launch failed, kUnavailable if there is no usable
// device. A fault inside a kernel surfaces at the caller's next synchronizing CUDA call.
// Any host thread may call; calls on one stream run in order.
//
// The decoders do not read the stream's header, which is in device memory: they take the codec
// and params it was encoded with (the compressed collectives agree on them across ranks; a
// stream from elsewhere can be checked with inspectStream() on a host copy of its first
// kHeaderBytes bytes).
#pragma once

#include <cstddef>

#include "collectives/codec/codec.h"
#include "common/status.h"

namespace nanoccl::codec {

// Whether this build has the CUDA kernels (NANOCCL_WITH_CUDA).
bool cudaCodecsBuilt();

// encode(): `count` float32 elements at `input` -> out[0, codec.encodedBytes(count, params)).
Status encodeCuda(const Codec& codec, const float* input, size_t count, const CodecParams& params,
                  void* out, size_t outBytes, void* stream);
// decode(): out[i] = decoded element i.
Status decodeCuda(const Codec& codec, const CodecParams& params, const void* encoded,
                  size_t bytes, float* out, size_t count, void* stream);
// decodeAccumulate(): dst[i] = dst[i] + decoded element i.
Status decodeAccumulateCuda(const Codec& codec, const CodecParams& params, const void* encoded,
                            size_t bytes, float* dst, size_t count, void* stream);
// encodeWithFeedback() (codec.h), with input, residual and out on the device.
Status encodeWithFeedbackCuda(const Codec& codec, const float* input, float* residual,
                              size_t count, const CodecParams& params, void* out, size_t outBytes,
                              void* stream);

}  // namespace nanoccl::codec
