#include "ir/dtype.h"

#include <limits>

#include "ir/error.h"

namespace qforge {

const DTypeInfo& dtype_info(DType dtype) {
  for (const auto& info : kDTypes) {
    if (info.dtype == dtype) return info;
  }
  fail_internal("dtype_info: unknown DType value " + std::to_string(static_cast<int>(dtype)));
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& info : kDTypes) {
    if (info.name == name) return info.dtype;
  }
  return std::nullopt;
}

std::optional<DType> dtype_from_onnx(int onnx_type) {
  for (const auto& info : kDTypes) {
    if (info.onnx_type == onnx_type) return info.dtype;
  }
  return std::nullopt;
}

std::optional<size_t> dtype_storage_bytes(DType dtype, uint64_t count) {
  const int bits = dtype_bits(dtype);
  if (bits == 4) return static_cast<size_t>(count / 2 + count % 2);
  const uint64_t bytes_per = static_cast<uint64_t>(bits / 8);
  if (count > std::numeric_limits<size_t>::max() / bytes_per) return std::nullopt;
  return static_cast<size_t>(count * bytes_per);
}

}  // namespace qforge
