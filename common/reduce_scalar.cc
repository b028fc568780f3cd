// The portable reduction kernels: the reference every vectorized variant must match bit for bit,
// and the fallback for entries a variant does not vectorize. Built with the baseline target flags
// (the compiler may still auto-vectorize for SSE2) and -ffp-contract=off, so a*b-c*d is never
// fused into an FMA that a vector variant would not do.
#include <cstring>
#include <type_traits>

#include "common/reduce_internal.h"

namespace nanoccl::reduce_internal {
namespace {

template <typename T, T (*F)(T, T)>
void loop(void* out, const void* a, const void* b, size_t n) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = F(x[i], y[i]);
}

// Integers wrap around (two's complement), computed in unsigned arithmetic wide enough that the
// C++ promotions cannot overflow a signed int (uint16 * uint16 would).
template <typename T>
using Wide = std::conditional_t<(sizeof(T) <= 4), uint32_t, uint64_t>;

template <typename T>
T addInt(T a, T b) {
  return static_cast<T>(static_cast<Wide<T>>(a) + static_cast<Wide<T>>(b));
}
template <typename T>
T mulInt(T a, T b) {
  return static_cast<T>(static_cast<Wide<T>>(a) * static_cast<Wide<T>>(b));
}
template <typename T>
T minInt(T a, T b) {
  return b < a ? b : a;
}
template <typename T>
T maxInt(T a, T b) {
  return a < b ? b : a;
}
template <typename T>
T andBits(T a, T b) {
  return static_cast<T>(a & b);
}
template <typename T>
T orBits(T a, T b) {
  return static_cast<T>(a | b);
}
template <typename T>
T xorBits(T a, T b) {
  return static_cast<T>(a ^ b);
}

template <typename F>
using Bits = std::conditional_t<sizeof(F) == 4, uint32_t, uint64_t>;

template <typename F>
F quietNan(F a) {
  Bits<F> x;
  std::memcpy(&x, &a, sizeof(x));
  x |= Bits<F>(1) << (sizeof(F) == 4 ? 22 : 51);
  std::memcpy(&a, &x, sizeof(a));
  return a;
}

// Sum and product: a NaN operand comes out quieted, a's when both are NaN. That is what x86
// does for (a op b), made explicit because compilers swap the operands of commutative ops at
// will, and the variants must agree on every bit.
// (Written as selects, not early returns, so the compiler can still vectorize the loop.)
template <typename F>
F addFloat(F a, F b) {
  const F r = a + b;
  return a != a ? quietNan(a) : r;
}
template <typename F>
F mulFloat(F a, F b) {
  const F r = a * b;
  return a != a ? quietNan(a) : r;
}

template <typename F, bool kMax>
F signedZeroPick(F a, F b) {
  Bits<F> x, y;
  std::memcpy(&x, &a, sizeof(x));
  std::memcpy(&y, &b, sizeof(y));
  const Bits<F> r = kMax ? (x & y) : (x | y);
  F f;
  std::memcpy(&f, &r, sizeof(f));
  return f;
}

// MIN/MAX on floats: a NaN operand wins (a's if both are NaN), so a NaN on any rank reaches the
// result whatever the reduction order; -0 < +0. The vector variants implement the same rule.
template <typename F>
F maxFloat(F a, F b) {
  if (a != a) return a;
  if (b != b) return b;
  if (a > b) return a;
  if (b > a) return b;
  return signedZeroPick<F, true>(a, b);
}
template <typename F>
F minFloat(F a, F b) {
  if (a != a) return a;
  if (b != b) return b;
  if (a < b) return a;
  if (b < a) return b;
  return signedZeroPick<F, false>(a, b);
}

// float16 / bfloat16: computed in float32, rounded back to nearest even after each operation.
template <float (*Op)(float, float)>
uint16_t viaHalf(uint16_t a, uint16_t b) {
  return floatToHalf(Op(halfToFloat(a), halfToFloat(b)));
}
template <float (*Op)(float, float)>
uint16_t viaBFloat16(uint16_t a, uint16_t b) {
  return floatToBFloat16(Op(bfloat16ToFloat(a), bfloat16ToFloat(b)));
}

// F16C's vcvtph2ps quiets a signaling NaN; so does the scalar widening, for the same bits.
float quietHalfToFloat(uint16_t h) {
  float f = halfToFloat(h);
  if (f != f) {
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    bits |= 0x00400000u;
    std::memcpy(&f, &bits, sizeof f);
  }
  return f;
}

template <float (*ToFloat)(uint16_t)>
void widenLoop(float* out, const uint16_t* in, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = ToFloat(in[i]);
}
template <uint16_t (*FromFloat)(float)>
void narrowLoop(uint16_t* out, const float* in, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = FromFloat(in[i]);
}

// bool (one byte, 0 or 1; any non-zero byte reads as true): results are always 0 or 1.
uint8_t boolOr(uint8_t a, uint8_t b) { return (a | b) != 0; }
uint8_t boolAnd(uint8_t a, uint8_t b) { return a != 0 && b != 0; }
uint8_t boolXor(uint8_t a, uint8_t b) { return (a != 0) != (b != 0); }

// Bitwise ops do not care about the element type: one byte loop serves all integer types.
template <uint8_t (*F)(uint8_t, uint8_t), size_t kSize>
void bytewise(void* out, const void* a, const void* b, size_t n) {
  loop<uint8_t, F>(out, a, b, n * kSize);
}

// Complex sums are float sums over twice as many elements.
template <typename F>
void complexAdd(void* out, const void* a, const void* b, size_t n) {
  loop<F, addFloat<F>>(out, a, b, 2 * n);
}

// (ar + i ai)(br + i bi), in exactly this order of operations (the vector variants fall back
// to this kernel). No C99 Annex G inf/NaN recovery: like a plain complex multiply on a GPU.
template <typename F>
void complexMul(void* out, const void* a, const void* b, size_t n) {
  F* o = static_cast<F*>(out);
  const F* x = static_cast<const F*>(a);
  const F* y = static_cast<const F*>(b);
  for (size_t i = 0; i < n; ++i) {
    const F ar = x[2 * i], ai = x[2 * i + 1], br = y[2 * i], bi = y[2 * i + 1];
    o[2 * i] = ar * br - ai * bi;
    o[2 * i + 1] = ar * bi + ai * br;
  }
}

void set(KernelTable& t, DataType d, ReduceOp op, BinaryFn fn) {
  t.fn[static_cast<size_t>(d)][static_cast<size_t>(op)] = fn;
}

// kAvg and kPremulSum reduce as kSum; the scaling is a separate pass.
void setSum(KernelTable& t, DataType d, BinaryFn fn) {
  set(t, d, ReduceOp::kSum, fn);
  set(t, d, ReduceOp::kAvg, fn);
  set(t, d, ReduceOp::kPremulSum, fn);
}

template <typename T>
void setInteger(KernelTable& t, DataType d) {
  setSum(t, d, loop<T, addInt<T>>);
  set(t, d, ReduceOp::kProduct, loop<T, mulInt<T>>);
  set(t, d, ReduceOp::kMin, loop<T, minInt<T>>);
  set(t, d, ReduceOp::kMax, loop<T, maxInt<T>>);
  set(t, d, ReduceOp::kBand, bytewise<andBits<uint8_t>, sizeof(T)>);
  set(t, d, ReduceOp::kBor, bytewise<orBits<uint8_t>, sizeof(T)>);
  set(t, d, ReduceOp::kBxor, bytewise<xorBits<uint8_t>, sizeof(T)>);
}

template <typename F>
void setFloat(KernelTable& t, DataType d) {
  setSum(t, d, loop<F, addFloat<F>>);
  set(t, d, ReduceOp::kProduct, loop<F, mulFloat<F>>);
  set(t, d, ReduceOp::kMin, loop<F, minFloat<F>>);
  set(t, d, ReduceOp::kMax, loop<F, maxFloat<F>>);
}

template <uint16_t (*Sum)(uint16_t, uint16_t), uint16_t (*Mul)(uint16_t, uint16_t),
          uint16_t (*Min)(uint16_t, uint16_t), uint16_t (*Max)(uint16_t, uint16_t)>
void setHalfLike(KernelTable& t, DataType d) {
  setSum(t, d, loop<uint16_t, Sum>);
  set(t, d, ReduceOp::kProduct, loop<uint16_t, Mul>);
  set(t, d, ReduceOp::kMin, loop<uint16_t, Min>);
  set(t, d, ReduceOp::kMax, loop<uint16_t, Max>);
}

}  // namespace

