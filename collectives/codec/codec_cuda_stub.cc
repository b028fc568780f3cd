// codec_cuda.h in a build without NANOCCL_WITH_CUDA: every call answers kUnavailable.
#include "collectives/codec/codec_cuda.h"

namespace nanoccl::codec {
namespace {

Status notBuilt() {
  return unavailableError("CUDA codecs: nanoccl was built without CUDA (NANOCCL_WITH_CUDA)");
}

}  // namespace

bool cudaCodecsBuilt() { return false; }

Status encodeCuda(const Codec&, const float*, size_t, const CodecParams&, void*, size_t, void*) {
  return notBuilt();
}
Status decodeCuda(const Codec&, const CodecParams&, const void*, size_t, float*, size_t, void*) {
  return notBuilt();
}
Status decodeAccumulateCuda(const Codec&, const CodecParams&, const void*, size_t, float*, size_t,
                            void*) {
  return notBuilt();
}
Status encodeWithFeedbackCuda(const Codec&, const float*, float*, size_t, const CodecParams&, void*,
                              size_t, void*) {
  return notBuilt();
}

}  // namespace nanoccl::codec
