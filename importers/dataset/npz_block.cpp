// .npz archives and .npy files as data blocks. Stored arrays are read as windows of the mapped
// file (copied only when misaligned for their dtype); compressed ones are inflated row by row.
// Either way a data set is never loaded whole.
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "importers/dataset/data_block.h"
#include "importers/dataset/inflate_stream.h"
#include "importers/dataset/npy_header.h"
#include "importers/torch/byte_io.h"
#include "importers/torch/zip_reader.h"
#include "ir/error.h"
#include "ir/mapped_file.h"

namespace qforge::dataset_detail {

using torch_detail::fits;
using torch_detail::load_le;
using torch_detail::printable;
using torch_detail::quote;

uint64_t row_bytes(const BlockArray& a) {
  if (a.shape.empty()) return 0;
  const Shape row(a.shape.begin() + 1, a.shape.end());
  return *dtype_storage_bytes(a.dtype, shape_numel(row));  // the whole array's size was checked
}

namespace {

Shape rows_shape(const BlockArray& a, int64_t count) {
  Shape s = a.shape;
  if (!s.empty()) s[0] = count;
  return s;
}

// Byte range of rows [first, first + count) inside the array's data.
std::pair<uint64_t, uint64_t> row_range(const BlockArray& a, int64_t first, int64_t count) {
  if (a.shape.empty()) return {0, dtype_storage_bytes(a.dtype, 1).value()};
  const uint64_t rb = row_bytes(a);
  return {static_cast<uint64_t>(first) * rb, static_cast<uint64_t>(count) * rb};
}

class ArraySource {
 public:
  virtual ~ArraySource() = default;
  virtual Tensor rows(const BlockArray& a, int64_t first, int64_t count) = 0;
};

// An array lying in a mapped file at `data_begin`. When it is a stored zip entry, the entry's
// CRC-32 is checked once reads have covered it front to back.
class MappedArray final : public ArraySource {
 public:
  MappedArray(std::shared_ptr<const MappedFile> file, uint64_t data_begin)
      : file_(std::move(file)),
        storage_(std::make_shared<MappedStorage>(file_)),
        data_begin_(data_begin) {}

  void check_crc(uint64_t entry_begin, uint64_t entry_size, uint32_t crc, std::string source) {
    crc_ = Crc{entry_begin, entry_size,       crc, static_cast<uint32_t>(::crc32(0L, Z_NULL, 0)),
               0,           std::move(source)};
  }

  Tensor rows(const BlockArray& a, int64_t first, int64_t count) override {
    const auto [offset, length] = row_range(a, first, count);
    const uint64_t at = data_begin_ + offset;
    if (crc_) extend_crc(at + length);
    const size_t elem = std::max<size_t>(1, static_cast<size_t>(dtype_bits(a.dtype)) / 8);
    if (at % elem == 0) return {a.dtype, rows_shape(a, count), storage_, static_cast<size_t>(at)};
    // misaligned for its dtype: a copy
    return Tensor::copy_of(a.dtype, rows_shape(a, count), file_->bytes().subspan(at, length));
  }

 private:
  struct Crc {
    uint64_t begin, size;
    uint32_t expected, running;
    uint64_t done;  // entry bytes summed so far
    std::string source;
  };

  void extend_crc(uint64_t file_end) {
    Crc& c = *crc_;
    const uint64_t end = std::min(file_end - c.begin, c.size);
    if (end <= c.done) return;
    const std::byte* base = file_->bytes().data() + c.begin;
    while (c.done < end) {
      const auto n = static_cast<uInt>(std::min<uint64_t>(end - c.done, uint64_t{1} << 30));
      c.running = static_cast<uint32_t>(
          ::crc32(c.running, reinterpret_cast<const Bytef*>(base + c.done), n));
      c.done += n;
    }
    if (c.done == c.size && c.running != c.expected) {
      fail_invalid(c.source + " fails its CRC-32 check; the archive is corrupt");
    }
  }

  std::shared_ptr<const MappedFile> file_;
  std::shared_ptr<const Storage> storage_;
  uint64_t data_begin_;
  std::optional<Crc> crc_;
};

// An array inside a deflated zip entry, inflated as rows are asked for.
class DeflatedArray final : public ArraySource {
 public:
  DeflatedArray(std::shared_ptr<const MappedFile> file, std::unique_ptr<InflateStream> stream,
                uint64_t data_offset)
      : file_(std::move(file)), stream_(std::move(stream)), data_offset_(data_offset) {}

  Tensor rows(const BlockArray& a, int64_t first, int64_t count) override {
    const auto [offset, length] = row_range(a, first, count);
    const uint64_t at = data_offset_ + offset;
    if (at < stream_->position()) stream_->restart();
    stream_->skip(at - stream_->position());
    Tensor t(a.dtype, rows_shape(a, count));
    stream_->read(t.mutable_bytes().first(static_cast<size_t>(length)));
    return t;
  }