void fillScalarKernels(KernelTable& t) {
  setFloat<float>(t, DataType::kFloat32);
  setFloat<double>(t, DataType::kFloat64);
  setHalfLike<viaHalf<addFloat<float>>, viaHalf<mulFloat<float>>, viaHalf<minFloat<float>>,
              viaHalf<maxFloat<float>>>(t, DataType::kFloat16);
  setHalfLike<viaBFloat16<addFloat<float>>, viaBFloat16<mulFloat<float>>,
              viaBFloat16<minFloat<float>>, viaBFloat16<maxFloat<float>>>(t, DataType::kBFloat16);
  t.widen[static_cast<size_t>(DataType::kFloat16)] = widenLoop<quietHalfToFloat>;
  t.narrow[static_cast<size_t>(DataType::kFloat16)] = narrowLoop<floatToHalf>;
  t.widen[static_cast<size_t>(DataType::kBFloat16)] = widenLoop<bfloat16ToFloat>;
  t.narrow[static_cast<size_t>(DataType::kBFloat16)] = narrowLoop<floatToBFloat16>;
  setInteger<int8_t>(t, DataType::kInt8);
  setInteger<uint8_t>(t, DataType::kUInt8);
  setInteger<int16_t>(t, DataType::kInt16);
  setInteger<int32_t>(t, DataType::kInt32);
  setInteger<int64_t>(t, DataType::kInt64);

  // bool: sum and max are OR, product and min are AND (header contract).
  setSum(t, DataType::kBool, loop<uint8_t, boolOr>);
  set(t, DataType::kBool, ReduceOp::kMax, loop<uint8_t, boolOr>);
  set(t, DataType::kBool, ReduceOp::kProduct, loop<uint8_t, boolAnd>);
  set(t, DataType::kBool, ReduceOp::kMin, loop<uint8_t, boolAnd>);
  set(t, DataType::kBool, ReduceOp::kBand, loop<uint8_t, boolAnd>);
  set(t, DataType::kBool, ReduceOp::kBor, loop<uint8_t, boolOr>);
  set(t, DataType::kBool, ReduceOp::kBxor, loop<uint8_t, boolXor>);

  setSum(t, DataType::kComplex64, complexAdd<float>);
  set(t, DataType::kComplex64, ReduceOp::kProduct, complexMul<float>);
  setSum(t, DataType::kComplex128, complexAdd<double>);
  set(t, DataType::kComplex128, ReduceOp::kProduct, complexMul<double>);
}

}  // namespace nanoccl::reduce_internal
