#pragma once
// One safetensors file: header building and writing. Internal to the safetensors exporter;
// callers use safetensors_writer.h.
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "ir/tensor.h"

namespace qforge::safetensors_out {

struct OutTensor {
  std::string name;
  const Tensor* tensor = nullptr;
};

// Metadata entries that let a reader restore a 4-bit tensor stored as U8 bytes.
inline constexpr std::string_view kPackedDTypePrefix = "qforge.dtype.";
inline constexpr std::string_view kPackedShapePrefix = "qforge.shape.";

// Orders `tensors` as the file stores them (dtype alignment descending, then name) and returns
// the JSON header padded with spaces to a multiple of 8 bytes. `metadata` is written as
// `__metadata__` (omitted when empty) after adding the packed 4-bit entries.
std::string build_safetensors_header(std::vector<OutTensor>& tensors,
                                     std::map<std::string, std::string> metadata);

// Writes a complete file at `path` (opened, written and closed here; no rename).
void write_safetensors_file(const std::filesystem::path& path, std::vector<OutTensor> tensors,
                            const std::map<std::string, std::string>& metadata);

}  // namespace qforge::safetensors_out