 private:
  std::shared_ptr<const MappedFile> file_;  // the stream reads the mapped bytes
  std::unique_ptr<InflateStream> stream_;
  uint64_t data_offset_;
};

class ArrayBlock final : public DataBlock {
 public:
  explicit ArrayBlock(std::string source) : DataBlock(std::move(source)) {}
  void add(BlockArray a, std::unique_ptr<ArraySource> src) {
    arrays_.push_back(std::move(a));
    sources_.push_back(std::move(src));
  }
  Tensor read(size_t index, int64_t first, int64_t count) override {
    return sources_.at(index)->rows(arrays_.at(index), first, count);
  }

 private:
  std::vector<std::unique_ptr<ArraySource>> sources_;
};

void check_size(const NpyHeader& h, uint64_t available, const std::string& source) {
  if (h.data_offset + h.data_bytes != available) {
    fail_invalid(source + " holds " +
                 std::to_string(available - std::min(available, h.data_offset)) +
                 " data bytes but its header says " + std::string(dtype_name(h.dtype)) + " " +
                 shape_to_string(h.shape) + " (" + std::to_string(h.data_bytes) +
                 " bytes); the file is truncated or corrupt");
  }
}

// The CRC-32 of an entry: in its local header, or in the data descriptor after its data when
// general-purpose flag bit 3 is set.
uint32_t entry_crc(std::span<const std::byte> file, const ZipEntry& e, const std::string& source) {
  uint64_t at = e.local_header_offset + 14;
  if (e.flags & 8u) {
    at = e.data_offset + e.compressed_size;
    if (fits(at, 4, file.size()) && load_le<uint32_t>(file.data() + at) == 0x08074b50u) at += 4;
  }
  if (!fits(at, 4, file.size())) {
    fail_invalid(source + " has no CRC-32 inside the file; the archive is truncated");
  }
  return load_le<uint32_t>(file.data() + at);
}

}  // namespace

std::unique_ptr<DataBlock> open_npz_block(const std::filesystem::path& path) {
  const auto file = MappedFile::open(path);
  const std::string label = quote(path.string());
  const ZipDirectory dir = ZipDirectory::parse(file->bytes(), path.string());
  auto block = std::make_unique<ArrayBlock>(label);
  for (const ZipEntry& e : dir.entries()) {
    const std::string source = label + " entry " + quote(printable(e.name));
    if (e.name.size() < 5 || e.name.substr(e.name.size() - 4) != ".npy") {
      fail_invalid(source +
                   " is not an .npy array; an .npz holds NAME.npy entries only "
                   "(write it with numpy.savez)");
    }
    if (e.flags & 1u) fail_unsupported(source + " is encrypted; qforge reads plain archives");
    if (e.method != 0 && e.method != Z_DEFLATED) {
      fail_unsupported(source + " uses compression method " + std::to_string(e.method) +
                       "; qforge reads stored or deflated entries (numpy.savez or "
                       "numpy.savez_compressed)");
    }
    const uint32_t crc = entry_crc(file->bytes(), e, source);
    BlockArray a;
    a.name = e.name.substr(0, e.name.size() - 4);
    if (e.method == 0) {
      const auto data = file->bytes().subspan(e.data_offset, e.size);
      const NpyHeader h = parse_npy_header(data, source);
      check_size(h, e.size, source);
      a.dtype = h.dtype;
      a.shape = h.shape;
      auto src = std::make_unique<MappedArray>(file, e.data_offset + h.data_offset);
      src->check_crc(e.data_offset, e.size, crc, source);
      block->add(std::move(a), std::move(src));
    } else {
      auto stream = std::make_unique<InflateStream>(
          file->bytes().subspan(e.data_offset, e.compressed_size), e.size, crc, source);
      std::vector<std::byte> head(std::min<uint64_t>(kNpyPreamble, e.size));
      stream->read(head);
      head.resize(std::min<uint64_t>(npy_header_size(head, source), e.size));
      stream->read(std::span<std::byte>(head).subspan(std::min<size_t>(kNpyPreamble, head.size())));
      const NpyHeader h = parse_npy_header(head, source);
      check_size(h, e.size, source);
      a.dtype = h.dtype;
      a.shape = h.shape;
      block->add(std::move(a),
                 std::make_unique<DeflatedArray>(file, std::move(stream), h.data_offset));
    }
  }
  if (block->arrays().empty()) fail_invalid(label + " holds no arrays");
  return block;
}

std::unique_ptr<DataBlock> open_npy_block(const std::filesystem::path& path) {
  const auto file = MappedFile::open(path);
  const std::string label = quote(path.string());
  const NpyHeader h = parse_npy_header(file->bytes(), label);
  check_size(h, file->size(), label);
  auto block = std::make_unique<ArrayBlock>(label);
  block->add(BlockArray{"", h.dtype, h.shape}, std::make_unique<MappedArray>(file, h.data_offset));
  return block;
}

}  // namespace qforge::dataset_detail
