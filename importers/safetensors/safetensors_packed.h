#pragma once
// Metadata keys that carry 4-bit tensors through safetensors, which has no 4-bit dtype: the
// tensor is stored as U8 of its packed bytes (two values per byte, low nibble first) and
//   qforge.dtype.<tensor> = "i4" | "u4"
//   qforge.shape.<tensor> = logical shape as a compact JSON array, e.g. "[3,5]"
// exporters/safetensors writes the same keys (exporters may not include importers).
#include <string_view>

namespace qforge::safetensors_detail {

inline constexpr std::string_view kPackedDTypePrefix = "qforge.dtype.";
inline constexpr std::string_view kPackedShapePrefix = "qforge.shape.";

}  // namespace qforge::safetensors_detail
