// The writer: layout identical to safetensors.torch.save_file, round trips through the reader,
// determinism, packed 4-bit tensors, and no partial output.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

#include "exporters/safetensors/safetensors_writer.h"
#include "importers/safetensors/safetensors_reader.h"
#include "tests/unit/importers/safetensors/safetensors_test_util.h"

using namespace qforge;
using qforge::test::Failure;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

namespace {

// A tensor whose bytes are 0, 1, 2, ... (mod 251), so every byte position is distinguishable.
Tensor patterned(DType dtype, Shape shape, int seed = 0) {
  Tensor t(dtype, std::move(shape));
  auto bytes = t.mutable_bytes();
  for (size_t i = 0; i < bytes.size(); ++i) {
    bytes[i] = static_cast<std::byte>((i + static_cast<size_t>(seed)) % 251);
  }
  if (dtype == DType::Bool) {
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::byte>(i % 2);
  }
  return t;
}

template <typename T>
Tensor filled(DType dtype, Shape shape, std::vector<T> values) {
  Tensor t(dtype, std::move(shape));
  std::memcpy(t.mutable_bytes().data(), values.data(), t.nbytes());
  return t;
}

std::string header_of(const std::vector<std::byte>& file) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint64_t>(file[static_cast<size_t>(i)]);
  return {reinterpret_cast<const char*>(file.data()) + 8, n};
}

void expect_same_tensors(const Graph& expected, const Graph& actual) {
  ASSERT_EQ(expected.initializers().size(), actual.initializers().size());
  for (const auto& [name, t] : expected.initializers()) {
    const Tensor* got = actual.find_initializer(name);
    ASSERT_NE(got, nullptr) << name;
    EXPECT_TRUE(got->equals(t)) << name << ": " << dtype_name(got->dtype()) << " "
                                << shape_to_string(got->shape()) << " vs " << dtype_name(t.dtype())
                                << " " << shape_to_string(t.shape());
    EXPECT_TRUE(got->is_mapped()) << name;
  }
}

}  // namespace

TEST(SafetensorsWriter, MatchesSaveFileByteForByte) {
  // What safetensors.torch.save_file(tensors, path, metadata={"format": "pt"}) wrote (0.8.0)
  // for these tensors: dtypes by alignment, largest first, then names in byte order ("B" < "b").
  const std::string expected_header =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]},)"
      R"("d":{"dtype":"F64","shape":[1],"data_offsets":[8,16]},)"
      R"("B":{"dtype":"F32","shape":[1],"data_offsets":[16,20]},)"
      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[20,28]},)"
      R"("i":{"dtype":"I32","shape":[1],"data_offsets":[28,32]},)"
      R"("c":{"dtype":"BF16","shape":[3],"data_offsets":[32,38]},)"
      R"("h":{"dtype":"F16","shape":[1],"data_offsets":[38,40]},)"
      R"("s":{"dtype":"I16","shape":[1],"data_offsets":[40,42]},)"
      R"("k":{"dtype":"I8","shape":[1],"data_offsets":[42,43]},)"
      R"("q":{"dtype":"U8","shape":[1],"data_offsets":[43,44]},)"
      R"("m":{"dtype":"BOOL","shape":[2],"data_offsets":[44,46]}}      )";
  const unsigned char expected_data[] = {0x07, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
                                         0x00, 0x00, 0x00, 0x00, 0xd0, 0x3f, 0x00, 0x00, 0x80, 0xbf,
                                         0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0x40, 0xfe, 0xff,
                                         0xff, 0xff, 0x80, 0x3f, 0x00, 0xc0, 0x00, 0x3f, 0x00, 0x3e,
                                         0xfd, 0xff, 0xfc, 0xff, 0x01, 0x00};
  auto expected = test::safetensors_bytes(expected_header, 0);
  for (unsigned char c : expected_data) expected.push_back(static_cast<std::byte>(c));

  Graph g;  // deliberately not in file order
  g.set_initializer("m", filled<uint8_t>(DType::Bool, {2}, {1, 0}));
  g.set_initializer("b", filled<float>(DType::F32, {2}, {1.0f, 2.0f}));
  g.set_initializer("q", filled<uint8_t>(DType::U8, {1}, {255}));
  g.set_initializer("k", filled<int8_t>(DType::I8, {1}, {-4}));
  g.set_initializer("s", filled<int16_t>(DType::I16, {1}, {-3}));
  g.set_initializer("h", filled<uint16_t>(DType::F16, {1}, {0x3e00}));
  g.set_initializer("c", filled<uint16_t>(DType::BF16, {3}, {0x3f80, 0xc000, 0x3f00}));
  g.set_initializer("i", filled<int32_t>(DType::I32, {1}, {-2}));
  g.set_initializer("B", filled<float>(DType::F32, {1}, {-1.0f}));
  g.set_initializer("d", filled<double>(DType::F64, {1}, {0.25}));
  g.set_initializer("a", filled<int64_t>(DType::I64, {1}, {7}));
  test::TempDir dir;
  export_safetensors(g, dir / "k.safetensors");
  EXPECT_EQ(test::read_bytes(dir / "k.safetensors"), expected);
}

