#include "importers/torch/zip_reader.h"

#include <algorithm>

#include "importers/torch/byte_io.h"
#include "ir/error.h"

namespace qforge {

using torch_detail::add_overflows;
using torch_detail::as_chars;
using torch_detail::fits;
using torch_detail::load_le;
using torch_detail::printable;
using torch_detail::quote;

namespace {

constexpr uint32_t kEocdSig = 0x06054b50;
constexpr uint32_t kZip64LocatorSig = 0x07064b50;
constexpr uint32_t kZip64EocdSig = 0x06064b50;
constexpr uint32_t kCentralSig = 0x02014b50;
constexpr uint32_t kLocalSig = 0x04034b50;
constexpr uint64_t kEocdSize = 22;
constexpr uint64_t kZip64LocatorSize = 20;
constexpr uint64_t kZip64EocdSize = 56;
constexpr uint64_t kCentralSize = 46;
constexpr uint64_t kLocalSize = 30;
constexpr uint64_t kMaxComment = 0xffff;
// torch archives hold a handful of entries per storage; a million is far beyond any real one.
constexpr uint64_t kMaxEntries = uint64_t{1} << 20;

struct EndRecord {
  uint64_t entries = 0;
  uint64_t cd_size = 0;
  uint64_t cd_offset = 0;
  uint64_t cd_limit = 0;  // the directory must end before this offset
};

class Parser {
 public:
  Parser(std::span<const std::byte> bytes, std::string_view label)
      : b_(bytes), size_(bytes.size()), label_(label) {}

  [[noreturn]] void bad(const std::string& what) const {
    fail_invalid(quote(label_) + " is not a valid zip archive: " + what +
                 "; the file is truncated or corrupt");
  }
  template <typename T>
  T at(uint64_t offset) const {
    return load_le<T>(b_.data() + offset);
  }

  EndRecord find_end() const {
    if (size_ < kEocdSize) {
      bad("at " + std::to_string(size_) + " bytes it is too small to hold a zip directory");
    }
    const uint64_t last = size_ - kEocdSize;
    const uint64_t first = last > kMaxComment ? last - kMaxComment : 0;
    for (uint64_t pos = last + 1; pos-- > first;) {
      if (at<uint32_t>(pos) == kEocdSig && pos + kEocdSize + at<uint16_t>(pos + 20) == size_) {
        return read_end(pos);
      }
    }
    bad("no end of central directory record in its last 64 KiB");
  }

  EndRecord read_end(uint64_t pos) const {
    if (at<uint16_t>(pos + 4) != 0 || at<uint16_t>(pos + 6) != 0 ||
        at<uint16_t>(pos + 8) != at<uint16_t>(pos + 10)) {
      fail_unsupported(quote(label_) +
                       " is a multi-disk zip archive, which qforge does not read; join it "
                       "into one file");
    }
    EndRecord end{at<uint16_t>(pos + 10), at<uint32_t>(pos + 12), at<uint32_t>(pos + 16), pos};
    if (pos >= kZip64LocatorSize && at<uint32_t>(pos - kZip64LocatorSize) == kZip64LocatorSig) {
      read_zip64(pos - kZip64LocatorSize, end);
    }
    if (!fits(end.cd_offset, end.cd_size, end.cd_limit)) {
      bad("central directory (offset " + std::to_string(end.cd_offset) + ", " +
          std::to_string(end.cd_size) + " bytes) lies beyond its end record at byte " +
          std::to_string(end.cd_limit));
    }
    if (end.entries > end.cd_size / kCentralSize) {
      bad("end record claims " + std::to_string(end.entries) + " entries but the " +
          std::to_string(end.cd_size) + "-byte central directory cannot hold them");
    }
    if (end.entries > kMaxEntries) {
      fail_unsupported(quote(label_) + " holds " + std::to_string(end.entries) +
                       " zip entries, more than qforge's limit of " + std::to_string(kMaxEntries));
    }
    return end;
  }

  void read_zip64(uint64_t locator, EndRecord& end) const {
    const auto record = at<uint64_t>(locator + 8);
    if (at<uint32_t>(locator + 4) != 0 || at<uint32_t>(locator + 16) > 1) {
      fail_unsupported(quote(label_) + " is a multi-disk zip archive, which qforge does not read");
    }
    if (!fits(record, kZip64EocdSize, locator) || at<uint32_t>(record) != kZip64EocdSig) {
      bad("ZIP64 locator at byte " + std::to_string(locator) +
          " points to no ZIP64 end record (offset " + std::to_string(record) + ")");
    }
    if (at<uint32_t>(record + 16) != 0 || at<uint32_t>(record + 20) != 0 ||
        at<uint64_t>(record + 24) != at<uint64_t>(record + 32)) {
      fail_unsupported(quote(label_) + " is a multi-disk zip archive, which qforge does not read");
    }
    end = {at<uint64_t>(record + 32), at<uint64_t>(record + 40), at<uint64_t>(record + 48), record};
  }

