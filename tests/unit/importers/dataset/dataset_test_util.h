#pragma once
// Builders for data set tests: .npy bytes, .npz archives (stored or deflated, as np.savez and
// np.savez_compressed write them) and ONNX TensorProto files, plus a scratch folder.
#include <zlib.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <onnx/onnx_pb.h>

namespace qforge::test {

inline std::vector<std::byte> as_bytes(const std::string& s) {
  std::vector<std::byte> b(s.size());
  std::memcpy(b.data(), s.data(), s.size());
  return b;
}

template <typename T>
std::vector<std::byte> raw_bytes(const std::vector<T>& v) {
  std::vector<std::byte> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// An .npy (format 1.0) with `descr` ("<f4") and shape, header padded to 64 bytes as numpy does.
inline std::vector<std::byte> npy(const std::string& descr, const std::vector<int64_t>& shape,
                                  const std::vector<std::byte>& data) {
  std::string dims;
  for (int64_t d : shape) dims += std::to_string(d) + ", ";
  if (shape.size() > 1) dims.resize(dims.size() - 2);
  if (shape.size() == 1) dims.resize(dims.size() - 1);
  std::string header =
      "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (" + dims + "), }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  out += header;
  std::vector<std::byte> b = as_bytes(out);
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

inline void put_le(std::string& s, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) s += static_cast<char>((v >> (8 * i)) & 0xff);
}

inline std::vector<std::byte> deflate_raw(const std::vector<std::byte>& in) {
  z_stream z{};
  deflateInit2(&z, 6, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY);
  std::vector<std::byte> out(deflateBound(&z, static_cast<uLong>(in.size())));
  z.next_in = reinterpret_cast<Bytef*>(const_cast<std::byte*>(in.data()));
  z.avail_in = static_cast<uInt>(in.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

// A zip of NAME -> bytes entries, stored or deflated, with a central directory.
inline std::vector<std::byte> zip(
    const std::vector<std::pair<std::string, std::vector<std::byte>>>& entries, bool deflated) {
  std::string out, central;
  for (const auto& [name, data] : entries) {
    const std::vector<std::byte> body = deflated ? deflate_raw(data) : data;
    const auto crc = static_cast<uint32_t>(
        crc32(0, reinterpret_cast<const Bytef*>(data.data()), static_cast<uInt>(data.size())));
    const uint64_t offset = out.size();
    const int method = deflated ? 8 : 0;
    put_le(out, 0x04034b50, 4);
    put_le(out, 20, 2);
    put_le(out, 0, 2);
    put_le(out, method, 2);
    put_le(out, 0, 4);  // time, date
    put_le(out, crc, 4);
    put_le(out, body.size(), 4);
    put_le(out, data.size(), 4);
    put_le(out, name.size(), 2);
    put_le(out, 0, 2);
    out += name;
    out.append(reinterpret_cast<const char*>(body.data()), body.size());
    put_le(central, 0x02014b50, 4);
    put_le(central, 20, 2);
    put_le(central, 20, 2);
    put_le(central, 0, 2);
    put_le(central, method, 2);
    put_le(central, 0, 4);
    put_le(central, crc, 4);
    put_le(central, body.size(), 4);
    put_le(central, data.size(), 4);
    put_le(central, name.size(), 2);
    put_le(central, 0, 2);
    put_le(central, 0, 2);
    put_le(central, 0, 2);
    put_le(central, 0, 2);
    put_le(central, 0, 4);
    put_le(central, offset, 4);
    central += name;
  }
  const uint64_t cd_offset = out.size();
  out += central;
  put_le(out, 0x06054b50, 4);
  put_le(out, 0, 4);
  put_le(out, entries.size(), 2);
  put_le(out, entries.size(), 2);
  put_le(out, central.size(), 4);
  put_le(out, cd_offset, 4);
  put_le(out, 0, 2);
  return as_bytes(out);
}

inline void write_file(const std::filesystem::path& p, const std::vector<std::byte>& bytes) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

inline void write_tensor_pb(const std::filesystem::path& p, const std::string& name,
                            const std::vector<int64_t>& dims, const std::vector<float>& values) {
  onnx::TensorProto t;
  t.set_name(name);
  t.set_data_type(onnx::TensorProto::FLOAT);
  for (int64_t d : dims) t.add_dims(d);
  t.set_raw_data(values.data(), values.size() * sizeof(float));
  std::ofstream f(p, std::ios::binary);
  t.SerializeToOstream(&f);
}

// A fresh folder under the system temp dir, removed with everything in it.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& tag) {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            ("qforge_" + tag + "_" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

}  // namespace qforge::test
