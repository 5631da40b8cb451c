#include <gtest/gtest.h>

#include "exporters/npz_writer.h"
#include "importers/dataset/npy.h"
#include "tests/unit/exporters/onnx_test_util.h"

namespace qforge::testing {
namespace {

namespace fs = std::filesystem;

Tensor bool_tensor() {
  Tensor t(DType::Bool, {2, 2});
  auto b = t.mutable_bytes();
  b[1] = std::byte{1};
  b[2] = std::byte{1};
  return t;
}

TEST(NpzWriter, RoundTripsEveryDtypeThroughReadNpz) {
  TempDir tmp;
  const std::vector<NamedTensor> tensors = {
      {"f32", iota_tensor(DType::F32, {2, 3})},
      {"f16", iota_tensor(DType::F16, {5})},
      {"f64", iota_tensor(DType::F64, {1, 2, 2})},
      {"i64", iota_tensor(DType::I64, {3})},
      {"i32", iota_tensor(DType::I32, {2, 1})},
      {"i16", iota_tensor(DType::I16, {4})},
      {"i8", iota_tensor(DType::I8, {7})},
      {"u8", iota_tensor(DType::U8, {3, 3})},
      {"flag", bool_tensor()},
      {"scalar", f32_tensor({2.5f}, {})},
      {"empty", Tensor(DType::F32, {0, 3})},
  };
  write_npz(tensors, tmp / "out.npz");
  const auto back = read_npz(tmp / "out.npz");
  ASSERT_EQ(back.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    SCOPED_TRACE(tensors[i].first);
    EXPECT_EQ(back[i].first, tensors[i].first);
    EXPECT_EQ(back[i].second.dtype(), tensors[i].second.dtype());
    EXPECT_EQ(back[i].second.shape(), tensors[i].second.shape());
    EXPECT_TRUE(back[i].second.equals(tensors[i].second));
  }
}

TEST(NpzWriter, NpyHeaderIsVersion1PaddedTo64) {
  const std::string npy = npy_bytes(iota_tensor(DType::F32, {2, 3}));
  ASSERT_GT(npy.size(), 10u);
  EXPECT_EQ(npy.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  const size_t header_len = static_cast<unsigned char>(npy[8]) |
                            (static_cast<size_t>(static_cast<unsigned char>(npy[9])) << 8);
  EXPECT_EQ((10 + header_len) % 64, 0u);
  const std::string header = npy.substr(10, header_len);
  EXPECT_EQ(header.rfind("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 0), 0u)
      << header;
  EXPECT_EQ(header.back(), '\n');
  EXPECT_EQ(npy.size(), 10 + header_len + 24);
  EXPECT_NE(npy_bytes(iota_tensor(DType::I8, {4})).find("'shape': (4,)"), std::string::npos);
}

TEST(NpzWriter, SameTensorsGiveIdenticalBytes) {
  TempDir tmp;
  const std::vector<NamedTensor> tensors = {{"a", iota_tensor(DType::F32, {4})}};
  write_npz(tensors, tmp / "a.npz");
  write_npz(tensors, tmp / "b.npz");
  EXPECT_EQ(read_bytes(tmp / "a.npz"), read_bytes(tmp / "b.npz"));
}

TEST(NpzWriter, RejectsWhatNpyCannotHoldAndLeavesNoFile) {
  TempDir tmp;
  std::vector<NamedTensor> tensors = {{"ok", iota_tensor(DType::F32, {2})},
                                      {"packed", iota_tensor(DType::I4, {4})}};
  expect_error([&] { write_npz(tensors, tmp / "o.npz"); }, ErrorCategory::Unsupported,
               {"'packed'", "i4"});
  tensors[1] = {"ok", iota_tensor(DType::F32, {2})};
  expect_error([&] { write_npz(tensors, tmp / "o.npz"); }, ErrorCategory::InvalidInput,
               {"'ok'", "twice"});
  tensors[1] = {"a/b", iota_tensor(DType::F32, {2})};
  expect_error([&] { write_npz(tensors, tmp / "o.npz"); }, ErrorCategory::InvalidInput, {"'a/b'"});
  tensors[1] = {"", iota_tensor(DType::F32, {2})};
  expect_error([&] { write_npz(tensors, tmp / "o.npz"); }, ErrorCategory::InvalidInput,
               {"empty name"});
  expect_error([&] { write_npz(tensors, tmp / "missing" / "o.npz"); }, ErrorCategory::InvalidInput,
               {"empty name"});
  EXPECT_TRUE(list_dir(tmp.path()).empty());
  tensors.pop_back();
  expect_error([&] { write_npz(tensors, tmp / "missing" / "o.npz"); }, ErrorCategory::IO,
               {"does not exist"});
}

}  // namespace
}  // namespace qforge::testing
