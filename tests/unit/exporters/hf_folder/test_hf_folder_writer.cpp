// write_hf_folder: side files copied byte for byte, weights sharded, the folder put in place
// whole or not at all, and an existing folder replaced only when asked.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "exporters/hf_folder/hf_folder_writer.h"
#include "importers/safetensors/safetensors_reader.h"
#include "ir/error.h"

using namespace qforge;

namespace {

namespace fs = std::filesystem;

std::string read_text(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::vector<std::string> listing(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

Graph weights() {
  Graph g;
  for (const char* name : {"a.weight", "b.weight", "c.weight"}) {
    Tensor t(DType::F32, {16, 16});
    auto v = t.mutable_data<float>();
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) + name[0];
    g.set_initializer(name, t);
  }
  return g;
}

class HfFolderWriter : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("qforge_hfw_" +
             std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "src");
    std::ofstream(root_ / "src" / "config.json") << "{\"model_type\": \"llama\"}";
    std::ofstream(root_ / "src" / "tokenizer.json") << "{\"t\": 1}";
    std::ofstream(root_ / "src" / "spm.model") << "binary";
    std::ofstream(root_ / "src" / "model.safetensors") << "old weights";
    std::ofstream(root_ / "src" / "README.md") << "not copied";
  }
  void TearDown() override { fs::remove_all(root_); }
  fs::path root_;
};

TEST_F(HfFolderWriter, CopiesSideFilesAndWritesOneFileUnderTheLimit) {
  HfFolderWriteOptions opts;
  opts.source_dir = root_ / "src";
  write_hf_folder(weights(), root_ / "out/", opts);
  EXPECT_EQ(listing(root_ / "out"), (std::vector<std::string>{"config.json", "model.safetensors",
                                                               "spm.model", "tokenizer.json"}));
  EXPECT_EQ(read_text(root_ / "out" / "config.json"), "{\"model_type\": \"llama\"}");
  EXPECT_EQ(read_text(root_ / "out" / "spm.model"), "binary");
  const Graph back = import_safetensors(root_ / "out" / "model.safetensors");
  EXPECT_EQ(back.initializers().size(), 3u);
  EXPECT_EQ(listing(root_), (std::vector<std::string>{"out", "src"}));  // no temporary left
}

TEST_F(HfFolderWriter, ShardsWithAnIndex) {
  HfFolderWriteOptions opts;
  opts.max_shard_size = 1500;  // one 1 KiB tensor per shard
  write_hf_folder(weights(), root_ / "out", opts);
  EXPECT_EQ(listing(root_ / "out"),
            (std::vector<std::string>{"model-00001-of-00003.safetensors",
                                      "model-00002-of-00003.safetensors",
                                      "model-00003-of-00003.safetensors",
                                      "model.safetensors.index.json"}));
}

TEST_F(HfFolderWriter, RefusesAnExistingFolderUnlessOverwrite) {
  fs::create_directories(root_ / "out");
  std::ofstream(root_ / "out" / "mine.txt") << "keep";
  HfFolderWriteOptions opts;
  try {
    write_hf_folder(weights(), root_ / "out", opts);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::Usage);
  }
  EXPECT_EQ(listing(root_ / "out"), std::vector<std::string>{"mine.txt"});
  opts.overwrite = true;
  write_hf_folder(weights(), root_ / "out", opts);
  EXPECT_EQ(listing(root_ / "out"), std::vector<std::string>{"model.safetensors"});
  EXPECT_EQ(listing(root_), (std::vector<std::string>{"out", "src"}));
}

TEST_F(HfFolderWriter, LeavesNothingWhenTheWeightsCannotBeWritten) {
  Graph g = weights();
  g.set_initializer("__metadata__", Tensor(DType::F32, {1}));  // a name safetensors reserves
  HfFolderWriteOptions opts;
  opts.source_dir = root_ / "src";
  EXPECT_THROW(write_hf_folder(g, root_ / "out", opts), Error);
  EXPECT_EQ(listing(root_), std::vector<std::string>{"src"});
}

TEST(HfSideFiles, KnowsTokenizerAndGenerationFiles) {
  for (const char* name : {"config.json", "generation_config.json", "tokenizer.json",
                           "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                           "merges.txt", "tokenizer.model", "qwen.tiktoken"}) {
    EXPECT_TRUE(is_hf_side_file(name)) << name;
  }
  for (const char* name : {"model.safetensors", "pytorch_model.bin", "README.md",
                           "model.safetensors.index.json", "adapter_config.json"}) {
    EXPECT_FALSE(is_hf_side_file(name)) << name;
  }
}

}  // namespace
