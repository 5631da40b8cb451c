// Sharded checkpoints read through model.safetensors.index.json.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "importers/safetensors/safetensors_reader.h"
#include "tests/unit/importers/safetensors/safetensors_test_util.h"

using namespace qforge;
using qforge::test::Failure;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

namespace {

// A shard of f32 scalars, in the order given.
std::vector<std::byte> scalar_shard(const std::vector<std::pair<std::string, float>>& tensors,
                                    const std::string& metadata = "") {
  std::string header(1, '{');
  if (!metadata.empty()) header.append(R"("__metadata__":)").append(metadata);
  std::vector<std::byte> data;
  for (const auto& [name, value] : tensors) {
    if (header.size() > 1) header += ',';
    header.append("\"").append(name).append(R"(":{"dtype":"F32","shape":[],"data_offsets":[)");
    header.append(std::to_string(data.size())).append(",");
    header.append(std::to_string(data.size() + 4)).append("]}");
    std::byte b[4];
    std::memcpy(b, &value, 4);
    data.insert(data.end(), b, b + 4);
  }
  header += '}';
  auto bytes = test::safetensors_bytes(header, 0);
  bytes.insert(bytes.end(), data.begin(), data.end());
  return bytes;
}

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path) << text;
}

// model-1 holds a and b, model-2 holds c.
void write_checkpoint(const test::TempDir& dir, const std::string& index) {
  test::write_bytes(dir / "model-1.safetensors",
                    scalar_shard({{"b", 2.0f}, {"a", 1.0f}}, R"({"format":"pt","k":"one"})"));
  test::write_bytes(dir / "model-2.safetensors",
                    scalar_shard({{"c", 3.0f}}, R"({"format":"pt","k":"two","j":"x"})"));
  write_text(dir / "model.safetensors.index.json", index);
}

const char* const kIndex = R"({"metadata": {"total_size": 12}, "weight_map": {
  "a": "model-1.safetensors", "b": "model-1.safetensors", "c": "model-2.safetensors"}})";

Failure index_failure(const test::TempDir& dir) {
  return test::failure_of([&] { import_safetensors_index(dir / "model.safetensors.index.json"); });
}

std::string index_with(const std::string& shard_for_c) {
  return R"({"weight_map": {"a": "model-1.safetensors", "b": "model-1.safetensors", "c": ")" +
         shard_for_c + "\"}}";
}

}  // namespace

TEST(SafetensorsIndexReader, ReadsAllShardsInShardAndDataOrder) {
  test::TempDir dir;
  write_checkpoint(dir, kIndex);
  const auto index = dir / "model.safetensors.index.json";
  const Graph g = import_safetensors_any(index);
  std::vector<std::string> names;
  for (const auto& [name, t] : g.initializers()) {
    names.push_back(name);
    EXPECT_TRUE(t.is_mapped()) << name;
  }
  EXPECT_THAT(names, ElementsAre("b", "a", "c"));
  EXPECT_THAT(g.find_initializer("c")->to_f32(), ElementsAre(3.0f));
  EXPECT_EQ(*g.find_metadata("source_path"), index.string());
  EXPECT_EQ(*g.find_metadata("safetensors.k"), "one");  // the first shard's value wins
  EXPECT_EQ(*g.find_metadata("safetensors.j"), "x");
}

TEST(SafetensorsIndexReader, WarnsWhenTotalSizeDisagrees) {
  test::TempDir dir;
  write_checkpoint(dir, R"({"metadata": {"total_size": 99}, "weight_map": {
    "a": "model-1.safetensors", "b": "model-1.safetensors", "c": "model-2.safetensors"}})");
  std::ostringstream log;
  const auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>(
      "capture", std::make_shared<spdlog::sinks::ostream_sink_mt>(log)));
  const Graph g = import_safetensors_index(dir / "model.safetensors.index.json");
  spdlog::set_default_logger(previous);
  EXPECT_EQ(g.initializers().size(), 3u);
  EXPECT_THAT(log.str(), HasSubstr("metadata.total_size is 99 but the shards' tensors hold 12"));
}

TEST(SafetensorsIndexReader, RejectsAbsoluteShardPath) {
  test::TempDir dir;
  write_checkpoint(dir, index_with((dir / "model-2.safetensors").string()));
  const Failure f = index_failure(dir);
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
  EXPECT_THAT(f.message, HasSubstr("of tensor 'c' must be a file name relative to the index"));
}

TEST(SafetensorsIndexReader, RejectsShardPathWithDotDot) {
  test::TempDir dir;
  std::filesystem::create_directory(dir / "sub");
  write_checkpoint(dir, index_with("sub/../model-2.safetensors"));
  const Failure f = index_failure(dir);
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
  EXPECT_THAT(f.message, HasSubstr("shard 'sub/../model-2.safetensors' of tensor 'c' may not use "
                                   "'..'"));
}

