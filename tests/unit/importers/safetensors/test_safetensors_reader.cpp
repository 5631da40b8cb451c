// Well-formed files: values, order, dtypes, metadata and zero-copy mapping.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

#include "importers/safetensors/safetensors_reader.h"
#include "tests/unit/importers/safetensors/safetensors_test_util.h"

using namespace qforge;
using ::testing::ElementsAre;
using ::testing::Pair;

namespace {

std::vector<std::string> names_of(const Graph& g) {
  std::vector<std::string> names;
  for (const auto& [name, t] : g.initializers()) names.push_back(name);
  return names;
}

std::string metadata_value(const Graph& g, std::string_view key) {
  const std::string* v = g.find_metadata(key);
  return v ? *v : "<absent>";
}

// Two f32 tensors listed in the header in the opposite order of their data.
std::vector<std::byte> two_tensor_file() {
  const std::string header = R"({"__metadata__":{"format":"pt","note":"a \"quoted\" value"},)"
                             R"("second":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},)"
                             R"("first":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}    )";
  auto bytes = test::safetensors_bytes(header, 0);
  for (float v : {1.5f, -2.0f}) {
    std::byte b[4];
    std::memcpy(b, &v, 4);
    bytes.insert(bytes.end(), b, b + 4);
  }
  return bytes;
}

}  // namespace

TEST(SafetensorsReader, ReadsTensorsInDataOrder) {
  const Graph g = import_safetensors_bytes(two_tensor_file(), "two.safetensors");
  EXPECT_THAT(names_of(g), ElementsAre("first", "second"));
  EXPECT_THAT(g.find_initializer("first")->to_f32(), ElementsAre(1.5f));
  EXPECT_THAT(g.find_initializer("second")->to_f32(), ElementsAre(-2.0f));
  EXPECT_TRUE(g.nodes.empty());
}

TEST(SafetensorsReader, KeepsMetadataUnderSafetensorsPrefix) {
  const Graph g = import_safetensors_bytes(two_tensor_file(), "two.safetensors");
  EXPECT_EQ(metadata_value(g, "source_format"), "safetensors");
  EXPECT_EQ(metadata_value(g, "source_path"), "two.safetensors");
  EXPECT_EQ(metadata_value(g, "safetensors.format"), "pt");
  EXPECT_EQ(metadata_value(g, "safetensors.note"), "a \"quoted\" value");
}

TEST(SafetensorsReader, MapsEveryReadableDtype) {
  const std::vector<std::pair<std::string, DType>> dtypes = {
      {"F64", DType::F64}, {"F32", DType::F32},  {"F16", DType::F16}, {"BF16", DType::BF16},
      {"I64", DType::I64}, {"I32", DType::I32},  {"I16", DType::I16}, {"I8", DType::I8},
      {"U8", DType::U8},   {"BOOL", DType::Bool}};
  for (const auto& [name, dtype] : dtypes) {
    const size_t size = static_cast<size_t>(dtype_bits(dtype) / 8) * 3;
    const std::string header = R"({"t":{"dtype":")" + name +
                               R"(","shape":[3,1],"data_offsets":[0,)" + std::to_string(size) +
                               "]}}";
    const Graph g = import_safetensors_bytes(test::safetensors_bytes(header, size), "d");
    const Tensor* t = g.find_initializer("t");
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->dtype(), dtype) << name;
    EXPECT_EQ(t->shape(), (Shape{3, 1})) << name;
    EXPECT_EQ(t->nbytes(), size) << name;
  }
}

TEST(SafetensorsReader, AcceptsEmptyTensorsScalarsAndPadding) {
  const std::string header = R"({"empty_first":{"dtype":"F32","shape":[0,4],"data_offsets":[0,0]},)"
                             R"("scalar":{"dtype":"I32","shape":[],"data_offsets":[0,4]},)"
                             R"("empty_last":{"dtype":"BF16","shape":[2,0],"data_offsets":[4,4]}})"
                             "        ";
  const Graph g = import_safetensors_bytes(test::safetensors_bytes(header, 4, 0x01), "e");
  EXPECT_THAT(names_of(g), ElementsAre("empty_first", "scalar", "empty_last"));
  EXPECT_EQ(g.find_initializer("scalar")->rank(), 0u);
  EXPECT_THAT(g.find_initializer("scalar")->to_f32(), ElementsAre(16843009.0f));  // 0x01010101
  EXPECT_EQ(g.find_initializer("empty_last")->numel(), 0u);
}

TEST(SafetensorsReader, ReadsAnEmptyFile) {
  const Graph g = import_safetensors_bytes(test::safetensors_bytes("{}      ", 0), "none");
  EXPECT_TRUE(g.initializers().empty());
}

TEST(SafetensorsReader, MapsTheFileWithoutCopying) {
  test::TempDir dir;
  const auto path = dir / "two.safetensors";
  const auto bytes = two_tensor_file();
  test::write_bytes(path, bytes);
  const Graph g = import_safetensors(path);
  const Tensor& first = *g.find_initializer("first");
  const Tensor& second = *g.find_initializer("second");
  ASSERT_TRUE(first.is_mapped());
  ASSERT_TRUE(second.is_mapped());
  EXPECT_EQ(first.storage(), second.storage());
  const auto whole = first.storage()->bytes();
  EXPECT_EQ(whole.size(), bytes.size());
  EXPECT_EQ(first.bytes().data(), whole.data() + (bytes.size() - 8));
  EXPECT_EQ(second.bytes().data(), whole.data() + (bytes.size() - 4));
  EXPECT_EQ(metadata_value(g, "source_path"), path.string());
}

TEST(SafetensorsReader, TensorsKeepTheMapAliveAfterTheGraphIsGone) {
  test::TempDir dir;
  const auto path = dir / "two.safetensors";
  test::write_bytes(path, two_tensor_file());
  Tensor kept;
  {
    const Graph g = import_safetensors(path);
    kept = *g.find_initializer("second");
  }
  std::filesystem::remove(path);
  EXPECT_THAT(kept.to_f32(), ElementsAre(-2.0f));
}

TEST(SafetensorsReader, AnyPicksTheFileReaderForSafetensorsFiles) {
  test::TempDir dir;
  const auto path = dir / "two.safetensors";
  test::write_bytes(path, two_tensor_file());
  EXPECT_THAT(names_of(import_safetensors_any(path)), ElementsAre("first", "second"));
}

TEST(SafetensorsReader, MetadataIsSortedByKey) {
  const std::string header = R"({"__metadata__":{"zeta":"1","alpha":"2","mid":"3"}})";
  const Graph g = import_safetensors_bytes(test::safetensors_bytes(header, 0), "m");
  EXPECT_THAT(g.metadata, ElementsAre(Pair("source_format", "safetensors"),
                                      Pair("source_path", "m"), Pair("safetensors.alpha", "2"),
                                      Pair("safetensors.mid", "3"), Pair("safetensors.zeta", "1")));
}
