#pragma once
// Reads a GGUF file (v2 or v3): header, key/value metadata, tensor infos and where each
// tensor's data lies. Follows llama.cpp's gguf.cpp hardening: every count, string and array
// length is checked against the bytes left before anything is allocated and capped; sizes are
// overflow-checked; duplicate keys and duplicate tensor names are refused; general.alignment
// must be a power of two; every tensor's type must be known, its row a whole number of
// blocks, its offset aligned, and its data inside the file without overlapping another's.
// Each failure is one InvalidInput (or Unsupported for a valid but unknown type) naming the
// file, the byte offset and what was wrong.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ir/gguf_types.h"
#include "ir/mapped_file.h"

namespace qforge::gguf {

struct KeyValue {
  std::string key;
  ValueType type = ValueType::U8;
  ValueType element_type = ValueType::U8;  // arrays only
  nlohmann::json value;                    // a number, bool, string, or an array of them
};

struct TensorEntry {
  std::string name;
  std::vector<uint64_t> ne;  // innermost first
  TensorType type = TensorType::F32;
  uint64_t offset = 0;  // from the start of the data section
  uint64_t nbytes = 0;
};

struct GgufFile {
  uint32_t version = 0;
  uint64_t alignment = kDefaultAlignment;
  uint64_t data_offset = 0;  // where the data section starts in the file
  std::vector<KeyValue> metadata;
  std::vector<TensorEntry> tensors;

  const KeyValue* find(const std::string& key) const;
  const TensorEntry* find_tensor(const std::string& name) const;
};

// Caps that bound what a hostile header can make the reader allocate.
inline constexpr uint64_t kMaxStringBytes = uint64_t{1} << 30;
inline constexpr uint64_t kMaxTensors = uint64_t{1} << 20;
inline constexpr uint64_t kMaxKeyValues = uint64_t{1} << 20;

// Parses a whole file's bytes; `file` names it in errors.
GgufFile parse_gguf(std::span<const std::byte> bytes, const std::string& file);

// A mapped GGUF file with its parsed header.
struct GgufModel {
  std::shared_ptr<const MappedFile> map;
  GgufFile file;
  std::span<const std::byte> tensor_data(const TensorEntry& t) const;
};

// Throws IO when `path` cannot be read, InvalidInput when it is not a valid GGUF file.
GgufModel read_gguf(const std::filesystem::path& path);

// True when the file starts with the GGUF magic.
bool looks_like_gguf(const std::filesystem::path& path);

}  // namespace qforge::gguf