TEST(SafetensorsWriter, RoundTripsEveryDtype) {
  Graph g;
  for (const auto& info : kDTypes) {
    g.set_initializer("t_" + std::string(info.name), patterned(info.dtype, {3, 5}));
  }
  g.set_initializer("scalar", patterned(DType::F32, {}));
  g.set_initializer("empty", patterned(DType::F16, {0, 7}));
  test::TempDir dir;
  export_safetensors(g, dir / "all.safetensors");
  const Graph back = import_safetensors(dir / "all.safetensors");
  expect_same_tensors(g, back);
  EXPECT_EQ(back.find_initializer("t_i4")->nbytes(), 8u);  // 15 nibbles round up
}

TEST(SafetensorsWriter, RecordsPackedTensorsAsU8WithMetadata) {
  Graph g;
  g.set_initializer("w", patterned(DType::I4, {3, 5}));
  g.set_initializer("z", patterned(DType::U4, {4}));
  test::TempDir dir;
  export_safetensors(g, dir / "p.safetensors");
  const std::string header = header_of(test::read_bytes(dir / "p.safetensors"));
  EXPECT_THAT(header, HasSubstr(R"("qforge.dtype.w":"i4","qforge.dtype.z":"u4",)"
                                R"("qforge.shape.w":"[3,5]","qforge.shape.z":"[4]")"));
  EXPECT_THAT(header, HasSubstr(R"("w":{"dtype":"U8","shape":[8],"data_offsets":[0,8]})"));
  // The reader consumes the markers: they do not reappear as graph metadata.
  const Graph back = import_safetensors(dir / "p.safetensors");
  for (const auto& [key, value] : back.metadata)
    EXPECT_THAT(key, testing::Not(HasSubstr("qforge.")));
  EXPECT_EQ(back.find_initializer("w")->dtype(), DType::I4);
}

TEST(SafetensorsWriter, PadsTheHeaderToAlignTheData) {
  for (const std::string name :
       {"a", "ab", "abc", "abcd", "abcde", "abcdef", "abcdefg", "abcdefgh"}) {
    Graph g;
    g.set_initializer(name, patterned(DType::F64, {2}));
    test::TempDir dir;
    export_safetensors(g, dir / "x.safetensors");
    const std::string header = header_of(test::read_bytes(dir / "x.safetensors"));
    EXPECT_EQ(header.size() % 8, 0u) << name;
    EXPECT_EQ(header.find_last_not_of(' '), header.rfind('}')) << name;
  }
}

TEST(SafetensorsWriter, OutputDependsOnlyOnTheTensors) {
  Graph forward;
  Graph backward;
  const std::vector<std::pair<std::string, Tensor>> tensors = {
      {"x.weight", patterned(DType::BF16, {4, 2}, 1)},
      {"x.bias", patterned(DType::F32, {4}, 2)},
      {"y", patterned(DType::I8, {3}, 3)},
      {"idx", patterned(DType::I64, {2}, 4)}};
  for (const auto& [n, t] : tensors) forward.set_initializer(n, t);
  for (auto it = tensors.rbegin(); it != tensors.rend(); ++it)
    backward.set_initializer(it->first, it->second);
  test::TempDir dir;
  export_safetensors(forward, dir / "1.safetensors");
  export_safetensors(forward, dir / "2.safetensors");
  export_safetensors(backward, dir / "3.safetensors");
  const auto first = test::read_bytes(dir / "1.safetensors");
  EXPECT_EQ(first, test::read_bytes(dir / "2.safetensors"));
  EXPECT_EQ(first, test::read_bytes(dir / "3.safetensors"));
}

