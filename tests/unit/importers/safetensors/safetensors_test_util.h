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

#include "tests/unit/temp_dir.h"
#include "ir/error.h"
#include "ir/tensor.h"

namespace qforge::test {

// An f32 tensor of `shape` holding first, first + 1, first + 2, ...
inline Tensor ramp_f32(Shape shape, float first) {
  Tensor t(DType::F32, std::move(shape));
  auto values = t.mutable_data<float>();
  for (size_t i = 0; i < values.size(); ++i) values[i] = first + static_cast<float>(i);
  return t;
}

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