  // Reads one central directory record at `pos` (inside [pos, limit)); returns the next pos.
  uint64_t read_entry(uint64_t pos, uint64_t limit, ZipEntry& e) const {
    if (!fits(pos, kCentralSize, limit) || at<uint32_t>(pos) != kCentralSig) {
      bad("no central directory record at byte " + std::to_string(pos));
    }
    e.flags = at<uint16_t>(pos + 8);
    e.method = at<uint16_t>(pos + 10);
    e.compressed_size = at<uint32_t>(pos + 20);
    e.size = at<uint32_t>(pos + 24);
    const uint64_t name_len = at<uint16_t>(pos + 28);
    const uint64_t extra_len = at<uint16_t>(pos + 30);
    const uint64_t comment_len = at<uint16_t>(pos + 32);
    e.local_header_offset = at<uint32_t>(pos + 42);
    const uint64_t var = name_len + extra_len + comment_len;
    if (!fits(pos + kCentralSize, var, limit)) {
      bad("central directory record at byte " + std::to_string(pos) +
          " runs past the end of the directory");
    }
    e.name.assign(as_chars(b_.subspan(pos + kCentralSize, name_len)));
    read_zip64_extra(b_.subspan(pos + kCentralSize + name_len, extra_len), e);
    return pos + kCentralSize + var;
  }

  // ZIP64 extended information (0x0001): 8-byte values for each saturated field, in order.
  void read_zip64_extra(std::span<const std::byte> extra, ZipEntry& e) const {
    const bool need_size = e.size == 0xffffffffu;
    const bool need_comp = e.compressed_size == 0xffffffffu;
    const bool need_offset = e.local_header_offset == 0xffffffffu;
    bool found = false;
    for (uint64_t p = 0; p + 4 <= extra.size();) {
      const auto id = load_le<uint16_t>(extra.data() + p);
      const uint64_t len = load_le<uint16_t>(extra.data() + p + 2);
      if (!fits(p + 4, len, extra.size())) {
        bad("entry '" + printable(e.name) + "' has an extra field running past its record");
      }
      if (id == 0x0001) {
        const auto field = extra.subspan(p + 4, len);
        uint64_t q = 0;
        auto take = [&](uint64_t& value) {
          if (q + 8 > field.size()) {
            bad("entry '" + printable(e.name) + "' has a ZIP64 extra field too short for " +
                "its saturated sizes");
          }
          value = load_le<uint64_t>(field.data() + q);
          q += 8;
        };
        if (need_size) take(e.size);
        if (need_comp) take(e.compressed_size);
        if (need_offset) take(e.local_header_offset);
        found = true;
      }
      p += 4 + len;
    }
    if ((need_size || need_comp || need_offset) && !found) {
      bad("entry '" + printable(e.name) + "' has 32-bit sizes at their maximum and no ZIP64 " +
          "extra field");
    }
  }

  void check_name(const ZipEntry& e) const {
    const std::string_view n = e.name;
    std::string why;
    if (n.empty()) why = "is empty";
    if (n.find('\0') != std::string_view::npos) why = "holds a NUL byte";
    if (!n.empty() && (n[0] == '/' || n[0] == '\\' || (n.size() > 1 && n[1] == ':'))) {
      why = "is an absolute path";
    }
    size_t start = 0;
    while (why.empty() && start <= n.size()) {
      const size_t end = std::min(n.find_first_of("/\\", start), n.size());
      if (n.substr(start, end - start) == "..") why = "holds a '..' component";
      start = end + 1;
    }
    if (!why.empty()) {
      fail_invalid(quote(label_) + " has a zip entry named '" + printable(n) + "', which " + why +
                   "; qforge only reads relative names inside the archive");
    }
  }

