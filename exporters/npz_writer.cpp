#include "exporters/npz_writer.h"

#include <zlib.h>

#include <cstdint>
#include <fstream>
#include <limits>
#include <set>
#include <string_view>

#include "exporters/atomic_file.h"
#include "ir/error.h"

namespace qforge {

namespace {

// The .npy descr of each dtype numpy can hold without loss.
std::string_view npy_descr(DType dtype, std::string_view name) {
  switch (dtype) {
    case DType::F32:
      return "<f4";
    case DType::F16:
      return "<f2";
    case DType::F64:
      return "<f8";
    case DType::I64:
      return "<i8";
    case DType::I32:
      return "<i4";
    case DType::I16:
      return "<i2";
    case DType::I8:
      return "|i1";
    case DType::U8:
      return "|u1";
    case DType::Bool:
      return "|b1";
    default:
      break;
  }
  fail_unsupported("tensor '" + std::string(name) + "' has dtype " +
                   std::string(dtype_name(dtype)) +
                   ", which .npy cannot hold; convert it to f32 or an 8-bit type first");
}

void put16(std::string& out, uint32_t v) {
  out.push_back(static_cast<char>(v & 0xff));
  out.push_back(static_cast<char>((v >> 8) & 0xff));
}
void put32(std::string& out, uint32_t v) {
  put16(out, v & 0xffff);
  put16(out, v >> 16);
}

constexpr uint32_t kDosTime = 0;       // 00:00:00
constexpr uint32_t kDosDate = 0x0021;  // 1980-01-01: fixed, so output is byte-identical

struct Entry {
  std::string name;  // NAME.npy
  uint32_t crc = 0;
  uint32_t size = 0;
  uint32_t offset = 0;
};

// Local file header and central directory record share this middle part.
void put_common(std::string& out, const Entry& e) {
  put16(out, 20);  // version needed: 2.0
  put16(out, 0);   // flags
  put16(out, 0);   // method: stored
  put16(out, kDosTime);
  put16(out, kDosDate);
  put32(out, e.crc);
  put32(out, e.size);  // compressed size
  put32(out, e.size);  // uncompressed size
  put16(out, static_cast<uint32_t>(e.name.size()));
  put16(out, 0);  // extra field length
}

uint32_t checked_u32(uint64_t v, const std::filesystem::path& path, std::string_view what) {
  if (v > std::numeric_limits<uint32_t>::max()) {
    fail_unsupported("output '" + path.string() + "': " + std::string(what) +
                     " passes 4 GiB, which needs ZIP64 (not written by qforge); write fewer "
                     "or smaller arrays per file");
  }
  return static_cast<uint32_t>(v);
}

void check_name(const std::string& name, std::set<std::string>& seen,
                const std::filesystem::path& path) {
  std::string where = "'";  // (not "'" + path.string(): GCC 12 warns falsely, -Wrestrict)
  where += path.string();
  where += "'";
  if (name.empty()) fail_invalid(where + ": an array has an empty name; give every array a name");
  if (name.find('/') != std::string::npos || name.find('\0') != std::string::npos) {
    fail_invalid(where + ": array name '" + name +
                 "' holds '/' or a NUL, which np.load cannot give back; rename it");
  }
  if (!seen.insert(name).second) {
    fail_invalid(where + ": array name '" + name + "' appears twice; names must be unique");
  }
}

}  // namespace

std::string npy_bytes(const Tensor& tensor, std::string_view name) {
  const std::string_view descr = npy_descr(tensor.dtype(), name);
  if (tensor.empty() && tensor.nbytes() > 0) {
    fail_invalid("tensor '" + std::string(name) + "' has no data to write");
  }
  std::string shape = "(";
  for (size_t i = 0; i < tensor.rank(); ++i) {
    shape += std::to_string(tensor.shape()[i]);
    if (i + 1 < tensor.rank() || tensor.rank() == 1) shape += ",";
    if (i + 1 < tensor.rank()) shape += " ";
  }
  shape += ")";
  std::string header =
      "{'descr': '" + std::string(descr) + "', 'fortran_order': False, 'shape': " + shape + ", }";
  // magic (6) + version (2) + header length (2) + header, padded with spaces to a multiple
  // of 64 and ended by a newline, as numpy writes it.
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  if (header.size() > 0xffff) {
    fail_unsupported("tensor '" + std::string(name) +
                     "' has a shape too long for a .npy 1.0 header");
  }
  std::string out("\x93NUMPY\x01\x00", 8);
  put16(out, static_cast<uint32_t>(header.size()));
  out += header;
  const auto data = tensor.bytes();
  out.append(reinterpret_cast<const char*>(data.data()), data.size());
  return out;
}

void write_npz(std::span<const NamedTensor> tensors, const std::filesystem::path& path) {
  std::set<std::string> seen;
  for (const auto& [name, tensor] : tensors) {
    check_name(name, seen, path);
    npy_descr(tensor.dtype(), name);
  }
  AtomicFile file(path);
  std::ofstream out(file.temp_path(), std::ios::binary | std::ios::trunc);
  if (!out)
    fail_io("cannot create '" + file.temp_path().string() + "' (writing '" + path.string() + "')");

  std::vector<Entry> entries;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    const std::string npy = npy_bytes(tensor, name);
    Entry e;
    e.name = name + ".npy";
    e.size = checked_u32(npy.size(), path, "array '" + name + "'");
    e.offset = checked_u32(offset, path, "the archive");
    e.crc = static_cast<uint32_t>(
        crc32_z(crc32_z(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(npy.data()), npy.size()));
    std::string local;
    put32(local, 0x04034b50);
    put_common(local, e);
    local += e.name;
    out.write(local.data(), static_cast<std::streamsize>(local.size()));
    out.write(npy.data(), static_cast<std::streamsize>(npy.size()));
    offset += local.size() + npy.size();
    entries.push_back(std::move(e));
  }
  std::string central;
  for (const auto& e : entries) {
    put32(central, 0x02014b50);
    put16(central, 20);  // version made by: 2.0, MS-DOS attributes
    put_common(central, e);
    put16(central, 0);  // comment length
    put16(central, 0);  // disk number
    put16(central, 0);  // internal attributes
    put32(central, 0);  // external attributes
    put32(central, e.offset);
    central += e.name;
  }
  const uint32_t cd_offset = checked_u32(offset, path, "the archive");
  const uint32_t cd_size = checked_u32(central.size(), path, "the archive");
  if (entries.size() > 0xffff) {
    fail_unsupported("'" + path.string() +
                     "': more than 65535 arrays need ZIP64 (not written "
                     "by qforge); split them over several files");
  }
  put32(central, 0x06054b50);
  put16(central, 0);  // this disk
  put16(central, 0);  // disk with the central directory
  put16(central, static_cast<uint32_t>(entries.size()));
  put16(central, static_cast<uint32_t>(entries.size()));
  put32(central, cd_size);
  put32(central, cd_offset);
  put16(central, 0);  // comment length
  out.write(central.data(), static_cast<std::streamsize>(central.size()));
  out.close();
  if (!out)
    fail_io("cannot write '" + file.temp_path().string() + "' (writing '" + path.string() +
            "'); is the disk full?");
  file.commit();
}

}  // namespace qforge
