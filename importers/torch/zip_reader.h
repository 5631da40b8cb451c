#pragma once
// Reads the directory of a zip archive (as torch.save writes it: stored entries, ZIP64
// records, data 64-byte aligned) and hands out entry bytes as spans or zero-copy tensor
// windows of the memory-mapped file. Only stored (uncompressed) entries can be read.
//
// Everything read from the file is checked before use: the directory and every entry's data
// must lie inside the file (overflow-safe), names must be relative without "..", and a name
// may appear once.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "ir/mapped_file.h"
#include "ir/tensor.h"

namespace qforge {

struct ZipEntry {
  std::string name;
  uint16_t method = 0;  // 0 = stored; anything else is compressed and cannot be read
  uint16_t flags = 0;
  uint64_t compressed_size = 0;
  uint64_t size = 0;
  uint64_t local_header_offset = 0;
  uint64_t data_offset = 0;  // first byte of the entry's data in the file
};

// The parsed central directory, in file order, with lookup by name.
class ZipDirectory {
 public:
  // Parses the directory of the zip held in `bytes`; `label` names the file in messages.
  // Throws Error(InvalidInput) for a malformed archive, Error(Unsupported) for multi-disk or
  // encrypted archives.
  static ZipDirectory parse(std::span<const std::byte> bytes, std::string_view label);

  const std::vector<ZipEntry>& entries() const { return entries_; }
  const ZipEntry* find(std::string_view name) const;

  // The data of a stored entry inside `bytes` (the same bytes given to parse). Throws
  // Error(Unsupported) naming the entry when it is compressed or encrypted.
  std::span<const std::byte> data(std::span<const std::byte> bytes, const ZipEntry& entry,
                                  std::string_view label) const;

 private:
  std::vector<ZipEntry> entries_;
  std::unordered_map<std::string, size_t> index_;
};

class ZipReader {
 public:
  // Maps the file; throws Error(IO) if it cannot, InvalidInput if it is not a valid zip.
  static ZipReader open(const std::filesystem::path& path);
  explicit ZipReader(std::shared_ptr<const MappedFile> file);

  const std::filesystem::path& path() const { return file_->path(); }
  const std::vector<ZipEntry>& entries() const { return dir_.entries(); }
  const ZipEntry* find(std::string_view name) const { return dir_.find(name); }

  // Bytes of a stored entry. Throws InvalidInput if there is no such entry, Unsupported if
  // it is compressed.
  std::span<const std::byte> entry(std::string_view name) const;

  // A zero-copy tensor over `shape` elements of `dtype` starting `byte_offset` bytes into
  // the entry's data. Throws InvalidInput when the window does not fit in the entry.
  Tensor tensor_window(std::string_view name, uint64_t byte_offset, DType dtype, Shape shape) const;

  // The storage every window of this archive shares (the whole mapped file).
  const std::shared_ptr<const Storage>& storage() const { return storage_; }

 private:
  std::string label() const;

  std::shared_ptr<const MappedFile> file_;
  std::shared_ptr<const Storage> storage_;
  ZipDirectory dir_;
};

}  // namespace qforge