  void locate_data(ZipEntry& e) const {
    const uint64_t lho = e.local_header_offset;
    if (!fits(lho, kLocalSize, size_) || at<uint32_t>(lho) != kLocalSig) {
      bad("entry '" + printable(e.name) + "' has no local header at byte " + std::to_string(lho));
    }
    const uint64_t header = kLocalSize + at<uint16_t>(lho + 26) + at<uint16_t>(lho + 28);
    if (add_overflows(lho, header, e.data_offset) ||
        !fits(e.data_offset, e.compressed_size, size_)) {
      bad("entry '" + printable(e.name) + "' data (" + std::to_string(e.compressed_size) +
          " bytes after its local header at byte " + std::to_string(lho) +
          ") extends past the end of the file (" + std::to_string(size_) + " bytes)");
    }
    if (e.method == 0 && e.compressed_size != e.size) {
      bad("stored entry '" + printable(e.name) + "' has compressed size " +
          std::to_string(e.compressed_size) + " but size " + std::to_string(e.size));
    }
  }

 private:
  std::span<const std::byte> b_;
  uint64_t size_;
  std::string_view label_;
};

}  // namespace

ZipDirectory ZipDirectory::parse(std::span<const std::byte> bytes, std::string_view label) {
  const Parser parser(bytes, label);
  const EndRecord end = parser.find_end();
  ZipDirectory dir;
  dir.entries_.reserve(end.entries);
  const uint64_t limit = end.cd_offset + end.cd_size;
  uint64_t pos = end.cd_offset;
  for (uint64_t i = 0; i < end.entries; ++i) {
    ZipEntry e;
    pos = parser.read_entry(pos, limit, e);
    parser.check_name(e);
    parser.locate_data(e);
    if (!dir.index_.emplace(e.name, dir.entries_.size()).second) {
      fail_invalid(quote(label) + " holds the zip entry '" + printable(e.name) +
                   "' twice; an archive with duplicate names is ambiguous, re-save it");
    }
    dir.entries_.push_back(std::move(e));
  }
  return dir;
}

const ZipEntry* ZipDirectory::find(std::string_view name) const {
  const auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &entries_[it->second];
}

std::span<const std::byte> ZipDirectory::data(std::span<const std::byte> bytes,
                                              const ZipEntry& entry, std::string_view label) const {
  if (entry.flags & 1u) {
    fail_unsupported("zip entry '" + printable(entry.name) + "' in '" + std::string(label) +
                     "' is encrypted; qforge reads only unencrypted archives");
  }
  if (entry.method != 0) {
    fail_unsupported("zip entry '" + printable(entry.name) + "' in '" + std::string(label) +
                     "' is compressed (method " + std::to_string(entry.method) +
                     "); qforge reads only stored entries, as torch.save writes them — "
                     "re-save the file with torch.save");
  }
  if (!fits(entry.data_offset, entry.size, bytes.size())) {
    fail_internal("zip entry '" + printable(entry.name) + "' read against different bytes");
  }
  return bytes.subspan(entry.data_offset, entry.size);
}

ZipReader ZipReader::open(const std::filesystem::path& path) {
  return ZipReader(MappedFile::open(path));
}

ZipReader::ZipReader(std::shared_ptr<const MappedFile> file)
    : file_(std::move(file)),
      storage_(std::make_shared<MappedStorage>(file_)),
      dir_(ZipDirectory::parse(file_->bytes(), file_->path().string())) {}

std::string ZipReader::label() const { return file_->path().string(); }

std::span<const std::byte> ZipReader::entry(std::string_view name) const {
  const ZipEntry* e = dir_.find(name);
  if (e == nullptr) {
    fail_invalid(quote(label()) + " has no zip entry '" + printable(name) + "'");
  }
  return dir_.data(file_->bytes(), *e, label());
}

Tensor ZipReader::tensor_window(std::string_view name, uint64_t byte_offset, DType dtype,
                                Shape shape) const {
  const auto data = entry(name);
  const uint64_t numel = shape_numel(shape);
  const auto nbytes = dtype_storage_bytes(dtype, numel);
  if (!nbytes || !fits(byte_offset, *nbytes, data.size())) {
    fail_invalid(quote(label()) + ": a " + std::string(dtype_name(dtype)) + " tensor of shape " +
                 shape_to_string(shape) + " at byte " + std::to_string(byte_offset) +
                 " does not fit in zip entry '" + printable(name) + "' (" +
                 std::to_string(data.size()) + " bytes)");
  }
  const auto file_offset = static_cast<size_t>(data.data() - file_->bytes().data());
  return {dtype, std::move(shape), storage_, file_offset + static_cast<size_t>(byte_offset)};
}

}  // namespace qforge
