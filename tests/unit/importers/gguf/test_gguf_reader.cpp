// GgufWriter -> GGUF reader round trip, and hand-made corrupt files that the reader must refuse
// with one clear error (llama.cpp tests/test-gguf.cpp's checklist).
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "exporters/gguf/gguf_writer.h"
#include "importers/gguf/gguf_reader.h"
#include "ir/error.h"
#include "tests/unit/temp_dir.h"

using namespace qforge;
using namespace qforge::gguf;

namespace {

// A GGUF byte builder for corrupt files.
struct Bytes {
  std::vector<std::byte> b;
  template <typename T>
  Bytes& put(T v) {
    const auto* p = reinterpret_cast<const std::byte*>(&v);
    b.insert(b.end(), p, p + sizeof v);
    return *this;
  }
  Bytes& str(const std::string& s) {
    put<uint64_t>(s.size());
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    b.insert(b.end(), p, p + s.size());
    return *this;
  }
  Bytes& header(uint64_t n_tensors, uint64_t n_kv) {
    return put<uint32_t>(kMagic).put<uint32_t>(3).put<uint64_t>(n_tensors).put<uint64_t>(n_kv);
  }
  Bytes& tensor(const std::string& name, uint64_t ne0, uint32_t type, uint64_t offset) {
    return str(name).put<uint32_t>(1).put<uint64_t>(ne0).put<uint32_t>(type).put<uint64_t>(offset);
  }
  Bytes& pad_to(size_t n) {
    b.resize(n, std::byte{0});
    return *this;
  }
};

std::string error_of(const std::vector<std::byte>& bytes, ErrorCategory want) {
  try {
    parse_gguf(bytes, "t.gguf");
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), want) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "accepted";
  return {};
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST(GgufReader, RoundTripsWhatTheWriterWrote) {
  test::TempDir dir;
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_u32("llama.block_count", 2);
  w.add_i32("x.i32", -5);
  w.add_u64("x.u64", uint64_t{1} << 40);
  w.add_f32("x.f32", 1.5f);
  w.add_bool("x.bool", true);
  const std::vector<std::string> tokens = {"a", "", "\xc4\xa0" "b"};
  w.add_string_array("tokenizer.ggml.tokens", tokens);
  const std::vector<int32_t> types = {1, 3, 4};
  w.add_i32_array("tokenizer.ggml.token_type", types);
  const std::vector<float> scores = {0.5f, -1.0f};
  w.add_f32_array("x.scores", scores);
  w.add_tensor("a", {3}, TensorType::F32);
  w.add_tensor("b", {32, 2}, TensorType::Q8_0);
  EXPECT_THROW(w.add_tensor("a", {3}, TensorType::F32), Error);
  EXPECT_THROW(w.add_tensor("c", {48}, TensorType::Q4_0), Error);
  const auto path = dir.path() / "t.gguf";
  w.write(path, [](size_t i, std::span<std::byte> out) {
    for (size_t k = 0; k < out.size(); ++k) out[k] = static_cast<std::byte>(i * 100 + k);
  });
  const GgufModel m = read_gguf(path);
  const GgufFile& g = m.file;
  EXPECT_EQ(g.version, 3u);
  ASSERT_EQ(g.metadata.size(), 9u);
  EXPECT_EQ(g.find("general.architecture")->value, "llama");
  EXPECT_EQ(g.find("llama.block_count")->type, ValueType::U32);
  EXPECT_EQ(g.find("llama.block_count")->value, 2);
  EXPECT_EQ(g.find("x.i32")->value, -5);
  EXPECT_EQ(g.find("x.u64")->value, uint64_t{1} << 40);
  EXPECT_EQ(g.find("x.f32")->value, 1.5);
  EXPECT_EQ(g.find("x.bool")->value, true);
  EXPECT_EQ(g.find("tokenizer.ggml.tokens")->element_type, ValueType::String);
  EXPECT_EQ(g.find("tokenizer.ggml.tokens")->value.get<std::vector<std::string>>(), tokens);
  EXPECT_EQ(g.find("tokenizer.ggml.token_type")->value.get<std::vector<int32_t>>(), types);
  EXPECT_EQ(g.find("x.scores")->value.get<std::vector<float>>(), scores);
  ASSERT_EQ(g.tensors.size(), 2u);
  EXPECT_EQ(g.data_offset % 32, 0u);
  const TensorEntry& b = *g.find_tensor("b");
  EXPECT_EQ(b.ne, (std::vector<uint64_t>{32, 2}));
  EXPECT_EQ(b.type, TensorType::Q8_0);
  EXPECT_EQ(b.offset, 32u);  // "a" (12 bytes) padded to the alignment
  EXPECT_EQ(b.nbytes, 68u);
  const auto data = m.tensor_data(b);
  for (size_t k = 0; k < data.size(); ++k) EXPECT_EQ(data[k], static_cast<std::byte>(100 + k));
  EXPECT_EQ(std::filesystem::file_size(path), g.data_offset + 32 + 96);  // last one padded too
}

TEST(GgufReader, RefusesTruncatedHeader) {
  Bytes f;
  f.header(0, 0);
  f.b.resize(10);
  EXPECT_TRUE(has(error_of(f.b, ErrorCategory::InvalidInput), "ends inside"));
}

TEST(GgufReader, RefusesWrongMagicAndVersion) {
  Bytes f;
  f.put<uint32_t>(0x12345678).put<uint32_t>(3).put<uint64_t>(0).put<uint64_t>(0);
  EXPECT_TRUE(has(error_of(f.b, ErrorCategory::InvalidInput), "magic"));
  Bytes v;
  v.put<uint32_t>(kMagic).put<uint32_t>(1).put<uint64_t>(0).put<uint64_t>(0);
  EXPECT_TRUE(has(error_of(v.b, ErrorCategory::Unsupported), "version 1"));
}

TEST(GgufReader, RefusesHugeStringLength) {
  Bytes f;
  f.header(0, 1).put<uint64_t>(uint64_t{1} << 62);
  EXPECT_TRUE(has(error_of(f.b, ErrorCategory::InvalidInput), "exceeds the cap"));
  Bytes g;
  g.header(0, 1).put<uint64_t>(1000).pad_to(100);
  EXPECT_TRUE(has(error_of(g.b, ErrorCategory::InvalidInput), "past the end"));
}

TEST(GgufReader, RefusesHugeArrayAndCounts) {
  Bytes f;
  f.header(0, 1).str("k").put<uint32_t>(9).put<uint32_t>(4).put<uint64_t>(uint64_t{1} << 60);
  EXPECT_TRUE(has(error_of(f.b, ErrorCategory::InvalidInput), "more than the file holds"));
  Bytes g;
  g.header(uint64_t{1} << 40, 0);
  EXPECT_TRUE(has(error_of(g.b, ErrorCategory::InvalidInput), "tensor count"));
}

TEST(GgufReader, RefusesDuplicateKeyAndTensor) {
  Bytes k;
  k.header(0, 2).str("a").put<uint32_t>(4).put<uint32_t>(1);
  k.str("a").put<uint32_t>(4).put<uint32_t>(2);
  EXPECT_TRUE(has(error_of(k.b, ErrorCategory::InvalidInput), "'a' appears twice"));
  Bytes t;
  t.header(2, 0).tensor("w", 4, 0, 0).tensor("w", 4, 0, 32).pad_to(128);
  EXPECT_TRUE(has(error_of(t.b, ErrorCategory::InvalidInput), "tensor 'w' appears twice"));
}

TEST(GgufReader, RefusesOffsetOutOfRange) {
  Bytes t;
  t.header(1, 0).tensor("w", 8, 0, 64).pad_to(64 + 32);  // data section 32 bytes, asks 64..96
  const std::string e = error_of(t.b, ErrorCategory::InvalidInput);
  EXPECT_TRUE(has(e, "'w'") && has(e, "outside")) << e;
  Bytes o;
  o.header(2, 0).tensor("a", 16, 0, 0).tensor("b", 16, 0, 32).pad_to(256);  // a is 64 bytes
  EXPECT_TRUE(has(error_of(o.b, ErrorCategory::InvalidInput), "overlaps"));
}

TEST(GgufReader, RefusesBadAlignment) {
  Bytes t;
  t.header(1, 0).tensor("w", 4, 0, 3).pad_to(128);
  EXPECT_TRUE(has(error_of(t.b, ErrorCategory::InvalidInput), "not a multiple of the alignment"));
  Bytes a;
  a.header(0, 1).str("general.alignment").put<uint32_t>(4).put<uint32_t>(24);
  EXPECT_TRUE(has(error_of(a.b, ErrorCategory::InvalidInput), "power of two"));
}

TEST(GgufReader, RefusesUnknownTypes) {
  Bytes t;
  t.header(1, 0).tensor("w", 256, 12, 0).pad_to(512);  // Q4_K: not read
  const std::string e = error_of(t.b, ErrorCategory::Unsupported);
  EXPECT_TRUE(has(e, "'w'") && has(e, "type 12")) << e;
  Bytes v;
  v.header(0, 1).str("k").put<uint32_t>(13);
  EXPECT_TRUE(has(error_of(v.b, ErrorCategory::InvalidInput), "unknown value type 13"));
  Bytes q;
  q.header(1, 0).tensor("w", 40, 2, 0).pad_to(512);  // Q4_0 row of 40 elements
  EXPECT_TRUE(has(error_of(q.b, ErrorCategory::InvalidInput), "whole number"));
}
