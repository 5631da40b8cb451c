#pragma once
// Helpers shared by the safetensors reader and writer tests: a scratch folder, hand-made files
// and capture of the error a call throws.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "ir/error.h"

namespace qforge::test {

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

// An 8-byte little-endian length, `header` as given, then `data_size` bytes of `fill`.
inline std::vector<std::byte> safetensors_bytes(std::string_view header, size_t data_size,
                                                uint8_t fill = 0) {
  std::vector<std::byte> out;
  for (int i = 0; i < 8; ++i) {
    out.push_back(static_cast<std::byte>((uint64_t{header.size()} >> (8 * i)) & 0xff));
  }
  for (char c : header) out.push_back(static_cast<std::byte>(c));
  out.insert(out.end(), data_size, static_cast<std::byte>(fill));
  return out;
}

inline void write_bytes(const std::filesystem::path& path, const std::vector<std::byte>& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << "cannot write " << path;
}

inline std::vector<std::byte> read_bytes(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(chars.size());
  for (size_t i = 0; i < chars.size(); ++i) out[i] = static_cast<std::byte>(chars[i]);
  return out;
}

inline std::vector<std::string> folder_listing(const std::filesystem::path& folder) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(folder)) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
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

}  // namespace qforge::test
