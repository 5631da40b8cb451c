#pragma once
// A read-only memory map of a whole file. Tensors hold a shared_ptr to it, so importing a
// checkpoint copies nothing and the map lives as long as any tensor viewing it.
#include <cstddef>
#include <filesystem>
#include <memory>
#include <span>

namespace qforge {

class MappedFile {
 public:
  // Throws Error(IO) naming the path when it cannot be opened or mapped.
  static std::shared_ptr<const MappedFile> open(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::span<const std::byte> bytes() const { return {data_, size_}; }
  size_t size() const { return size_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  MappedFile() = default;
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
  std::filesystem::path path_;
};

}  // namespace qforge
