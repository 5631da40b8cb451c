#include "importers/torch/torch_types.h"

#include <array>

namespace qforge {

namespace {
// Every dtype torch 2.x can save. Those without an IR dtype are still known, so that a file
// holding them gets "dtype not supported" naming the tensor rather than a refused global.
constexpr std::array<TorchDType, 26> kTorchDTypes = {{
    {"float32", "FloatStorage", DType::F32, 4},
    {"float16", "HalfStorage", DType::F16, 2},
    {"bfloat16", "BFloat16Storage", DType::BF16, 2},
    {"float64", "DoubleStorage", DType::F64, 8},
    {"int64", "LongStorage", DType::I64, 8},
    {"int32", "IntStorage", DType::I32, 4},
    {"int16", "ShortStorage", DType::I16, 2},
    {"int8", "CharStorage", DType::I8, 1},
    {"uint8", "ByteStorage", DType::U8, 1},
    {"bool", "BoolStorage", DType::Bool, 1},
    {"complex32", "ComplexHalfStorage", std::nullopt, 4},
    {"complex64", "ComplexFloatStorage", std::nullopt, 8},
    {"complex128", "ComplexDoubleStorage", std::nullopt, 16},
    {"qint8", "QInt8Storage", std::nullopt, 1},
    {"quint8", "QUInt8Storage", std::nullopt, 1},
    {"qint32", "QInt32Storage", std::nullopt, 4},
    {"quint4x2", "QUInt4x2Storage", std::nullopt, 1},
    {"quint2x4", "QUInt2x4Storage", std::nullopt, 1},
    {"uint16", "", std::nullopt, 2},
    {"uint32", "", std::nullopt, 4},
    {"uint64", "", std::nullopt, 8},
    {"float8_e4m3fn", "", std::nullopt, 1},
    {"float8_e5m2", "", std::nullopt, 1},
    {"float8_e4m3fnuz", "", std::nullopt, 1},
    {"float8_e5m2fnuz", "", std::nullopt, 1},
    {"float8_e8m0fnu", "", std::nullopt, 1},
}};
}  // namespace

const TorchDType* torch_dtype_by_name(std::string_view name) {
  for (const auto& t : kTorchDTypes) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

const TorchDType* torch_dtype_by_storage(std::string_view storage) {
  if (storage.empty()) return nullptr;
  for (const auto& t : kTorchDTypes) {
    if (t.storage == storage) return &t;
  }
  return nullptr;
}

}  // namespace qforge
