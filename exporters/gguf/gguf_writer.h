#pragma once
// A GGUF v3 file writer: header, key/value metadata, tensor infos, then the tensor data padded
// to general.alignment (32), laid out as gguf-py's GGUFWriter lays it out (every tensor's data
// padded to the alignment, the last one too). Metadata and tensor infos are collected first;
// write() then streams the data one tensor at a time through a callback, so only one tensor's
// bytes are held at once. The file appears atomically (a temporary beside it, renamed on
// success).
#include <cstdint>
#include <filesystem>
#include <functional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "ir/gguf_types.h"

namespace qforge::gguf {

struct TensorInfo {
  std::string name;
  std::vector<uint64_t> ne;  // ne[0] innermost: a row-major (out, in) weight is {in, out}
  TensorType type = TensorType::F32;
  uint64_t offset = 0;  // from the start of the data section, aligned
  uint64_t nbytes = 0;
};

class GgufWriter {
 public:
  GgufWriter() = default;

  // Metadata, written in the order added. A key given twice is an Internal error.
  void add_u32(const std::string& key, uint32_t v);
  void add_i32(const std::string& key, int32_t v);
  void add_u64(const std::string& key, uint64_t v);
  void add_f32(const std::string& key, float v);
  void add_bool(const std::string& key, bool v);
  void add_string(const std::string& key, const std::string& v);
  void add_string_array(const std::string& key, std::span<const std::string> v);
  void add_i32_array(const std::string& key, std::span<const int32_t> v);
  void add_f32_array(const std::string& key, std::span<const float> v);

  // A tensor of `type` with dims `ne` (innermost first); its size follows from the type's
  // block layout (InvalidInput when ne[0] is not a whole number of blocks). Returns its index.
  size_t add_tensor(const std::string& name, std::vector<uint64_t> ne, TensorType type);

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  size_t kv_count() const { return kv_count_; }

  // Fills tensor i's bytes (exactly tensors()[i].nbytes).
  using FillTensor = std::function<void(size_t index, std::span<std::byte> out)>;
  // Writes the whole file to `path` atomically, calling `fill` for each tensor in order.
  void write(const std::filesystem::path& path, const FillTensor& fill) const;

 private:
  void begin_kv(const std::string& key, ValueType type);
  std::vector<std::byte> kv_;
  size_t kv_count_ = 0;
  std::set<std::string> keys_;
  std::set<std::string> names_;
  std::vector<TensorInfo> tensors_;
  uint64_t data_size_ = 0;
};

}  // namespace qforge::gguf
