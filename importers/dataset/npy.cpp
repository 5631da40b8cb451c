#include "importers/dataset/npy.h"

#include <array>
#include <cstring>
#include <limits>
#include <optional>
#include <set>

#include "importers/dataset/npy_header.h"
#include "ir/error.h"
#include "ir/mapped_file.h"

namespace qforge {

namespace {

uint64_t read_le(std::span<const std::byte> b, size_t off, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= static_cast<uint64_t>(b[off + i]) << (8 * i);
  return v;
}

// ---- zip (np.savez): central directory, stored entries, ZIP64 -----------------------------

uint32_t crc32(std::span<const std::byte> data) {
  static const auto table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1u) ? 0xedb88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t c = 0xffffffffu;
  for (std::byte b : data) c = table[(c ^ static_cast<uint8_t>(b)) & 0xffu] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

struct ZipEntry {
  std::string name;
  uint16_t method = 0, flags = 0;
  uint32_t crc = 0;
  uint64_t compressed = 0, size = 0, local_offset = 0;
};

class ZipReader {
 public:
  ZipReader(std::span<const std::byte> b, std::string_view source) : b_(b), source_(source) {}

  std::vector<ZipEntry> entries() {
    const size_t eocd = find_eocd();
    uint64_t count = read(eocd + 10, 2);
    uint64_t cd_size = read(eocd + 12, 4);
    uint64_t cd_offset = read(eocd + 16, 4);
    if (count == 0xffff || cd_size == 0xffffffffu || cd_offset == 0xffffffffu) {
      // ZIP64: the locator sits right before the classic record.
      if (eocd < 20 || read(eocd - 20, 4) != 0x07064b50u) bad(eocd, "ZIP64 locator missing");
      const uint64_t rec = read(eocd - 20 + 8, 8);
      need(rec, 56, "ZIP64 end record");
      if (read(rec, 4) != 0x06064b50u) bad(rec, "bad ZIP64 end record signature");
      count = read(rec + 32, 8);
      cd_size = read(rec + 40, 8);
      cd_offset = read(rec + 48, 8);
    }
    need(cd_offset, cd_size, "central directory");
    if (count > cd_size / 46) bad(cd_offset, "entry count exceeds the central directory");
    std::vector<ZipEntry> out;
    uint64_t p = cd_offset;
    for (uint64_t i = 0; i < count; ++i) {
      need(p, 46, "central directory entry");
      if (read(p, 4) != 0x02014b50u) bad(p, "bad central directory signature");
      ZipEntry e;
      e.flags = static_cast<uint16_t>(read(p + 8, 2));
      e.method = static_cast<uint16_t>(read(p + 10, 2));
      e.crc = static_cast<uint32_t>(read(p + 16, 4));
      e.compressed = read(p + 20, 4);
      e.size = read(p + 24, 4);
      const uint64_t name_len = read(p + 28, 2), extra_len = read(p + 30, 2);
      const uint64_t comment_len = read(p + 32, 2);
      e.local_offset = read(p + 42, 4);
      need(p + 46, name_len + extra_len + comment_len, "central directory entry");
      e.name.assign(reinterpret_cast<const char*>(b_.data() + p + 46), name_len);
      read_zip64_extra(p + 46 + name_len, extra_len, e);
      out.push_back(std::move(e));
      p += 46 + name_len + extra_len + comment_len;
    }
    if (p > cd_offset + cd_size) bad(cd_offset, "central directory overruns its size");
    return out;
  }

  // The stored bytes of `e`, checked: local header, bounds, method, CRC-32.
  std::span<const std::byte> data(const ZipEntry& e) {
    if (e.flags & 1u) {
      fail_unsupported("'" + std::string(source_) + "': entry '" + e.name + "' is encrypted");
    }
    if (e.method != 0) {
      fail_unsupported("'" + std::string(source_) + "': entry '" + e.name +
                       "' is compressed (method " + std::to_string(e.method) +
                       ", e.g. np.savez_compressed); qforge reads uncompressed archives only: "
                       "re-save with np.savez");
    }
    if (e.compressed != e.size) bad(e.local_offset, "stored entry '" + e.name + "' sizes differ");
    need(e.local_offset, 30, "local header of '" + e.name + "'");
    if (read(e.local_offset, 4) != 0x04034b50u) bad(e.local_offset, "bad local header signature");
    const uint64_t start =
        e.local_offset + 30 + read(e.local_offset + 26, 2) + read(e.local_offset + 28, 2);
    need(start, e.size, "data of '" + e.name + "'");
    const auto d = b_.subspan(start, e.size);
    if (crc32(d) != e.crc) bad(start, "CRC-32 mismatch in entry '" + e.name + "'");
    return d;
  }

