// Codec throughput (collectives/codec/codec.h): encode, decode and decodeAccumulate for every codec
// and every ISA variant this CPU runs, on one core; and the CUDA kernels (codec_cuda.h), rows that
// report an error when the build has no CUDA or the machine no device.
//
// Counters, in GB/s (1 GB = 1e9 bytes): "fp32_GB" is float32 bytes per second (the input of
// encode, the output of decode): the rate a collective feeds or drains a codec, and what the
// "int8 encode >= 2 GB/s per core" target counts. "wire_GB" is encoded bytes per second.
// Sizes: 1 MiB of float32 stays in L2 (kernel speed); 64 MiB goes to DRAM (bandwidth).
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "collectives/codec/codec.h"
#include "collectives/codec/codec_cuda.h"
#include "collectives/codec/codec_internal.h"
#include "common/reduce.h"

#if NANOCCL_CODEC_CUDA
#include <cuda_runtime_api.h>
#endif

namespace {

using nanoccl::codec::Codec;
using nanoccl::codec::CodecId;
using nanoccl::codec::CodecParams;
using nanoccl::codec::internal::Isa;
using nanoccl::codec::internal::Sink;

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<uint8_t, FreeDeleter>;

Buffer allocate(size_t bytes) {
  const size_t rounded = (bytes + 63) / 64 * 64;
  return Buffer(static_cast<uint8_t*>(std::aligned_alloc(64, rounded)));
}

// Gradient-like values: normal floats over a few binades, both signs.
void fill(float* p, size_t n) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  for (size_t i = 0; i < n; ++i) p[i] = std::ldexp(d(rng), static_cast<int>(i % 8) - 10);
}

enum class Op { kEncode, kDecode, kDecodeAccumulate };
const char* opName(Op op) {
  switch (op) {
    case Op::kEncode: return "encode";
    case Op::kDecode: return "decode";
    default: return "decode_accumulate";
  }
}

