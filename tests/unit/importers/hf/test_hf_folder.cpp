// parse_hf_config and the model folder's files: configs as transformers 4 and 5 write them,
// derived defaults, and the errors that name the file and key.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "importers/hf/hf_folder.h"
#include "ir/error.h"

using namespace qforge;

namespace {

namespace fs = std::filesystem;

ErrorCategory category_of(const std::string& text) {
  try {
    parse_hf_config(text, "cfg/config.json");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cfg/config.json"), std::string::npos) << e.what();
    return e.category();
  }
  ADD_FAILURE() << "no error for " << text;
  return ErrorCategory::Internal;
}

TEST(HfConfig, ReadsLlamaConfigWithLegacyKeys) {
  const HfConfig c = parse_hf_config(
      R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
          "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2, "vocab_size": 256, "rope_theta": 10000.0,
          "torch_dtype": "bfloat16", "tie_word_embeddings": false})",
      "config.json");
  ASSERT_EQ(c.architectures.size(), 1u);
  EXPECT_EQ(c.architectures[0], "LlamaForCausalLM");
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.num_hidden_layers, 2);
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.intermediate_size, 128);
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_dim, 16);  // derived: hidden / heads
  EXPECT_EQ(c.vocab_size, 256);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.dtype, "bfloat16");
}

TEST(HfConfig, ReadsTransformers5KeysAndExplicitHeadDim) {
  const HfConfig c = parse_hf_config(
      R"({"model_type": "qwen3", "hidden_size": 64, "num_attention_heads": 4, "head_dim": 32,
          "dtype": "float32", "torch_dtype": "float16",
          "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}})",
      "config.json");
  EXPECT_EQ(c.head_dim, 32);  // Qwen3: not hidden / heads
  EXPECT_EQ(c.num_key_value_heads, 4);  // defaults to the attention heads
  EXPECT_EQ(c.dtype, "float32");  // "dtype" wins over the legacy key
  EXPECT_EQ(c.rope_theta, 1000000.0);
  EXPECT_TRUE(c.tie_word_embeddings);  // transformers' default
}

TEST(HfConfig, MissingOptionalKeysStayEmpty) {
  const HfConfig c = parse_hf_config(R"({"model_type": "x", "head_dim": null})", "config.json");
  EXPECT_TRUE(c.architectures.empty());
  EXPECT_FALSE(c.hidden_size);
  EXPECT_FALSE(c.head_dim);
  EXPECT_FALSE(c.num_key_value_heads);
  EXPECT_FALSE(c.rope_theta);
  EXPECT_TRUE(c.dtype.empty());
}

TEST(HfConfig, RejectsNonJsonAndWrongTypesNamingTheFile) {
  EXPECT_EQ(category_of("{not json"), ErrorCategory::InvalidInput);
  EXPECT_EQ(category_of("[1, 2]"), ErrorCategory::InvalidInput);
  EXPECT_EQ(category_of(R"({"hidden_size": "64"})"), ErrorCategory::InvalidInput);
  EXPECT_EQ(category_of(R"({"hidden_size": -1})"), ErrorCategory::InvalidInput);
  EXPECT_EQ(category_of(R"({"architectures": "Llama"})"), ErrorCategory::InvalidInput);
  EXPECT_EQ(category_of(R"({"tie_word_embeddings": 1})"), ErrorCategory::InvalidInput);
}

class HfFolder : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("qforge_hf_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(HfFolder, MissingConfigIsAnIoErrorNamingIt) {
  std::ofstream(dir_ / "model.safetensors") << "x";
  try {
    read_hf_config(dir_);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::IO);
    EXPECT_NE(std::string(e.what()).find("config.json"), std::string::npos) << e.what();
  }
}

TEST_F(HfFolder, PicksWeightsInTransformersOrder) {
  EXPECT_THROW(hf_weights_file(dir_), Error);
  std::ofstream(dir_ / "pytorch_model.bin") << "x";
  EXPECT_EQ(hf_weights_file(dir_).filename(), "pytorch_model.bin");
  std::ofstream(dir_ / "model.safetensors") << "x";
  EXPECT_EQ(hf_weights_file(dir_).filename(), "model.safetensors");
  std::ofstream(dir_ / "model.safetensors.index.json") << "{}";
  EXPECT_EQ(hf_weights_file(dir_).filename(), "model.safetensors.index.json");
}

}  // namespace
