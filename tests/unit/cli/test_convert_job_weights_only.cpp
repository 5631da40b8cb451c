// The convert driver on a weights-only checkpoint: the schemes that need nodes or activations
// stop with a usage error before anything is written, and a plain rewrite keeps every tensor.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "cli/convert_job.h"
#include "exporters/safetensors/safetensors_writer.h"
#include "importers/load_model.h"
#include "ir/error.h"

namespace qforge::cli {
namespace {

namespace fs = std::filesystem;

class ConvertWeightsOnly : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("qforge_convert_weights_only_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    Graph g;
    g.set_initializer("proj.weight", Tensor::from_f32(std::vector<float>(16 * 64, 0.5f), {16, 64}));
    g.set_initializer("proj.bias", Tensor::from_f32(std::vector<float>(16, 0.25f), {16}));
    export_safetensors(g, (dir_ / "in.safetensors").string(), {});
  }
  void TearDown() override { fs::remove_all(dir_); }

  ConvertOptions options(const std::string& quant, const std::string& out) const {
    ConvertOptions o;
    o.input = (dir_ / "in.safetensors").string();
    o.output = (dir_ / out).string();
    o.quant = quant;
    return o;
  }

  fs::path dir_;
};

// No tensor is named as a decoder's Linear weight: nothing for the weight-only schemes.
TEST_F(ConvertWeightsOnly, WeightOnlySchemesWithoutLinearWeightsStopWithWhatToDo) {
  for (const char* quant : {"int8-weights", "w4a16"}) {
    const ConvertOptions o = options(quant, "q.safetensors");
    try {
      convert_model(o);
      ADD_FAILURE() << quant << " did not throw";
    } catch (const Error& e) {
      EXPECT_EQ(e.category(), ErrorCategory::Usage) << e.what();
      const std::string m = e.what();
      EXPECT_NE(m.find("--quant " + std::string(quant)), std::string::npos) << m;
      EXPECT_NE(m.find("found no Linear weight"), std::string::npos) << m;
      EXPECT_NE(m.find("(2 tensors)"), std::string::npos) << m;
      EXPECT_NE(m.find("without --quant"), std::string::npos) << m;
    }
    EXPECT_FALSE(fs::exists(o.output)) << quant;
  }
}

TEST_F(ConvertWeightsOnly, RewriteKeepsEveryTensor) {
  const ConvertOptions o = options("none", "out.safetensors");
  const ConvertResult r = convert_model(o);
  EXPECT_EQ(r.weights_bytes_out, r.weights_bytes_in);
  const Graph back = load_model(o.output).graph;
  ASSERT_EQ(back.initializers().size(), 2u);
  EXPECT_TRUE(back.find_initializer("proj.weight")->equals(
      *load_model(o.input).graph.find_initializer("proj.weight")));
}

}  // namespace
}  // namespace qforge::cli
