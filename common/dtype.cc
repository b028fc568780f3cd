#include "common/dtype.h"

namespace nanoccl {
namespace {

struct DataTypeInfo {
  DataType type;
  const char* name;
  size_t size;
  bool floating;
  bool complex;
};

// One row per type, in enum order (docs/design.md, convention 3).
constexpr DataTypeInfo kDataTypes[] = {
    {DataType::kFloat32, "float32", 4, true, false},
    {DataType::kFloat64, "float64", 8, true, false},
    {DataType::kFloat16, "float16", 2, true, false},
    {DataType::kBFloat16, "bfloat16", 2, true, false},
    {DataType::kInt8, "int8", 1, false, false},
    {DataType::kUInt8, "uint8", 1, false, false},
    {DataType::kInt16, "int16", 2, false, false},
    {DataType::kInt32, "int32", 4, false, false},
    {DataType::kInt64, "int64", 8, false, false},
    {DataType::kBool, "bool", 1, false, false},
    {DataType::kComplex64, "complex64", 8, false, true},
    {DataType::kComplex128, "complex128", 16, false, true},
};
static_assert(sizeof(kDataTypes) / sizeof(kDataTypes[0]) ==
              static_cast<size_t>(DataType::kNumTypes));

constexpr const char* kReduceOpNames[] = {"sum",  "product", "min", "max",       "avg",
                                          "band", "bor",     "bxor", "premul_sum"};
static_assert(sizeof(kReduceOpNames) / sizeof(kReduceOpNames[0]) ==
              static_cast<size_t>(ReduceOp::kNumOps));

const DataTypeInfo* info(DataType t) {
  const auto i = static_cast<size_t>(t);
  return i < static_cast<size_t>(DataType::kNumTypes) ? &kDataTypes[i] : nullptr;
}

}  // namespace

size_t dataTypeSize(DataType t) {
  const auto* i = info(t);
  return i ? i->size : 0;
}

const char* dataTypeName(DataType t) {
  const auto* i = info(t);
  return i ? i->name : "invalid-dtype";
}

bool isFloatingPoint(DataType t) {
  const auto* i = info(t);
  return i && i->floating;
}

bool isComplex(DataType t) {
  const auto* i = info(t);
  return i && i->complex;
}

const char* reduceOpName(ReduceOp op) {
  const auto i = static_cast<size_t>(op);
  return i < static_cast<size_t>(ReduceOp::kNumOps) ? kReduceOpNames[i] : "invalid-op";
}

bool reduceOpSupported(ReduceOp op, DataType t) {
  if (info(t) == nullptr || static_cast<size_t>(op) >= static_cast<size_t>(ReduceOp::kNumOps)) {
    return false;
  }
  switch (op) {
    case ReduceOp::kBand:
    case ReduceOp::kBor:
    case ReduceOp::kBxor:
      return !isFloatingPoint(t) && !isComplex(t);
    case ReduceOp::kMin:
    case ReduceOp::kMax:
      return !isComplex(t);
    default:
      return true;
  }
}

}  // namespace nanoccl
