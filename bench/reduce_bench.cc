// Reduction kernel throughput, one core: reduceInto-style (dst = dst op src) for the dtypes and
// ops that dominate training traffic, for every ISA variant this CPU runs.
//
// Counters, in GB/s (1 GB = 1e9 bytes): "mem_GB" is memory traffic (two buffers read, one
// written: 3 x buffer bytes per call), the number to hold against the machine's memory
// bandwidth; "buf_GB" is the buffer size per second (what a collective's reduction consumes).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/reduce.h"
#include "common/reduce_internal.h"

namespace {

using nanoccl::DataType;
using nanoccl::ReduceOp;
using nanoccl::reduce_internal::Isa;

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<uint8_t, FreeDeleter>;

Buffer allocate(size_t bytes) {
  const size_t rounded = (bytes + 63) / 64 * 64;
  return Buffer(static_cast<uint8_t*>(std::aligned_alloc(64, rounded)));
}

// Values that stay finite and normal under repeated sums and maxima (no subnormal slow paths).
void fill(uint8_t* p, size_t n, DataType t, bool second) {
  for (size_t i = 0; i < n; ++i) {
    const float v = second ? 1.0f : 0.5f + static_cast<float>(i % 7);
    switch (t) {
      case DataType::kFloat32: std::memcpy(p + 4 * i, &v, 4); break;
      case DataType::kFloat64: {
        const double d = v;
        std::memcpy(p + 8 * i, &d, 8);
        break;
      }
      case DataType::kFloat16: {
        const uint16_t h = nanoccl::floatToHalf(v);
        std::memcpy(p + 2 * i, &h, 2);
        break;
      }
      case DataType::kBFloat16: {
        const uint16_t b = nanoccl::floatToBFloat16(v);
        std::memcpy(p + 2 * i, &b, 2);
        break;
      }
      default: {
        const int32_t x = static_cast<int32_t>(i % 1000) + (second ? 1 : 0);
        std::memcpy(p + 4 * i, &x, 4);
      }
    }
  }
}

void reduceBench(benchmark::State& state, Isa isa, DataType t, ReduceOp op, size_t bytes) {
  const size_t n = bytes / nanoccl::dataTypeSize(t);
  Buffer dst = allocate(bytes), src = allocate(bytes);
  fill(dst.get(), n, t, false);
  fill(src.get(), n, t, true);
  for (auto _ : state) {
    const nanoccl::Status s =
        nanoccl::reduce_internal::reduceWith(isa, dst.get(), dst.get(), src.get(), n, t, op);
    if (!s.isOk()) {
      state.SkipWithError(s.toString().c_str());
      break;
    }
    benchmark::DoNotOptimize(dst.get());
    benchmark::ClobberMemory();
  }
  // Rates, printed as "mem_GB=49.6/s": decimal gigabytes per second.
  state.counters["mem_GB"] =
      benchmark::Counter(3.0 * static_cast<double>(bytes) / 1e9,
                         benchmark::Counter::kIsIterationInvariantRate);
  state.counters["buf_GB"] = benchmark::Counter(static_cast<double>(bytes) / 1e9,
                                                benchmark::Counter::kIsIterationInvariantRate);
}

void registerAll() {
  const DataType types[] = {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16,
                            DataType::kInt32, DataType::kFloat64};
  const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kMax};
  // 256 KiB per buffer stays in L2 (kernel speed); 64 MiB goes to DRAM (bandwidth).
  const std::pair<size_t, const char*> sizes[] = {{256 << 10, "256KiB"}, {64 << 20, "64MiB"}};
  for (size_t i = 0; i < static_cast<size_t>(Isa::kNumIsas); ++i) {
    const auto isa = static_cast<Isa>(i);
    if (!nanoccl::reduce_internal::cpuSupports(isa)) continue;
    for (const DataType t : types) {
      for (const ReduceOp op : ops) {
        for (const auto& [bytes, label] : sizes) {
          const std::string name = std::string("reduce/") +
                                   nanoccl::reduce_internal::isaName(isa) + "/" +
                                   nanoccl::dataTypeName(t) + "/" + nanoccl::reduceOpName(op) +
                                   "/" + label;
          benchmark::RegisterBenchmark(name.c_str(), reduceBench, isa, t, op, bytes)
              ->Unit(benchmark::kMicrosecond);
        }
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  registerAll();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("reduce_isa_default", nanoccl::reduceIsa());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
