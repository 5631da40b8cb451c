#pragma once
// Element types of the IR. Quantized tensors are real dtypes; 4-bit ones pack two values per
// byte, low nibble first, as ONNX does.
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace qforge {

enum class DType : uint8_t { F32, F16, BF16, F64, I64, I32, I16, I8, U8, Bool, I4, U4 };

struct DTypeInfo {
  DType dtype;
  std::string_view name;  // "f32", "i4", ...
  int bits;               // bits per element: 4 for packed int4
  int onnx_type;          // TensorProto.DataType value
  bool is_float;
  bool is_signed;
};

// One table drives names, sizes and the ONNX mapping.
inline constexpr std::array<DTypeInfo, 12> kDTypes = {{
    {DType::F32, "f32", 32, 1, true, true},
    {DType::F16, "f16", 16, 10, true, true},
    {DType::BF16, "bf16", 16, 16, true, true},
    {DType::F64, "f64", 64, 11, true, true},
    {DType::I64, "i64", 64, 7, false, true},
    {DType::I32, "i32", 32, 6, false, true},
    {DType::I16, "i16", 16, 5, false, true},
    {DType::I8, "i8", 8, 3, false, true},
    {DType::U8, "u8", 8, 2, false, false},
    {DType::Bool, "bool", 8, 9, false, false},
    {DType::I4, "i4", 4, 22, false, true},
    {DType::U4, "u4", 4, 21, false, false},
}};

const DTypeInfo& dtype_info(DType dtype);
inline std::string_view dtype_name(DType dtype) { return dtype_info(dtype).name; }
inline int dtype_bits(DType dtype) { return dtype_info(dtype).bits; }
inline bool dtype_is_float(DType dtype) { return dtype_info(dtype).is_float; }
std::optional<DType> dtype_from_name(std::string_view name);
std::optional<DType> dtype_from_onnx(int onnx_type);
inline int dtype_to_onnx(DType dtype) { return dtype_info(dtype).onnx_type; }

// Bytes needed for `count` elements; packed 4-bit types round up to whole bytes.
// Returns nullopt on overflow.
std::optional<size_t> dtype_storage_bytes(DType dtype, uint64_t count);

}  // namespace qforge
