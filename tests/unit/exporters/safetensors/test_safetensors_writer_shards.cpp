// Sharded output: shard files, the index as save_pretrained writes it, and reading it back.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "exporters/safetensors/safetensors_writer.h"
#include "importers/safetensors/safetensors_reader.h"
#include "tests/unit/importers/safetensors/safetensors_test_util.h"

using namespace qforge;
using ::testing::ElementsAre;

namespace {

std::string read_text(const std::filesystem::path& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::vector<std::string> names_of(const Graph& g) {
  std::vector<std::string> names;
  for (const auto& [name, t] : g.initializers()) names.push_back(name);
  return names;
}

}  // namespace

TEST(SafetensorsWriterShards, FillsShardsInOrderAndWritesTheIndex) {
  Graph g;
  g.set_initializer("layer.0", test::ramp_f32({4}, 0));   // 16 bytes
  g.set_initializer("layer.1", test::ramp_f32({4}, 10));  // 32 so far
  g.set_initializer("layer.2", test::ramp_f32({4}, 20));  // 48 > 40: next shard
  g.set_initializer("head", test::ramp_f32({2}, 30));
  test::TempDir dir;
  export_safetensors(g, dir / "model.safetensors", {.max_shard_size = 40});

  EXPECT_THAT(test::folder_listing(dir.path()),
              ElementsAre("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                          "model.safetensors.index.json"));
  EXPECT_EQ(read_text(dir / "model.safetensors.index.json"),
            "{\n"
            "  \"metadata\": {\n"
            "    \"total_size\": 56\n"
            "  },\n"
            "  \"weight_map\": {\n"
            "    \"head\": \"model-00002-of-00002.safetensors\",\n"
            "    \"layer.0\": \"model-00001-of-00002.safetensors\",\n"
            "    \"layer.1\": \"model-00001-of-00002.safetensors\",\n"
            "    \"layer.2\": \"model-00002-of-00002.safetensors\"\n"
            "  }\n"
            "}\n");
  EXPECT_THAT(names_of(import_safetensors(dir / "model-00002-of-00002.safetensors")),
              ElementsAre("head", "layer.2"));

  const Graph back = import_safetensors_any(dir / "model.safetensors.index.json");
  EXPECT_THAT(names_of(back), ElementsAre("layer.0", "layer.1", "head", "layer.2"));
  for (const auto& [name, t] : g.initializers()) {
    ASSERT_NE(back.find_initializer(name), nullptr) << name;
    EXPECT_TRUE(back.find_initializer(name)->equals(t)) << name;
  }
}

TEST(SafetensorsWriterShards, GivesATensorLargerThanTheLimitItsOwnShard) {
  Graph g;
  g.set_initializer("small.a", test::ramp_f32({2}, 0));
  g.set_initializer("big", test::ramp_f32({25}, 0));  // 100 bytes, over the 50-byte limit
  g.set_initializer("small.b", test::ramp_f32({2}, 0));
  test::TempDir dir;
  export_safetensors(g, dir / "model.safetensors", {.max_shard_size = 50});
  EXPECT_THAT(names_of(import_safetensors(dir / "model-00001-of-00003.safetensors")),
              ElementsAre("small.a"));
  EXPECT_THAT(names_of(import_safetensors(dir / "model-00002-of-00003.safetensors")),
              ElementsAre("big"));
  EXPECT_THAT(names_of(import_safetensors(dir / "model-00003-of-00003.safetensors")),
              ElementsAre("small.b"));
}

TEST(SafetensorsWriterShards, WritesOnePlainFileWhenEverythingFits) {
  Graph g;
  g.set_initializer("w", test::ramp_f32({4}, 0));
  test::TempDir dir;
  export_safetensors(g, dir / "model.safetensors", {.max_shard_size = 1 << 20});
  EXPECT_THAT(test::folder_listing(dir.path()), ElementsAre("model.safetensors"));
}

TEST(SafetensorsWriterShards, EveryShardCarriesTheMetadataAndPackedMarkersStayWithTheirTensor) {
  Graph g;
  g.set_metadata("safetensors.author", "me");
  g.set_initializer("a", test::ramp_f32({4}, 0));
  Tensor packed(DType::I4, {5});
  packed.mutable_bytes()[0] = std::byte{0x21};
  g.set_initializer("q", packed);
  test::TempDir dir;
  export_safetensors(g, dir / "m.safetensors", {.max_shard_size = 16});
  const Graph first = import_safetensors(dir / "m-00001-of-00002.safetensors");
  const Graph second = import_safetensors(dir / "m-00002-of-00002.safetensors");
  EXPECT_EQ(*first.find_metadata("safetensors.author"), "me");
  EXPECT_EQ(*second.find_metadata("safetensors.author"), "me");
  EXPECT_EQ(second.find_initializer("q")->dtype(), DType::I4);
  EXPECT_THAT(second.find_initializer("q")->to_f32(), ElementsAre(1, 2, 0, 0, 0));
  EXPECT_TRUE(import_safetensors_any(dir / "m.safetensors.index.json")
                  .find_initializer("q")
                  ->equals(packed));
}
