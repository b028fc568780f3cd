// Dispatch of the reduction kernels (reduce_internal.h) and the scaling passes of kAvg and
// kPremulSum. The kernels themselves live in reduce_scalar.cc and reduce_simd.inc.
#include "common/reduce.h"

#include <strings.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <type_traits>

#include "common/logging.h"
#include "common/reduce_internal.h"

#if NANOCCL_REDUCE_X86
#include <cpuid.h>
#endif

namespace nanoccl {
namespace reduce_internal {
namespace {

constexpr size_t kNumIsas = static_cast<size_t>(Isa::kNumIsas);

struct Tables {
  KernelTable byIsa[kNumIsas];
};

// Filling a table only stores function pointers, so every compiled variant gets one, whatever
// the CPU: the tests look at all of them and skip the ones the CPU cannot run.
const Tables& tables() {
  static const Tables all = [] {
    Tables x{};
    KernelTable& scalar = x.byIsa[static_cast<size_t>(Isa::kScalar)];
    fillScalarKernels(scalar);
#if NANOCCL_REDUCE_X86
    x.byIsa[static_cast<size_t>(Isa::kAvx2)] = scalar;
    fillAvx2Kernels(x.byIsa[static_cast<size_t>(Isa::kAvx2)]);
    x.byIsa[static_cast<size_t>(Isa::kAvx512)] = scalar;
    fillAvx512Kernels(x.byIsa[static_cast<size_t>(Isa::kAvx512)]);
#endif
    return x;
  }();
  return all;
}

Isa bestSupported() {
  for (size_t i = kNumIsas; i-- > 0;) {
    if (cpuSupports(static_cast<Isa>(i))) return static_cast<Isa>(i);
  }
  return Isa::kScalar;
}

Isa chooseIsa() {
  const Isa best = bestSupported();
  Isa chosen = best;
  if (const char* env = std::getenv("NANOCCL_REDUCE_ISA"); env != nullptr && *env != '\0') {
    bool known = false;
    for (size_t i = 0; i < kNumIsas; ++i) {
      if (strcasecmp(env, isaName(static_cast<Isa>(i))) == 0) {
        known = true;
        // The variable only lowers the choice: asking for more than the CPU has would crash.
        if (i <= static_cast<size_t>(best)) {
          chosen = static_cast<Isa>(i);
        } else {
          NANOCCL_WARN("NANOCCL_REDUCE_ISA=" << env << ": not supported by this CPU, using "
                                             << isaName(best));
        }
      }
    }
    if (!known) {
      NANOCCL_WARN("NANOCCL_REDUCE_ISA=" << env << ": expected scalar|avx2|avx512, using "
                                         << isaName(best));
    }
  }
  NANOCCL_INFO("reduction kernels: " << isaName(chosen) << " (best on this CPU: "
                                     << isaName(best) << ")");
  return chosen;
}

Status checkArgs(const void* p1, const void* p2, const void* p3, size_t count, DataType t) {
  if (static_cast<size_t>(t) >= static_cast<size_t>(DataType::kNumTypes)) {
    return invalidArgument("reduce: invalid dtype " + std::to_string(static_cast<int>(t)));
  }
  if (count > 0 && (p1 == nullptr || p2 == nullptr || p3 == nullptr)) {
    return invalidArgument("reduce: null buffer for " + std::to_string(count) + " elements of " +
                           dataTypeName(t));
  }
  return Status::ok();
}

}  // namespace

const char* isaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
    default: return "invalid-isa";
  }
}

bool isaCompiled(Isa isa) {
#if NANOCCL_REDUCE_X86
  return static_cast<size_t>(isa) < kNumIsas;
#else
  return isa == Isa::kScalar;
#endif
}

#if NANOCCL_REDUCE_X86
// clang before 16 knows no "f16c" for __builtin_cpu_supports (the fuzz build uses clang 14):
// read the CPUID bit there.
bool hasF16c() {
#if defined(__clang__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
#else
  return __builtin_cpu_supports("f16c");
#endif
}
#endif