TEST(SafetensorsWriter, WritesBackTheMetadataItRead) {
  test::TempDir dir;
  const std::string header = R"({"__metadata__":{"format":"pt","note":"line\nbreak \u00e9"},)"
                             R"("w":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})";
  auto original =
      test::safetensors_bytes(header + std::string((8 - header.size() % 8) % 8, ' '), 4, 7);
  test::write_bytes(dir / "in.safetensors", original);
  const Graph g = import_safetensors(dir / "in.safetensors");
  EXPECT_EQ(*g.find_metadata("safetensors.note"), "line\nbreak \xc3\xa9");
  export_safetensors(g, dir / "out.safetensors");
  // serde_json and qforge both write non-ASCII as UTF-8, not \u escapes.
  const std::string rewritten = header_of(test::read_bytes(dir / "out.safetensors"));
  EXPECT_THAT(rewritten, HasSubstr(R"("note":"line\nbreak )"
                                   "\xc3\xa9\""));
  const Graph back = import_safetensors(dir / "out.safetensors");
  const auto without_path = [](const Graph& graph) {
    auto m = graph.metadata;
    std::erase_if(m, [](const auto& kv) { return kv.first == "source_path"; });
    return m;
  };
  EXPECT_EQ(without_path(back), without_path(g));
  expect_same_tensors(g, back);
}

TEST(SafetensorsWriter, ReexportsItsOwnFileByteForByte) {
  Graph g;
  g.set_metadata("safetensors.author", "me");
  g.set_initializer("w", patterned(DType::F16, {3, 3}));
  g.set_initializer("q", patterned(DType::I4, {7}));
  test::TempDir dir;
  export_safetensors(g, dir / "1.safetensors");
  export_safetensors(import_safetensors(dir / "1.safetensors"), dir / "2.safetensors");
  EXPECT_EQ(test::read_bytes(dir / "1.safetensors"), test::read_bytes(dir / "2.safetensors"));
}

TEST(SafetensorsWriter, FormatOptionAndMetadataCanBeLeftOut) {
  Graph g;
  g.set_metadata("safetensors.format", "np");
  g.set_metadata("safetensors.author", "me");
  g.set_metadata("source_path", "not written");
  g.set_initializer("w", patterned(DType::F32, {1}));
  test::TempDir dir;
  export_safetensors(g, dir / "a.safetensors");
  EXPECT_THAT(header_of(test::read_bytes(dir / "a.safetensors")),
              HasSubstr(R"({"__metadata__":{"author":"me","format":"pt"},"w":)"));
  export_safetensors(g, dir / "b.safetensors", {.format = "", .keep_metadata = false});
  EXPECT_EQ(header_of(test::read_bytes(dir / "b.safetensors")),
            R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}  )");
}

TEST(SafetensorsWriter, RejectsTensorNamedMetadata) {
  Graph g;
  g.set_initializer("__metadata__", patterned(DType::F32, {1}));
  test::TempDir dir;
  const Failure f = test::failure_of([&] { export_safetensors(g, dir / "m.safetensors"); });
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
  EXPECT_THAT(f.message, HasSubstr("a tensor named '__metadata__' clashes"));
  EXPECT_THAT(test::folder_listing(dir.path()), IsEmpty());
}

TEST(SafetensorsWriter, LeavesNothingBehindWhenItFails) {
  Graph g;
  g.set_initializer("ok", patterned(DType::F32, {1}));
  g.set_initializer("bad\xff", patterned(DType::F32, {1}));
  test::TempDir dir;
  const Failure f = test::failure_of([&] { export_safetensors(g, dir / "u.safetensors"); });
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
  EXPECT_THAT(f.message, HasSubstr("is not valid UTF-8"));
  EXPECT_THAT(test::folder_listing(dir.path()), IsEmpty());
}

TEST(SafetensorsWriter, MissingFolderIsAnIoError) {
  Graph g;
  g.set_initializer("w", patterned(DType::F32, {1}));
  test::TempDir dir;
  const Failure f = test::failure_of([&] { export_safetensors(g, dir / "no" / "w.safetensors"); });
  EXPECT_EQ(f.category, ErrorCategory::IO);
}
