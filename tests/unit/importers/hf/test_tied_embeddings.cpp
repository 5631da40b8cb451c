// record_tied_embeddings: when the config.json beside a safetensors checkpoint ties lm_head.weight
// to the input embedding, and when it does not.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "importers/hf/tied_embeddings.h"
#include "ir/tied_weights.h"

using namespace qforge;

namespace {

namespace fs = std::filesystem;

class TiedEmbeddings : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("qforge_tied_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The ties recorded for a checkpoint beside `config` (no config.json when empty).
  std::vector<TiedWeight> ties(const std::string& config, bool with_head,
                               Shape head_shape = {8, 4}) const {
    fs::remove(dir_ / "config.json");
    if (!config.empty()) std::ofstream(dir_ / "config.json") << config;
    Graph g;
    g.set_initializer("model.embed_tokens.weight", Tensor(DType::F32, {8, 4}));
    if (with_head) g.set_initializer("lm_head.weight", Tensor(DType::F32, head_shape));
    record_tied_embeddings(dir_ / "model.safetensors", g);
    return tied_weights(g);
  }

  fs::path dir_;
};

bool ties_head(const std::vector<TiedWeight>& t) {
  return t.size() == 1 && t[0].alias == "lm_head.weight" &&
         t[0].source == "model.embed_tokens.weight";
}

}  // namespace

TEST_F(TiedEmbeddings, ConfigSettingTheTieRecordsIt) {
  EXPECT_TRUE(ties_head(ties(R"({"tie_word_embeddings": true})", false)));
  EXPECT_TRUE(ties_head(ties(R"({"tie_word_embeddings": true})", true)));
}

TEST_F(TiedEmbeddings, LeftOutTiesOnlyWhenTheHeadIsMissing) {
  EXPECT_TRUE(ties_head(ties(R"({"model_type": "llama"})", false)));
  EXPECT_TRUE(ties(R"({"model_type": "llama"})", true).empty());
}

TEST_F(TiedEmbeddings, NoTieWhenUntiedUnreadableOrAnotherShape) {
  EXPECT_TRUE(ties(R"({"tie_word_embeddings": false})", false).empty());
  EXPECT_TRUE(ties("", false).empty());
  EXPECT_TRUE(ties("not json", false).empty());
  EXPECT_TRUE(ties(R"({"tie_word_embeddings": true})", true, {4, 8}).empty());
}
