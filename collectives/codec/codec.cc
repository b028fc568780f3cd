// The codec table, the stream layout (header, regions, padding) and the argument checks; the
// kernels it calls are in codec_scalar.cc and codec_simd.inc (codec_internal.h).
#include "collectives/codec/codec.h"

#include <strings.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "collectives/codec/codec_internal.h"
#include "common/op.h"
#include "common/reduce.h"

namespace nanoccl::codec {
namespace internal {
namespace {

constexpr size_t kNumIsas = static_cast<size_t>(Isa::kNumIsas);
// Beyond this many elements the byte counts could overflow size_t.
constexpr uint64_t kMaxCount = uint64_t{1} << 58;
// float16/bfloat16 input is widened through a stack buffer of this many floats (32 KiB).
constexpr size_t kWidenChunk = 8192;

struct Tables {
  KernelTable byIsa[kNumIsas];
};

const Tables& tables() {
  static const Tables all = [] {
    Tables x{};
    KernelTable& scalar = x.byIsa[static_cast<size_t>(Isa::kScalar)];
    fillScalarKernels(scalar);
#if NANOCCL_CODEC_X86
    x.byIsa[static_cast<size_t>(Isa::kAvx2)] = scalar;
    fillAvx2Kernels(x.byIsa[static_cast<size_t>(Isa::kAvx2)]);
    x.byIsa[static_cast<size_t>(Isa::kAvx512)] = scalar;
    fillAvx512Kernels(x.byIsa[static_cast<size_t>(Isa::kAvx512)]);
#endif
    return x;
  }();
  return all;
}

size_t pad16(size_t x) { return (x + 15) & ~size_t{15}; }

// The kernels read and write the scales and 16-bit elements as typed values.
bool aligned4(const void* p) { return reinterpret_cast<uintptr_t>(p) % 4 == 0; }

Quant quantOf(CodecId id) { return id == CodecId::kInt8 ? Quant::kInt8 : Quant::kInt4; }

size_t elementBytes(CodecId id) {
  switch (id) {
    case CodecId::kNone: return 4;
    case CodecId::kFp16:
    case CodecId::kBf16: return 2;
    default: return 0;
  }
}

}  // namespace

bool isQuant(CodecId id) { return id == CodecId::kInt8 || id == CodecId::kInt4; }

Layout layoutOf(CodecId id, uint64_t count, uint32_t blockSize) {
  Layout l;
  if (isQuant(id)) {
    const uint64_t nblocks = (count + blockSize - 1) / blockSize;
    l.payloadBytes = 4 * nblocks;
    l.codesOffset = kHeaderBytes + pad16(l.payloadBytes);
    l.codesBytes = id == CodecId::kInt8 ? count : (count + 1) / 2;
    l.total = l.codesOffset + pad16(l.codesBytes);
  } else {
    l.payloadBytes = elementBytes(id) * count;
    l.total = kHeaderBytes + pad16(l.payloadBytes);
  }
  return l;
}

void writeHeader(uint8_t* out, CodecId id, bool stochastic, uint32_t blockSize, uint64_t count) {
  const uint16_t flags = stochastic ? 1 : 0;
  out[0] = static_cast<uint8_t>(id);
  out[1] = kStreamVersion;
  std::memcpy(out + 2, &flags, 2);
  std::memcpy(out + 4, &blockSize, 4);
  std::memcpy(out + 8, &count, 8);
}

namespace {

Status checkBlockSize(const char* codecName, uint32_t blockSize) {
  if (blockSize == 0 || blockSize % kBlockAlign != 0 || blockSize > kMaxBlockSize) {
    return invalidArgument(std::string("codec ") + codecName + ": block size " +
                           std::to_string(blockSize) + " is not a multiple of " +
                           std::to_string(kBlockAlign) + " in [" + std::to_string(kBlockAlign) +
                           ", " + std::to_string(kMaxBlockSize) + "]");
  }
  return Status::ok();
}

// Encodes elements [first, first + n) of the stream from float32 `in`; first is a multiple of the
// block size for the quant codecs.
void encodeRange(const KernelTable& k, CodecId id, const float* in, size_t first, size_t n,
                 const QuantArgs& args, const Layout& l, uint8_t* out) {
  switch (id) {
    case CodecId::kNone:
      std::memcpy(out + l.payloadOffset + 4 * first, in, 4 * n);
      break;
    case CodecId::kFp16:
      k.encodeFp16(in, n, reinterpret_cast<uint16_t*>(out + l.payloadOffset) + first);
      break;
    case CodecId::kBf16:
      k.encodeBf16(in, n, reinterpret_cast<uint16_t*>(out + l.payloadOffset) + first);
      break;
    case CodecId::kInt8:
    case CodecId::kInt4: {
      const uint64_t firstBlock = first / args.blockSize;
      QuantArgs a = args;
      a.firstBlock = firstBlock;
      const size_t codeOffset = id == CodecId::kInt8 ? first : first / 2;
      k.encodeQuant[static_cast<size_t>(quantOf(id))](
          in, n, a, reinterpret_cast<float*>(out + l.payloadOffset) + firstBlock,
          out + l.codesOffset + codeOffset);
      break;
    }
    default:
      break;
  }
}

void widen(const uint16_t* in, size_t n, DataType t, float* out) {
  if (t == DataType::kFloat16) {
    for (size_t i = 0; i < n; ++i) out[i] = halfToFloat(in[i]);
  } else {
    for (size_t i = 0; i < n; ++i) out[i] = bfloat16ToFloat(in[i]);
  }
}

}  // namespace

const KernelTable& codecKernels(Isa isa) {
  const size_t i = static_cast<size_t>(isa);
  return tables().byIsa[reduce_internal::isaCompiled(isa) ? i : 0];
}

Isa activeIsa() { return reduce_internal::activeIsa(); }

Status encodeWith(Isa isa, const Codec& codec, const void* input, DataType inputType, size_t count,
                  const CodecParams& params, void* out, size_t outBytes) {
  if (!reduce_internal::isaCompiled(isa)) {
    return unavailableError(std::string("codec: ") + reduce_internal::isaName(isa) +
                            " kernels not built");
  }
  const std::string what = std::string("encode(") + codec.name + "): ";
  if (inputType != DataType::kFloat32 && inputType != DataType::kFloat16 &&
      inputType != DataType::kBFloat16) {
    return invalidArgument(what + "input must be float32, float16 or bfloat16, not " +
                           dataTypeName(inputType));
  }
  if (count > kMaxCount) {
    return invalidArgument(what + std::to_string(count) + " elements is too many");
  }
  uint32_t blockSize = 0;
  if (isQuant(codec.id)) {
    NANOCCL_ASSIGN_OR_RETURN(blockSize, resolveBlockSize(codec, params));
  }
  const Layout l = layoutOf(codec.id, count, blockSize);
  if ((count > 0 && input == nullptr) || out == nullptr) {
    return invalidArgument(what + "null buffer");
  }
  if (outBytes < l.total) {
    return invalidArgument(what + "output holds " + std::to_string(outBytes) + " bytes, " +
                           std::to_string(count) + " elements need " + std::to_string(l.total));
  }
  if (!aligned4(out)) return invalidArgument(what + "the output is not 4-byte aligned");
  auto* o = static_cast<uint8_t*>(out);
  const bool stochastic = isQuant(codec.id) && params.stochasticRounding;
  writeHeader(o, codec.id, stochastic, blockSize, count);
  // The padding, so that every byte of the stream is defined.
  const size_t payloadEnd = l.payloadOffset + l.payloadBytes;
  if (isQuant(codec.id)) {
    std::memset(o + payloadEnd, 0, l.codesOffset - payloadEnd);
    std::memset(o + l.codesOffset + l.codesBytes, 0, l.total - l.codesOffset - l.codesBytes);
  } else {
    std::memset(o + payloadEnd, 0, l.total - payloadEnd);
  }
  if (count == 0) return Status::ok();

  const KernelTable& k = codecKernels(isa);
  const QuantArgs args{blockSize, stochastic, params.seed, 0};
  if (inputType == DataType::kFloat32) {
    encodeRange(k, codec.id, static_cast<const float*>(input), 0, count, args, l, o);
    return Status::ok();
  }
  // 16-bit input: widen a whole number of blocks at a time.
  size_t chunk = kWidenChunk;
  std::vector<float> large;
  if (isQuant(codec.id)) {
    chunk = blockSize <= kWidenChunk ? kWidenChunk / blockSize * blockSize : blockSize;
  }
  float stack[kWidenChunk];
  float* buf = stack;
  if (chunk > kWidenChunk) {
    large.resize(chunk);
    buf = large.data();
  }
  const auto* in = static_cast<const uint16_t*>(input);
  for (size_t first = 0; first < count; first += chunk) {
    const size_t n = std::min(chunk, count - first);
    widen(in + first, n, inputType, buf);
    encodeRange(k, codec.id, buf, first, n, args, l, o);
  }
  return Status::ok();
}

Status decodeWith(Isa isa, Sink sink, const void* encoded, size_t bytes, float* dst,
                  size_t count) {
  if (!reduce_internal::isaCompiled(isa)) {
    return unavailableError(std::string("codec: ") + reduce_internal::isaName(isa) +
                            " kernels not built");
  }
  NANOCCL_ASSIGN_OR_RETURN(const StreamInfo info, inspectStream(encoded, bytes));
  const char* name = codecTable()[static_cast<size_t>(info.codec)].name;
  if (info.count != count) {
    return invalidArgument(std::string("decode(") + name + "): the stream holds " +
                           std::to_string(info.count) + " elements, the caller asked for " +
                           std::to_string(count));
  }
  if (count > 0 && dst == nullptr) {
    return invalidArgument(std::string("decode(") + name + "): null output");
  }
  if (!aligned4(encoded)) {
    return invalidArgument(std::string("decode(") + name + "): the stream is not 4-byte aligned");
  }
  if (count == 0) return Status::ok();
  const auto* in = static_cast<const uint8_t*>(encoded);
  const Layout l = layoutOf(info.codec, count, info.blockSize);
  const KernelTable& k = codecKernels(isa);
  const size_t s = static_cast<size_t>(sink);
  switch (info.codec) {
    case CodecId::kNone:
      // A byte copy: the lossless codec keeps every bit, NaN payloads included.
      if (sink == Sink::kStore) {
        std::memcpy(dst, in + l.payloadOffset, 4 * count);
      } else {
        k.decodeF32[s](reinterpret_cast<const float*>(in + l.payloadOffset), count, dst);
      }
      break;
    case CodecId::kFp16:
      k.decodeFp16[s](reinterpret_cast<const uint16_t*>(in + l.payloadOffset), count, dst);
      break;
    case CodecId::kBf16:
      k.decodeBf16[s](reinterpret_cast<const uint16_t*>(in + l.payloadOffset), count, dst);
      break;
    case CodecId::kInt8:
    case CodecId::kInt4:
      k.decodeQuant[static_cast<size_t>(quantOf(info.codec))][s](
          reinterpret_cast<const float*>(in + l.payloadOffset), in + l.codesOffset, count,
          info.blockSize, dst);
      break;
    default:
      return internalError("decode: unhandled codec");
  }
  return Status::ok();
}

Status encodeWithFeedbackWith(Isa isa, const Codec& codec, const float* input, float* residual,
                              size_t count, const CodecParams& params, void* out,
                              size_t outBytes) {
  const std::string what = std::string("encodeWithFeedback(") + codec.name + "): ";
  if (count > 0 && (input == nullptr || residual == nullptr)) {
    return invalidArgument(what + "null buffer");
  }
  // Check everything encode() would before the residual changes.
  if (count > kMaxCount) {
    return invalidArgument(what + std::to_string(count) + " elements is too many");
  }
  const Result<uint32_t> blockSize = resolveBlockSize(codec, params);
  if (!blockSize.isOk()) return blockSize.status().withContext(what);
  const size_t need = layoutOf(codec.id, count, blockSize.value()).total;
  if (out == nullptr || outBytes < need) {
    return invalidArgument(what + "output holds " + std::to_string(outBytes) + " bytes, " +
                           std::to_string(count) + " elements need " + std::to_string(need));
  }
  // x = input + residual, in place in residual (the reduction kernels: same bits on every ISA).
  NANOCCL_CHECK(reduce_internal::reduceWith(isa, residual, input, residual, count,
                                            DataType::kFloat32, ReduceOp::kSum));
  NANOCCL_CHECK(encodeWith(isa, codec, residual, DataType::kFloat32, count, params, out, outBytes));
  return decodeWith(isa, Sink::kResidual, out, outBytes, residual, count);
}

}  // namespace internal

namespace {

using internal::isQuant;

template <CodecId kId>
size_t encodedBytesOf(size_t count, const CodecParams& params) {
  if (count > internal::kMaxCount) return 0;
  uint32_t blockSize = 0;
  if (isQuant(kId)) {
    const Codec& c = codecById(kId);
    blockSize = params.blockSize == 0 ? c.defaultBlockSize : params.blockSize;
    if (!internal::checkBlockSize(c.name, blockSize).isOk()) return 0;
  }
  return internal::layoutOf(kId, count, blockSize).total;
}

template <CodecId kId>
Status encodeOf(const void* input, DataType inputType, size_t count, const CodecParams& params,
                void* out, size_t outBytes) {
  return internal::encodeWith(internal::activeIsa(), codecById(kId), input, inputType, count,
                              params, out, outBytes);
}

template <CodecId kId>
Status checkStreamCodec(const void* encoded, size_t bytes) {
  if (encoded != nullptr && bytes >= kHeaderBytes) {
    const uint8_t id = *static_cast<const uint8_t*>(encoded);
    if (id != static_cast<uint8_t>(kId)) {
      const std::string got = id < static_cast<uint8_t>(CodecId::kNumCodecs)
                                  ? codecTable()[id].name
                                  : "unknown codec " + std::to_string(id);
      return protocolError(std::string("decode(") + codecById(kId).name +
                           "): the stream was encoded by " + got);
    }
  }
  return Status::ok();
}

template <CodecId kId>
Status decodeOf(const void* encoded, size_t bytes, float* out, size_t count) {
  NANOCCL_CHECK(checkStreamCodec<kId>(encoded, bytes));
  return internal::decodeWith(internal::activeIsa(), internal::Sink::kStore, encoded, bytes, out,
                              count);
}

template <CodecId kId>
Status decodeAccumulateOf(const void* encoded, size_t bytes, float* dst, size_t count) {
  NANOCCL_CHECK(checkStreamCodec<kId>(encoded, bytes));
  return internal::decodeWith(internal::activeIsa(), internal::Sink::kAccumulate, encoded, bytes,
                              dst, count);
}

template <CodecId kId>
constexpr Codec row(const char* name, uint32_t defaultBlockSize) {
  return Codec{kId,
               name,
               defaultBlockSize,
               encodedBytesOf<kId>,
               encodeOf<kId>,
               decodeOf<kId>,
               decodeAccumulateOf<kId>};
}

// The names are the wire ids' (common/op.h: frames and NANOCCL_COMPRESSION use them).
constexpr const char* nameOf(CodecId id) { return kCodecNames[static_cast<size_t>(id)]; }
constexpr Codec kCodecs[] = {
    row<CodecId::kNone>(nameOf(CodecId::kNone), 0),
    row<CodecId::kFp16>(nameOf(CodecId::kFp16), 0),
    row<CodecId::kBf16>(nameOf(CodecId::kBf16), 0),
    row<CodecId::kInt8>(nameOf(CodecId::kInt8), 256),
    row<CodecId::kInt4>(nameOf(CodecId::kInt4), 64),
};
static_assert(std::size(kCodecs) == static_cast<size_t>(CodecId::kNumCodecs));
static_assert(kNumCodecNames == static_cast<size_t>(CodecId::kNumCodecs));

}  // namespace

const Codec* codecTable() { return kCodecs; }

const Codec& codecById(CodecId id) {
  const auto i = static_cast<size_t>(id);
  return kCodecs[i < std::size(kCodecs) ? i : 0];
}

std::string knownCodecNames() {
  std::string s;
  for (const Codec& c : kCodecs) {
    if (!s.empty()) s += ", ";
    s += c.name;
  }
  return s;
}

Result<const Codec*> findCodec(std::string_view name) {
  for (const Codec& c : kCodecs) {
    if (name.size() == std::strlen(c.name) &&
        strncasecmp(name.data(), c.name, name.size()) == 0) {
      return &c;
    }
  }
  return invalidArgument("unknown codec \"" + std::string(name) +
                         "\"; known: " + knownCodecNames());
}

Result<uint32_t> resolveBlockSize(const Codec& codec, const CodecParams& params) {
  if (!isQuant(codec.id)) return uint32_t{0};
  const uint32_t b = params.blockSize == 0 ? codec.defaultBlockSize : params.blockSize;
  NANOCCL_CHECK(internal::checkBlockSize(codec.name, b));
  return b;
}

Result<StreamInfo> inspectStream(const void* encoded, size_t bytes) {
  if (encoded == nullptr || bytes < kHeaderBytes) {
    return protocolError("codec stream: " + std::to_string(bytes) +
                         " bytes, shorter than its header (" + std::to_string(kHeaderBytes) + ")");
  }
  const auto* p = static_cast<const uint8_t*>(encoded);
  StreamInfo info{};
  uint16_t flags;
  std::memcpy(&flags, p + 2, 2);
  std::memcpy(&info.blockSize, p + 4, 4);
  std::memcpy(&info.count, p + 8, 8);
  if (p[0] >= static_cast<uint8_t>(CodecId::kNumCodecs)) {
    return protocolError("codec stream: unknown codec id " + std::to_string(p[0]) +
                         " (known: " + knownCodecNames() + ")");
  }
  info.codec = static_cast<CodecId>(p[0]);
  const Codec& c = codecById(info.codec);
  if (p[1] != kStreamVersion) {
    return protocolError(std::string("codec stream (") + c.name + "): version " +
                         std::to_string(p[1]) + ", expected " + std::to_string(kStreamVersion));
  }
  if ((flags & ~uint16_t{1}) != 0 || ((flags & 1) != 0 && !isQuant(info.codec))) {
    return protocolError(std::string("codec stream (") + c.name + "): bad flags " +
                         std::to_string(flags));
  }
  info.stochasticRounding = (flags & 1) != 0;
  if (isQuant(info.codec)) {
    if (!internal::checkBlockSize(c.name, info.blockSize).isOk()) {
      return protocolError(std::string("codec stream (") + c.name + "): bad block size " +
                           std::to_string(info.blockSize));
    }
  } else if (info.blockSize != 0) {
    return protocolError(std::string("codec stream (") + c.name + "): block size " +
                         std::to_string(info.blockSize) + " on a codec without blocks");
  }
  if (info.count > internal::kMaxCount) {
    return protocolError(std::string("codec stream (") + c.name + "): " +
                         std::to_string(info.count) + " elements is too many");
  }
  info.bytes = internal::layoutOf(info.codec, info.count, info.blockSize).total;
  if (bytes < info.bytes) {
    return protocolError(std::string("codec stream (") + c.name + "): " + std::to_string(bytes) +
                         " bytes, but its header says " + std::to_string(info.count) +
                         " elements, " + std::to_string(info.bytes) + " bytes");
  }
  return info;
}

Status encodeWithFeedback(const Codec& codec, const float* input, float* residual, size_t count,
                          const CodecParams& params, void* out, size_t outBytes) {
  return internal::encodeWithFeedbackWith(internal::activeIsa(), codec, input, residual, count,
                                          params, out, outBytes);
}

}  // namespace nanoccl::codec