bool cpuSupports(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return true;
#if NANOCCL_REDUCE_X86
    // __builtin_cpu_supports also checks that the OS saves the wider registers (XCR0).
    case Isa::kAvx2:
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && hasF16c();
    case Isa::kAvx512:
      return cpuSupports(Isa::kAvx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
#endif
    default:
      return false;
  }
}

const KernelTable& kernels(Isa isa) {
  const size_t i = static_cast<size_t>(isa);
  return tables().byIsa[isaCompiled(isa) ? i : 0];
}

Isa activeIsa() {
  static const Isa isa = chooseIsa();
  return isa;
}

Status reduceWith(Isa isa, void* out, const void* a, const void* b, size_t count, DataType t,
                  ReduceOp op) {
  NANOCCL_CHECK(checkArgs(out, a, b, count, t));
  if (!reduceOpSupported(op, t)) {
    return invalidArgument(std::string("reduce: ") + reduceOpName(op) + " is not defined on " +
                           dataTypeName(t));
  }
  if (!isaCompiled(isa)) {
    return unavailableError(std::string("reduce: ") + isaName(isa) + " kernels not built");
  }
  if (count == 0) return Status::ok();
  const BinaryFn fn = kernels(isa).fn[static_cast<size_t>(t)][static_cast<size_t>(op)];
  if (fn == nullptr) {
    return internalError(std::string("reduce: no ") + isaName(isa) + " kernel for " +
                         reduceOpName(op) + " on " + dataTypeName(t));
  }
  fn(out, a, b, count);
  return Status::ok();
}

namespace {

Status checkConversion(const void* out, const void* in, size_t count, DataType t) {
  if (t != DataType::kFloat16 && t != DataType::kBFloat16) {
    return invalidArgument(std::string("convert: float16 or bfloat16 <-> float32 only, not ") +
                           dataTypeName(t));
  }
  if (count > 0 && (out == nullptr || in == nullptr)) {
    return invalidArgument("convert: null buffer for " + std::to_string(count) + " elements");
  }
  return Status::ok();
}

}  // namespace

Status widenWith(Isa isa, float* out, const void* in, size_t count, DataType t) {
  NANOCCL_CHECK(checkConversion(out, in, count, t));
  if (count == 0) return Status::ok();
  kernels(isa).widen[static_cast<size_t>(t)](out, static_cast<const uint16_t*>(in), count);
  return Status::ok();
}

Status narrowWith(Isa isa, void* out, const float* in, size_t count, DataType t) {
  NANOCCL_CHECK(checkConversion(out, in, count, t));
  if (count == 0) return Status::ok();
  kernels(isa).narrow[static_cast<size_t>(t)](static_cast<uint16_t*>(out), in, count);
  return Status::ok();
}

}  // namespace reduce_internal

Status widenToFloat32(float* out, const void* in, size_t count, DataType t) {
  return reduce_internal::widenWith(reduce_internal::activeIsa(), out, in, count, t);
}

Status narrowFromFloat32(void* out, const float* in, size_t count, DataType t) {
  return reduce_internal::narrowWith(reduce_internal::activeIsa(), out, in, count, t);
}

Status reduceInto(void* dst, const void* src, size_t count, DataType t, ReduceOp op) {
  return reduce_internal::reduceWith(reduce_internal::activeIsa(), dst, dst, src, count, t, op);
}

Status reduceTo(void* out, const void* a, const void* b, size_t count, DataType t, ReduceOp op) {
  return reduce_internal::reduceWith(reduce_internal::activeIsa(), out, a, b, count, t, op);
}

const char* reduceIsa() { return reduce_internal::isaName(reduce_internal::activeIsa()); }

bool knownReduceIsa(const char* value) {
  using reduce_internal::Isa;
  if (*value == '\0') return true;
  for (size_t i = 0; i < static_cast<size_t>(Isa::kNumIsas); ++i) {
    if (strcasecmp(value, reduce_internal::isaName(static_cast<Isa>(i))) == 0) return true;
  }
  return false;
}

// ---- kAvg and kPremulSum scaling ------------------------------------------------------------

