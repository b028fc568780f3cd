// The reduction kernels' internals, for reduce.cc, the tests and the benchmark only.
//
// Each instruction-set variant lives in its own translation unit, compiled with its own target
// flags (reduce_scalar.cc, reduce_avx2.cc, reduce_avx512.cc). A variant fills the entries of a
// KernelTable it implements; reduce.cc starts every table from the scalar one, so an entry a
// variant does not vectorize (complex product, say) falls back to the scalar kernel.
// Calling a variant's kernels on a CPU without its features is SIGILL: check cpuSupports().
//
// Why the per-ISA files include nothing with inline functions they call: an inline function
// emitted in an -mavx512f file is a weak symbol the linker may pick for every other caller,
// which would then run AVX-512 code on a CPU without it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"
#include "common/status.h"

namespace nanoccl::reduce_internal {

enum class Isa : uint8_t { kScalar = 0, kAvx2, kAvx512, kNumIsas };

// out[i] = a[i] (op) b[i] for i < count; out may be a or b, but no other overlap.
using BinaryFn = void (*)(void* out, const void* a, const void* b, size_t count);

// float16/bfloat16 <-> float32 over `count` elements (widening is exact, but for a float16
// signaling NaN, which comes out quiet as F16C makes it; narrowing rounds to nearest even, NaN
// as floatToHalf()/floatToBFloat16() make it).
using WidenFn = void (*)(float* out, const uint16_t* in, size_t count);
using NarrowFn = void (*)(uint16_t* out, const float* in, size_t count);

struct KernelTable {
  // Indexed [DataType][ReduceOp]; nullptr where reduceOpSupported() is false.
  BinaryFn fn[static_cast<size_t>(DataType::kNumTypes)][static_cast<size_t>(ReduceOp::kNumOps)];
  // Indexed [DataType]; set for kFloat16 and kBFloat16 only.
  WidenFn widen[static_cast<size_t>(DataType::kNumTypes)];
  NarrowFn narrow[static_cast<size_t>(DataType::kNumTypes)];
};

const char* isaName(Isa isa);  // "scalar", "avx2", "avx512"
// Whether the variant was compiled into this build (the AVX ones only on x86-64).
bool isaCompiled(Isa isa);
// Whether this CPU (and OS) can run the variant; false when it was not compiled.
bool cpuSupports(Isa isa);
// The variant's table; valid whenever isaCompiled(isa), whatever the CPU.
const KernelTable& kernels(Isa isa);
// The variant reduceTo() uses: the best the CPU runs, lowered by NANOCCL_REDUCE_ISA; read once.
Isa activeIsa();
// reduceTo() through a chosen variant (tests compare variants with it; the CPU must support it).
Status reduceWith(Isa isa, void* out, const void* a, const void* b, size_t count, DataType t,
                  ReduceOp op);
// widenToFloat32() / narrowFromFloat32() through a chosen variant.
Status widenWith(Isa isa, float* out, const void* in, size_t count, DataType t);
Status narrowWith(Isa isa, void* out, const float* in, size_t count, DataType t);

// Defined by each variant's translation unit: overwrite the entries it implements.
void fillScalarKernels(KernelTable& table);
void fillAvx2Kernels(KernelTable& table);
void fillAvx512Kernels(KernelTable& table);

}  // namespace nanoccl::reduce_internal
