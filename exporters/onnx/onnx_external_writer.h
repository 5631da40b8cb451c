#pragma once
// The external data file of an ONNX export: tensor bytes appended at 64-byte aligned offsets,
// written to a temporary name beside the model and renamed into place on commit().
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>

#include "exporters/atomic_file.h"

namespace qforge {

class OnnxExternalWriter {
 public:
  static constexpr uint64_t kAlignment = 64;

  // Throws Error(IO) when the folder is missing or the file cannot be created.
  explicit OnnxExternalWriter(const std::filesystem::path& data_path);
  ~OnnxExternalWriter();
  OnnxExternalWriter(const OnnxExternalWriter&) = delete;
  OnnxExternalWriter& operator=(const OnnxExternalWriter&) = delete;

  // Appends `bytes` at the next aligned offset and returns that offset.
  uint64_t append(std::span<const std::byte> bytes);
  // Flushes and closes the temporary file; commit() then renames it into place.
  void close();
  void commit();

  const std::filesystem::path& temp_path() const { return file_.temp_path(); }

 private:
  void write_all(std::span<const std::byte> bytes);

  AtomicFile file_;
  int fd_ = -1;
  uint64_t size_ = 0;
  std::optional<WritebackPacer> writeback_;  // once the file is open
};

}  // namespace qforge