void setCounters(benchmark::State& state, size_t fp32Bytes, size_t wireBytes) {
  state.counters["fp32_GB"] = benchmark::Counter(static_cast<double>(fp32Bytes) / 1e9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
  state.counters["wire_GB"] = benchmark::Counter(static_cast<double>(wireBytes) / 1e9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

void cpuBench(benchmark::State& state, Isa isa, const Codec* codec, Op op, bool stochastic,
              size_t fp32Bytes) {
  const size_t n = fp32Bytes / 4;
  CodecParams params;
  params.stochasticRounding = stochastic;
  params.seed = 42;
  const size_t wireBytes = codec->encodedBytes(n, params);
  Buffer in = allocate(fp32Bytes), out = allocate(fp32Bytes), wire = allocate(wireBytes);
  auto* x = reinterpret_cast<float*>(in.get());
  auto* y = reinterpret_cast<float*>(out.get());
  fill(x, n);
  std::memset(y, 0, fp32Bytes);
  nanoccl::Status s = nanoccl::codec::internal::encodeWith(
      isa, *codec, x, nanoccl::DataType::kFloat32, n, params, wire.get(), wireBytes);
  for (auto _ : state) {
    if (!s.isOk()) break;
    switch (op) {
      case Op::kEncode:
        s = nanoccl::codec::internal::encodeWith(isa, *codec, x, nanoccl::DataType::kFloat32, n,
                                                 params, wire.get(), wireBytes);
        break;
      case Op::kDecode:
        s = nanoccl::codec::internal::decodeWith(isa, Sink::kStore, wire.get(), wireBytes, y, n);
        break;
      case Op::kDecodeAccumulate:
        s = nanoccl::codec::internal::decodeWith(isa, Sink::kAccumulate, wire.get(), wireBytes, y,
                                                 n);
        break;
    }
    benchmark::DoNotOptimize(wire.get());
    benchmark::DoNotOptimize(y);
    benchmark::ClobberMemory();
  }
  if (!s.isOk()) {
    state.SkipWithError(s.toString().c_str());
    return;
  }
  setCounters(state, fp32Bytes, wireBytes);
}

#if NANOCCL_CODEC_CUDA
// One call per iteration, timed with events on a private stream.
void cudaBench(benchmark::State& state, const Codec* codec, Op op, bool stochastic,
               size_t fp32Bytes) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const size_t n = fp32Bytes / 4;
  CodecParams params;
  params.stochasticRounding = stochastic;
  params.seed = 42;
  const size_t wireBytes = codec->encodedBytes(n, params);
  std::vector<float> host(n);
  fill(host.data(), n);
  float *x = nullptr, *y = nullptr;
  void* wire = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  if (cudaMalloc(reinterpret_cast<void**>(&x), fp32Bytes) != cudaSuccess ||
      cudaMalloc(reinterpret_cast<void**>(&y), fp32Bytes) != cudaSuccess ||
      cudaMalloc(&wire, wireBytes) != cudaSuccess || cudaStreamCreate(&stream) != cudaSuccess ||
      cudaEventCreate(&start) != cudaSuccess || cudaEventCreate(&stop) != cudaSuccess) {
    state.SkipWithError("CUDA allocation failed");
  } else {
    cudaMemcpy(x, host.data(), fp32Bytes, cudaMemcpyHostToDevice);
    cudaMemset(y, 0, fp32Bytes);
    nanoccl::Status s =
        nanoccl::codec::encodeCuda(*codec, x, n, params, wire, wireBytes, stream);
    for (auto _ : state) {
      if (!s.isOk()) break;
      cudaEventRecord(start, stream);
      switch (op) {
        case Op::kEncode:
          s = nanoccl::codec::encodeCuda(*codec, x, n, params, wire, wireBytes, stream);
          break;
        case Op::kDecode:
          s = nanoccl::codec::decodeCuda(*codec, params, wire, wireBytes, y, n, stream);
          break;
        case Op::kDecodeAccumulate:
          s = nanoccl::codec::decodeAccumulateCuda(*codec, params, wire, wireBytes, y, n, stream);
          break;
      }
      cudaEventRecord(stop, stream);
      cudaEventSynchronize(stop);
      float ms = 0.0f;
      cudaEventElapsedTime(&ms, start, stop);
      state.SetIterationTime(ms / 1e3);
    }
    if (!s.isOk()) {
      state.SkipWithError(s.toString().c_str());
    } else if (cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess) {
      state.SkipWithError(cudaGetErrorString(e));
    } else {
      setCounters(state, fp32Bytes, wireBytes);
    }
  }
  if (start != nullptr) cudaEventDestroy(start);
  if (stop != nullptr) cudaEventDestroy(stop);
  if (stream != nullptr) cudaStreamDestroy(stream);
  cudaFree(x);
  cudaFree(y);
  cudaFree(wire);
}
#else
void cudaBench(benchmark::State& state, const Codec*, Op, bool, size_t) {
  state.SkipWithError("built without CUDA (NANOCCL_WITH_CUDA)");
}
#endif

void registerAll() {
  const Op ops[] = {Op::kEncode, Op::kDecode, Op::kDecodeAccumulate};
  const std::pair<size_t, const char*> sizes[] = {{1 << 20, "1MiB"}, {64 << 20, "64MiB"}};
  auto rows = [&](const std::string& where, auto&& add) {
    for (size_t c = 0; c < static_cast<size_t>(CodecId::kNumCodecs); ++c) {
      const Codec* codec = &nanoccl::codec::codecTable()[c];
      const bool quant = codec->id == CodecId::kInt8 || codec->id == CodecId::kInt4;
      for (const Op op : ops) {
        for (const bool sr : {false, true}) {
          if (sr && (!quant || op != Op::kEncode)) continue;
          for (const auto& [bytes, label] : sizes) {
            const std::string name = "codec/" + where + "/" + codec->name + (sr ? "_sr" : "") +
                                     "/" + opName(op) + "/" + label;
            add(name, codec, op, sr, bytes);
          }
        }
      }
    }
  };
  for (size_t i = 0; i < static_cast<size_t>(Isa::kNumIsas); ++i) {
    const auto isa = static_cast<Isa>(i);
    if (!nanoccl::reduce_internal::cpuSupports(isa)) continue;
    rows(nanoccl::reduce_internal::isaName(isa),
         [isa](const std::string& name, const Codec* c, Op op, bool sr, size_t bytes) {
           benchmark::RegisterBenchmark(name.c_str(), cpuBench, isa, c, op, sr, bytes)
               ->Unit(benchmark::kMicrosecond);
         });
  }
  rows("cuda", [](const std::string& name, const Codec* c, Op op, bool sr, size_t bytes) {
    if (bytes < (64 << 20)) return;  // one size: the GPU needs large buffers to be busy
    benchmark::RegisterBenchmark(name.c_str(), cudaBench, c, op, sr, bytes)
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
  });
}

}  // namespace

int main(int argc, char** argv) {
  registerAll();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("codec_isa_default", nanoccl::reduceIsa());
  benchmark::AddCustomContext("cuda_codecs_built",
                              nanoccl::codec::cudaCodecsBuilt() ? "yes" : "no");
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
