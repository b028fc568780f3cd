// Elementwise reduction kernels on CPU buffers, for every DataType and ReduceOp.
//
// Vectorized variants (AVX2, AVX-512) are chosen once at run time from the CPU's features,
// with a scalar fallback; all variants give bit-identical results. float16 and bfloat16 are
// computed in float32 and rounded back (nearest even) after each operation, like Gloo.
// kAvg and kPremulSum reduce as kSum: the scaling is a separate step (scaleInPlace,
// divideInPlace) so the collective decides where it happens.
// bool: sum and max are OR, product and min are AND. Thread-safe, no allocation.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"
#include "common/status.h"

namespace nanoccl {

// dst[i] = dst[i] (op) src[i], for i < count. kInvalidArgument if op is not defined on t.
Status reduceInto(void* dst, const void* src, size_t count, DataType t, ReduceOp op);
// out[i] = a[i] (op) b[i]; out may alias a or b.
Status reduceTo(void* out, const void* a, const void* b, size_t count, DataType t, ReduceOp op);
// buf[i] *= factor (for kPremulSum). Integers: rounded toward zero after the product in double.
Status scaleInPlace(void* buf, size_t count, DataType t, double factor);
// buf[i] /= divisor (for kAvg). Integers use integer division (truncation), like NCCL.
Status divideInPlace(void* buf, size_t count, DataType t, int64_t divisor);

// float16/bfloat16 <-> float32, vectorized like the reductions: widening is exact (a float16
// signaling NaN comes out quiet); narrowing rounds to nearest even (NaN stays NaN, as floatToHalf()/floatToBFloat16()). Compressed
// collectives run half-precision calls in float32 with these. kInvalidArgument for other types.
Status widenToFloat32(float* out, const void* in, size_t count, DataType t);
Status narrowFromFloat32(void* out, const float* in, size_t count, DataType t);

// Which kernel variant reduceInto uses on this CPU: "avx512", "avx2" or "scalar"
// (NANOCCL_REDUCE_ISA=scalar|avx2|avx512 lowers it, for tests and benchmarks).
const char* reduceIsa();
// Whether `value` is a NANOCCL_REDUCE_ISA value (scalar, avx2, avx512 in any case; empty: the
// best); Config::fromEnv() refuses others. A known variant this CPU lacks is not an error:
// reduceIsa() then warns once and uses the best it has.
bool knownReduceIsa(const char* value);

}  // namespace nanoccl
