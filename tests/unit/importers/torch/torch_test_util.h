#pragma once
// Helpers for the torch reader tests: a scratch folder, error capture, and builders for
// hand-made zips and pickles laid out as torch.save writes them (so each test can break one
// field at a known offset).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "importers/torch/pickle_opcodes.h"
#include "ir/error.h"

namespace qforge::torch_test {

using Bytes = std::vector<std::byte>;

// A fresh folder for the running test, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            ("qforge_" + std::string(info->test_suite_name()) + "_" + info->name() + "_" +
             std::to_string(::getpid()));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

inline void write_file(const std::filesystem::path& path, const Bytes& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << "cannot write " << path;
}

inline Bytes to_bytes(std::string_view s) {
  Bytes out(s.size());
  std::memcpy(out.data(), s.data(), s.size());
  return out;
}

template <typename T>
Bytes to_bytes(const std::vector<T>& values) {
  Bytes out(values.size() * sizeof(T));
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

template <typename T>
void put_le(Bytes& b, size_t at, T value) {
  for (size_t i = 0; i < sizeof(T); ++i) {
    b[at + i] = static_cast<std::byte>((static_cast<uint64_t>(value) >> (8 * i)) & 0xff);
  }
}

struct Failure {
  ErrorCategory category = ErrorCategory::Internal;
  std::string message;
};

// The qforge::Error that `f` throws; a test failure if it throws none.
template <typename F>
Failure failure_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return {e.category(), e.what()};
  }
  ADD_FAILURE() << "expected a qforge::Error, none was thrown";
  return {};
}

// --- zips ----------------------------------------------------------------------------------

struct ZipFileSpec {
  std::string name;
  Bytes data;
  uint16_t method = 0;  // 0 stored, 8 deflate (the data is then left as given)
};

struct ZipOptions {
  bool zip64 = false;            // ZIP64 end records and extra fields, sizes saturated
  bool align64 = true;           // pad local headers so data starts on 64-byte boundaries
  bool zero_local_sizes = true;  // as torch (miniz with a data descriptor flag) writes
};

// A zip and where its fields lie, so a test can corrupt one.
struct BuiltZip {
  Bytes bytes;
  std::vector<size_t> local_offsets;    // local header of each entry
  std::vector<size_t> data_offsets;     // first data byte of each entry
  std::vector<size_t> central_offsets;  // central directory record of each entry
  size_t cd_offset = 0;
  size_t eocd_offset = 0;
};

BuiltZip build_zip(const std::vector<ZipFileSpec>& files, const ZipOptions& options = {});

// --- pickles -------------------------------------------------------------------------------

class PickleBuilder {
 public:
  PickleBuilder& op(PickleOp o) { return byte(static_cast<uint8_t>(o)); }
  PickleBuilder& byte(uint8_t b) {
    bytes.push_back(static_cast<std::byte>(b));
    return *this;
  }
  PickleBuilder& le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) byte(static_cast<uint8_t>(v >> (8 * i)));
    return *this;
  }
  PickleBuilder& text(std::string_view s) {
    for (char c : s) byte(static_cast<uint8_t>(c));
    return *this;
  }
  PickleBuilder& proto(uint8_t v = 2) { return op(PickleOp::PROTO).byte(v); }
  PickleBuilder& global(std::string_view module, std::string_view name) {
    return op(PickleOp::GLOBAL).text(module).byte('\n').text(name).byte('\n');
  }
  PickleBuilder& stack_global(std::string_view module, std::string_view name) {
    return str8(module).str8(name).op(PickleOp::STACK_GLOBAL);
  }
  PickleBuilder& str(std::string_view s) {
    return op(PickleOp::BINUNICODE).le(s.size(), 4).text(s);
  }
  PickleBuilder& str8(std::string_view s) {
    return op(PickleOp::SHORT_BINUNICODE).le(s.size(), 1).text(s);
  }
  PickleBuilder& integer(int64_t v);
  PickleBuilder& put(uint8_t i) { return op(PickleOp::BINPUT).byte(i); }
  PickleBuilder& get(uint8_t i) { return op(PickleOp::BINGET).byte(i); }
  PickleBuilder& ints(const std::vector<int64_t>& v) {
    op(PickleOp::MARK);
    for (int64_t x : v) integer(x);
    return op(PickleOp::TUPLE);
  }
  // torch._utils._rebuild_tensor_v2(('storage', torch.<storage>, key, 'cpu', numel), offset,
  // size, stride, False, OrderedDict()), exactly as torch.save writes a tensor.
  PickleBuilder& tensor_v2(std::string_view storage, std::string_view key, int64_t numel,
                           int64_t offset, const std::vector<int64_t>& size,
                           const std::vector<int64_t>& stride);
  PickleBuilder& stop() { return op(PickleOp::STOP); }

  Bytes bytes;
};

// A dict pickle {name: tensor_v2(...)} for the given (name, storage, key, numel, size) rows,
// each a contiguous tensor at offset 0.
struct TensorRow {
  std::string name;
  std::string storage;
  std::string key;
  int64_t numel;
  std::vector<int64_t> size;
};
Bytes state_dict_pickle(const std::vector<TensorRow>& rows);
std::vector<int64_t> row_major_strides(const std::vector<int64_t>& size);

// A torch.save-style archive: <prefix>/data.pkl, <prefix>/byteorder, <prefix>/data/<key>...,
// <prefix>/version.
BuiltZip torch_zip(const std::string& prefix, const Bytes& pickle,
                   const std::vector<std::pair<std::string, Bytes>>& storages,
                   const ZipOptions& options = {});

}  // namespace qforge::torch_test