TEST(SafetensorsIndexReader, RejectsSymlinkLeadingOutOfTheFolder) {
  test::TempDir dir;
  std::filesystem::create_directory(dir / "ckpt");
  test::write_bytes(dir / "outside.safetensors", scalar_shard({{"c", 3.0f}}));
  test::write_bytes(dir / "ckpt" / "model-1.safetensors", scalar_shard({{"b", 2.0f}, {"a", 1.0f}}));
  std::filesystem::create_symlink(dir / "outside.safetensors",
                                  dir / "ckpt" / "model-2.safetensors");
  write_text(dir / "ckpt" / "model.safetensors.index.json", kIndex);
  const Failure f = test::failure_of(
      [&] { import_safetensors_index(dir / "ckpt" / "model.safetensors.index.json"); });
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
  EXPECT_THAT(f.message, HasSubstr("shard 'model-2.safetensors' of tensor 'c' links to"));
  EXPECT_THAT(f.message, HasSubstr("outside the index's folder"));
}

TEST(SafetensorsIndexReader, AcceptsSymlinkStayingInsideTheFolder) {
  test::TempDir dir;
  write_checkpoint(dir, index_with("link.safetensors"));
  std::filesystem::create_symlink("model-2.safetensors", dir / "link.safetensors");
  EXPECT_EQ(import_safetensors_index(dir / "model.safetensors.index.json").initializers().size(),
            3u);
}

TEST(SafetensorsIndexReader, RejectsMissingShardFile) {
  test::TempDir dir;
  write_checkpoint(dir, index_with("model-3.safetensors"));
  const Failure f = index_failure(dir);
  EXPECT_EQ(f.category, ErrorCategory::IO);
  EXPECT_THAT(f.message, HasSubstr("shard 'model-3.safetensors' of tensor 'c' cannot be opened"));
}

TEST(SafetensorsIndexReader, RejectsTensorMissingFromItsShard) {
  test::TempDir dir;
  write_checkpoint(dir, R"({"weight_map": {"a": "model-1.safetensors", "b": "model-1.safetensors",
    "c": "model-2.safetensors", "d": "model-2.safetensors"}})");
  const Failure f = index_failure(dir);
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
  EXPECT_THAT(f.message, HasSubstr("tensor 'd' is mapped to shard 'model-2.safetensors' but that "
                                   "shard does not hold it"));
}

TEST(SafetensorsIndexReader, RejectsTensorFoundInTwoShards) {
  test::TempDir dir;
  write_checkpoint(dir, kIndex);
  test::write_bytes(dir / "model-2.safetensors", scalar_shard({{"a", 9.0f}, {"c", 3.0f}}));
  const Failure f = index_failure(dir);
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
  EXPECT_THAT(f.message, HasSubstr("tensor 'a' is in both shard 'model-1.safetensors' and shard "
                                   "'model-2.safetensors'"));
}

TEST(SafetensorsIndexReader, RejectsTensorTheIndexDoesNotMapToItsShard) {
  test::TempDir dir;
  write_checkpoint(dir,
                   R"({"weight_map": {"a": "model-1.safetensors", "c": "model-2.safetensors"}})");
  const Failure f = index_failure(dir);
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
  EXPECT_THAT(f.message, HasSubstr("tensor 'b' in shard 'model-1.safetensors' is not mapped to "
                                   "that shard by weight_map"));
}

TEST(SafetensorsIndexReader, RejectsDuplicateWeightMapEntries) {
  test::TempDir dir;
  write_checkpoint(dir, R"({"weight_map": {"a": "model-1.safetensors", "b": "model-1.safetensors",
    "c": "model-2.safetensors", "a": "model-2.safetensors"}})");
  const Failure f = index_failure(dir);
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
  EXPECT_THAT(f.message, HasSubstr("duplicate key 'a' inside 'weight_map'"));
}

TEST(SafetensorsIndexReader, RejectsIndexWithoutWeightMap) {
  test::TempDir dir;
  write_checkpoint(dir, R"({"metadata": {"total_size": 12}})");
  const Failure f = index_failure(dir);
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
  EXPECT_THAT(f.message, HasSubstr("has no \"weight_map\" object"));
}

TEST(SafetensorsIndexReader, RejectsNonIntegerTotalSize) {
  test::TempDir dir;
  write_checkpoint(dir, R"({"metadata": {"total_size": "12"}, "weight_map": {
    "a": "model-1.safetensors", "b": "model-1.safetensors", "c": "model-2.safetensors"}})");
  const Failure f = index_failure(dir);
  EXPECT_THAT(f.message, HasSubstr("metadata.total_size \"12\" is not a non-negative integer"));
}

TEST(SafetensorsIndexReader, ReportsCorruptShardByItsPath) {
  test::TempDir dir;
  write_checkpoint(dir, kIndex);
  test::write_bytes(dir / "model-2.safetensors", {std::byte{0}});
  const Failure f = index_failure(dir);
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
  EXPECT_THAT(f.message, HasSubstr("model-2.safetensors': file is 1 bytes, too short"));
}
