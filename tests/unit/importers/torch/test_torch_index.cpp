// import_torch_index on hand-made sharded checkpoints (pytorch_model.bin.index.json).
#include <gtest/gtest.h>

#include <fstream>

#include "importers/torch/torch_reader.h"
#include "torch_test_util.h"

using namespace qforge;
using namespace qforge::torch_test;

namespace {

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path) << text;
}

// Two shards: a (f32 [2]) and b (f32 [3]) in shard 1, c (f32 [1]) in shard 2.
void write_shards(const std::filesystem::path& folder) {
  const auto one =
      state_dict_pickle({{"b", "FloatStorage", "0", 3, {3}}, {"a", "FloatStorage", "1", 2, {2}}});
  write_file(folder / "pytorch_model-00001-of-00002.bin",
             torch_zip("pytorch_model-00001-of-00002", one,
                       {{"0", to_bytes(std::vector<float>{3, 4, 5})},
                        {"1", to_bytes(std::vector<float>{1, 2})}})
                 .bytes);
  const auto two = state_dict_pickle({{"c", "FloatStorage", "0", 1, {1}}});
  write_file(folder / "pytorch_model-00002-of-00002.bin",
             torch_zip("archive", two, {{"0", to_bytes(std::vector<float>{6})}}).bytes);
}

std::string index_json(const std::string& weight_map) {
  return R"({"metadata": {"total_size": 24}, "weight_map": {)" + weight_map + "}}";
}

const std::string kGoodMap = R"("a": "pytorch_model-00001-of-00002.bin",
                                "b": "pytorch_model-00001-of-00002.bin",
                                "c": "pytorch_model-00002-of-00002.bin")";

Failure index_failure(const TempDir& dir, const std::string& json) {
  write_text(dir / "pytorch_model.bin.index.json", json);
  return failure_of([&] { import_torch_index(dir / "pytorch_model.bin.index.json"); });
}

}  // namespace

TEST(TorchIndex, MergesShardsInShardOrder) {
  TempDir dir;
  write_shards(dir.path());
  write_text(dir / "pytorch_model.bin.index.json", index_json(kGoodMap));
  const Graph g = import_torch_index(dir / "pytorch_model.bin.index.json");
  ASSERT_EQ(g.initializers().size(), 3u);
  EXPECT_EQ(g.initializers()[0].first, "b");  // shard 1 in its pickle order, then shard 2
  EXPECT_EQ(g.initializers()[1].first, "a");
  EXPECT_EQ(g.initializers()[2].first, "c");
  EXPECT_EQ(g.find_initializer("b")->to_f32(), (std::vector<float>{3, 4, 5}));
  EXPECT_TRUE(g.find_initializer("c")->is_mapped());
  EXPECT_EQ(*g.find_metadata("source_format"), "torch");
  EXPECT_EQ(*g.find_metadata("shards"), "2");
}

TEST(TorchIndex, KeepsOnlyWhatTheMapAssignsToEachShard) {
  TempDir dir;
  write_shards(dir.path());
  // "b" is left out of the map: the shard still holds it, the import does not.
  write_text(dir / "i.json", index_json(R"("a": "pytorch_model-00001-of-00002.bin",
                                           "c": "pytorch_model-00002-of-00002.bin")"));
  const Graph g = import_torch_index(dir / "i.json");
  EXPECT_EQ(g.initializers().size(), 2u);
  EXPECT_FALSE(g.has_initializer("b"));
}

TEST(TorchIndex, RefusesTensorMissingFromItsShard) {
  TempDir dir;
  write_shards(dir.path());
  const Failure f =
      index_failure(dir, index_json(kGoodMap + R"(, "d": "pytorch_model-00002-of-00002.bin")"));
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
  EXPECT_NE(f.message.find("maps tensor 'd' to shard 'pytorch_model-00002-of-00002.bin', which "
                           "does not hold it"),
            std::string::npos)
      << f.message;
  // Listed in the wrong shard is the same mistake.
  const Failure g = index_failure(dir, index_json(R"("c": "pytorch_model-00001-of-00002.bin")"));
  EXPECT_NE(g.message.find("maps tensor 'c'"), std::string::npos) << g.message;
}

TEST(TorchIndex, RefusesShardPathsLeavingTheFolder) {
  TempDir dir;
  std::filesystem::create_directories(dir / "model");
  write_shards(dir.path());  // outside "model/"
  std::filesystem::create_symlink(dir / "pytorch_model-00002-of-00002.bin",
                                  dir / "model" / "link.bin");
  for (const std::string& shard : {std::string("../pytorch_model-00002-of-00002.bin"),
                                   (dir / "pytorch_model-00002-of-00002.bin").string(),
                                   std::string("link.bin"), std::string("")}) {
    write_text(dir / "model" / "index.json", index_json(R"("c": ")" + shard + "\""));
    const Failure f = failure_of([&] { import_torch_index(dir / "model" / "index.json"); });
    EXPECT_EQ(f.category, ErrorCategory::InvalidInput) << shard;
    EXPECT_NE(f.message.find("not a file inside the index's folder"), std::string::npos)
        << f.message;
  }
}

TEST(TorchIndex, RefusesMalformedIndexes) {
  TempDir dir;
  const Failure json = index_failure(dir, R"({"weight_map": {)");
  EXPECT_NE(json.message.find("is not valid JSON"), std::string::npos) << json.message;
  const Failure no_map = index_failure(dir, R"({"metadata": {}})");
  EXPECT_NE(no_map.message.find("no \"weight_map\" object"), std::string::npos) << no_map.message;
  const Failure not_name = index_failure(dir, index_json(R"("a": 3)"));
  EXPECT_NE(not_name.message.find("'a' is not a file name"), std::string::npos) << not_name.message;
  const Failure missing = index_failure(dir, index_json(R"("a": "absent.bin")"));
  EXPECT_EQ(missing.category, ErrorCategory::IO);
}