 private:
  [[noreturn]] void bad(uint64_t at, const std::string& what) const {
    fail_invalid("'" + std::string(source_) + "' is not a valid .npz archive: " + what + " (byte " +
                 std::to_string(at) + ")");
  }
  void need(uint64_t off, uint64_t len, const std::string& what) const {
    if (off > b_.size() || len > b_.size() - off) bad(off, what + " lies outside the file");
  }
  uint64_t read(uint64_t off, size_t n) const {
    need(off, n, "a field");
    return read_le(b_, off, n);
  }
  size_t find_eocd() const {
    if (b_.size() < 22) bad(0, "file too short for a zip archive");
    const size_t lowest = b_.size() > 22 + 65535 ? b_.size() - 22 - 65535 : 0;
    for (size_t p = b_.size() - 22 + 1; p-- > lowest;) {
      if (read_le(b_, p, 4) == 0x06054b50u) return p;
    }
    bad(b_.size(), "no end of central directory record (not a zip file)");
  }
  void read_zip64_extra(uint64_t p, uint64_t len, ZipEntry& e) const {
    const uint64_t end = p + len;
    while (p + 4 <= end) {
      const uint64_t id = read(p, 2), sz = read(p + 2, 2);
      if (p + 4 + sz > end) bad(p, "extra field overruns its entry");
      if (id == 0x0001) {  // values present only for fields that overflowed
        uint64_t q = p + 4;
        auto take = [&](uint64_t& field) {
          if (field != 0xffffffffu) return;
          if (q + 8 > p + 4 + sz) bad(q, "ZIP64 extra field too short");
          field = read(q, 8);
          q += 8;
        };
        take(e.size);
        take(e.compressed);
        take(e.local_offset);
      }
      p += 4 + sz;
    }
  }

  std::span<const std::byte> b_;
  std::string_view source_;
};

}  // namespace

Tensor parse_npy(std::span<const std::byte> b, std::string_view source) {
  const std::string src(source);
  const NpyHeader h = parse_npy_header(b, "'" + src + "'");
  if (h.data_bytes != b.size() - h.data_offset) {
    fail_invalid("'" + src + "' holds " + std::to_string(b.size() - h.data_offset) +
                 " data bytes but its header says " + h.descr + " " + shape_to_string(h.shape));
  }
  Tensor t(h.dtype, h.shape);
  if (h.data_bytes > 0) {
    std::memcpy(t.mutable_bytes().data(), b.data() + h.data_offset, h.data_bytes);
  }
  if (h.dtype == DType::Bool) {
    for (std::byte v : t.bytes()) {
      if (static_cast<uint8_t>(v) > 1)
        fail_invalid("'" + src + "' has a bool byte other than 0 or 1");
    }
  }
  return t;
}

Tensor read_npy(const std::filesystem::path& path) {
  const auto file = MappedFile::open(path);
  return parse_npy(file->bytes(), path.string());
}

std::vector<std::pair<std::string, Tensor>> parse_npz(std::span<const std::byte> bytes,
                                                      std::string_view source) {
  ZipReader zip(bytes, source);
  const std::string src(source);
  const auto fail_entry = [&src](const std::string& what) {
    fail_invalid("'" + src + "' " + what);
  };
  const auto entry_source = [&src](const std::string& entry) { return src + ":" + entry; };
  std::vector<std::pair<std::string, Tensor>> out;
  std::set<std::string> seen;
  for (const ZipEntry& e : zip.entries()) {
    if (e.name.size() < 5 || e.name.substr(e.name.size() - 4) != ".npy") {
      fail_entry("has entry '" + e.name + "', which is not an .npy array");
    }
    std::string name = e.name.substr(0, e.name.size() - 4);
    if (!seen.insert(name).second) {
      fail_entry("holds array '" + name + "' twice");
    }
    Tensor t = parse_npy(zip.data(e), entry_source(e.name));
    out.emplace_back(std::move(name), std::move(t));
  }
  return out;
}

std::vector<std::pair<std::string, Tensor>> read_npz(const std::filesystem::path& path) {
  const auto file = MappedFile::open(path);
  return parse_npz(file->bytes(), path.string());
}

}  // namespace qforge
