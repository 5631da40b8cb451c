#pragma once
// The GGUF container's enumerations as ggml and gguf-py number them (ggml.h `ggml_type`,
// gguf-py constants.py `GGUFValueType`, `LlamaFileType`), shared by the writer and the reader.
#include <cstdint>
#include <optional>
#include <string_view>

namespace qforge::gguf {

inline constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian uint32
inline constexpr uint32_t kVersion = 3;
inline constexpr uint64_t kDefaultAlignment = 32;
inline constexpr uint32_t kQuantizationVersion = 2;  // gguf-py GGML_QUANT_VERSION

enum class ValueType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, Bool = 7, String = 8,
  Array = 9, U64 = 10, I64 = 11, F64 = 12,
};

enum class TensorType : uint32_t { F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q8_0 = 8, BF16 = 30 };

struct TensorTypeInfo {
  TensorType type;
  std::string_view name;
  uint32_t block_size;  // elements per block along ne[0]
  uint32_t type_size;   // bytes per block
};

// The types qforge writes and reads; others are refused by id.
inline constexpr TensorTypeInfo kTensorTypes[] = {
    {TensorType::F32, "F32", 1, 4},    {TensorType::F16, "F16", 1, 2},
    {TensorType::Q4_0, "Q4_0", 32, 18}, {TensorType::Q4_1, "Q4_1", 32, 20},
    {TensorType::Q8_0, "Q8_0", 32, 34}, {TensorType::BF16, "BF16", 1, 2},
};

inline std::optional<TensorTypeInfo> tensor_type_info(uint32_t id) {
  for (const auto& info : kTensorTypes) {
    if (static_cast<uint32_t>(info.type) == id) return info;
  }
  return std::nullopt;
}

inline const TensorTypeInfo& tensor_type_info(TensorType type) {
  for (const auto& info : kTensorTypes) {
    if (info.type == type) return info;
  }
  return kTensorTypes[0];  // unreachable: every enumerator is in the table
}

// general.file_type (gguf-py LlamaFileType).
enum class FileType : uint32_t { AllF32 = 0, MostlyF16 = 1, MostlyQ4_0 = 2, MostlyQ4_1 = 3,
                                 MostlyQ8_0 = 7, MostlyBF16 = 32 };

}  // namespace qforge::gguf
