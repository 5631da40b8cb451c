#pragma once
// The validated header of one safetensors file: what every tensor is and where its bytes lie.
// Internal to the safetensors importer; callers use safetensors_reader.h.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ir/dtype.h"
#include "ir/tensor.h"

namespace qforge::safetensors_detail {

// The format caps the JSON header at 100 MB, as the Rust reference does.
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct TensorEntry {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  uint64_t begin = 0;  // data_offsets, relative to the end of the header
  uint64_t end = 0;
};

struct Header {
  uint64_t data_start = 0;                                    // file offset of data byte 0
  std::vector<TensorEntry> tensors;                           // sorted by (begin, end, name)
  std::vector<std::pair<std::string, std::string>> metadata;  // __metadata__, sorted by key
};

// Parses and validates the header of a whole safetensors file held in `file`: sizes, UTF-8,
// JSON, duplicate names, dtypes, shapes, lengths, and offsets tiling the data exactly up to
// the end of the file. Throws Error(InvalidInput), or Error(Unsupported) for a dtype qforge
// does not read, with a message starting with `file_name`.
Header parse_safetensors_header(std::span<const std::byte> file, const std::string& file_name);

}  // namespace qforge::safetensors_detail
