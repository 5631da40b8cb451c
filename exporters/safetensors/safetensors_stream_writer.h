#pragma once
// Safetensors written tensor by tensor: each tensor's data goes to disk as it is added, so a
// caller can produce a large model's tensors one at a time and drop each once added (bounded
// memory). A shard's header needs every tensor of the shard, so its data is first written to a
// temporary file and the shard assembled (header, then the data copied in the kernel) when it
// closes. Tensors keep the order they were added in, in the file and in the header's offsets.
// Names and sharding follow export_safetensors (safetensors_writer.h): one file `out`, or
// "STEM-0000N-of-0000M.safetensors" shards of at most max_shard_size data bytes (a larger tensor
// alone) with "out.index.json". Nothing is renamed into place before finish(); destroyed before,
// the writer removes what it wrote.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "ir/tensor.h"

namespace qforge {

class SafetensorsStreamWriter {
 public:
  // `metadata` is each file's `__metadata__`. max_shard_size 0: one file.
  SafetensorsStreamWriter(std::filesystem::path out, uint64_t max_shard_size,
                          std::map<std::string, std::string> metadata);
  ~SafetensorsStreamWriter();
  SafetensorsStreamWriter(const SafetensorsStreamWriter&) = delete;
  SafetensorsStreamWriter& operator=(const SafetensorsStreamWriter&) = delete;

  // Writes `tensor`'s bytes now (then releases its mapped pages: ir/page_release.h). Throws
  // InvalidInput for a repeated name, "__metadata__" or a tensor without data, Internal for a
  // 4-bit tensor (no safetensors dtype), IO when a file cannot be written.
  void add(const std::string& name, const Tensor& tensor);
  uint64_t data_bytes() const { return total_; }
  // Completes the last shard, renames every file into place, the index last.
  void finish();

 private:
  struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    uint64_t size;
  };
  struct Shard {
    std::vector<Entry> entries;
    uint64_t bytes = 0;
    std::filesystem::path assembled;  // the complete file, under a temporary name
  };
  void open_data();
  void close_shard();
  std::filesystem::path temp_name(const std::string& what) const;

  std::filesystem::path out_;
  uint64_t max_shard_size_;
  std::map<std::string, std::string> metadata_;
  std::vector<Shard> shards_;
  std::FILE* data_ = nullptr;
  std::filesystem::path data_path_;
  std::vector<std::filesystem::path> temps_;  // removed unless finished
  std::set<std::string> names_;
  uint64_t total_ = 0;
  bool finished_ = false;
};

}  // namespace qforge