namespace {

// Applies f to every element, with float16/bfloat16 widened to float and complex as two reals.
// F is a generic lambda called with the element (or real part) type.
template <typename Fn>
void forEach(void* buf, size_t count, DataType t, Fn&& f) {
  auto each = [&](auto* p, size_t n) {
    for (size_t i = 0; i < n; ++i) p[i] = f(p[i]);
  };
  switch (t) {
    case DataType::kFloat32: each(static_cast<float*>(buf), count); break;
    case DataType::kFloat64: each(static_cast<double*>(buf), count); break;
    case DataType::kComplex64: each(static_cast<float*>(buf), 2 * count); break;
    case DataType::kComplex128: each(static_cast<double*>(buf), 2 * count); break;
    case DataType::kFloat16: {
      auto* p = static_cast<uint16_t*>(buf);
      for (size_t i = 0; i < count; ++i) p[i] = floatToHalf(f(halfToFloat(p[i])));
      break;
    }
    case DataType::kBFloat16: {
      auto* p = static_cast<uint16_t*>(buf);
      for (size_t i = 0; i < count; ++i) p[i] = floatToBFloat16(f(bfloat16ToFloat(p[i])));
      break;
    }
    case DataType::kInt8: each(static_cast<int8_t*>(buf), count); break;
    case DataType::kUInt8: each(static_cast<uint8_t*>(buf), count); break;
    case DataType::kInt16: each(static_cast<int16_t*>(buf), count); break;
    case DataType::kInt32: each(static_cast<int32_t*>(buf), count); break;
    case DataType::kInt64: each(static_cast<int64_t*>(buf), count); break;
    case DataType::kBool: {
      // Read as bytes: a byte other than 0 or 1 is true, and reading it as bool would be UB.
      auto* p = static_cast<uint8_t*>(buf);
      for (size_t i = 0; i < count; ++i) p[i] = f(p[i] != 0) ? 1 : 0;
      break;
    }
    default: break;
  }
}

template <typename T>
double hiBound() {
  // One past the maximum, exactly representable as a double for every integer type.
  return std::ldexp(1.0, std::numeric_limits<T>::digits);
}

template <typename T>
T scaleInteger(T x, double factor) {
  const double v = std::trunc(static_cast<double>(x) * factor);
  if (std::isnan(v)) return 0;
  if (v < static_cast<double>(std::numeric_limits<T>::min())) return std::numeric_limits<T>::min();
  if (v >= hiBound<T>()) return std::numeric_limits<T>::max();
  return static_cast<T>(v);
}

}  // namespace

Status scaleInPlace(void* buf, size_t count, DataType t, double factor) {
  NANOCCL_CHECK(reduce_internal::checkArgs(buf, buf, buf, count, t).withContext("scale: "));
  forEach(buf, count, t, [factor](auto x) -> decltype(x) {
    using T = decltype(x);
    if constexpr (std::is_same_v<T, bool>) {
      return scaleInteger<int>(x ? 1 : 0, factor) != 0;
    } else if constexpr (std::is_floating_point_v<T>) {
      return x * static_cast<T>(factor);  // in the element's precision, like NCCL's premul
    } else {
      return scaleInteger<T>(x, factor);
    }
  });
  return Status::ok();
}

Status divideInPlace(void* buf, size_t count, DataType t, int64_t divisor) {
  NANOCCL_CHECK(reduce_internal::checkArgs(buf, buf, buf, count, t).withContext("divide: "));
  if (divisor < 1) {
    return invalidArgument("divide: divisor must be >= 1, got " + std::to_string(divisor));
  }
  forEach(buf, count, t, [divisor](auto x) -> decltype(x) {
    using T = decltype(x);
    if constexpr (std::is_same_v<T, bool>) {
      return x && divisor == 1;
    } else if constexpr (std::is_floating_point_v<T>) {
      return x / static_cast<T>(divisor);
    } else {
      // |x / divisor| <= |x|, so the quotient fits T again.
      return static_cast<T>(static_cast<int64_t>(x) / divisor);
    }
  });
  return Status::ok();
}

}  // namespace nanoccl
