// compressed-tensors' quantization_config for a mixed-precision model: one group per scheme with
// anchored regex targets that match exactly its modules, format mixed-precision; one scheme keeps
// the single group targeting Linear.
#include <gtest/gtest.h>

#include <regex>

#include "exporters/compressed_tensors/compressed_tensors_writer.h"

using namespace qforge;

namespace {

// As compressed-tensors' match_name: "re:" then Python's re.match (from the start).
bool matches(const std::vector<std::string>& targets, const std::string& module) {
  for (const std::string& t : targets) {
    if (!t.starts_with("re:")) continue;
    if (std::regex_search(module, std::regex(t.substr(3)), std::regex_constants::match_continuous))
      return true;
  }
  return false;
}

}  // namespace

TEST(CompressedTensorsMixedConfig, TargetsMatchExactlyTheirModules) {
  const std::vector<std::string> mods = {"model.layers.10.mlp.down_proj", "model.layers.2.mlp.down_proj",
                                         "model.layers.1.self_attn.q_proj", "lm_head"};
  const std::vector<std::string> t = module_targets(mods);
  EXPECT_EQ(t, (std::vector<std::string>{R"(re:^model\.layers\.(?:2|10)\.mlp\.down_proj$)",
                                         R"(re:^model\.layers\.1\.self_attn\.q_proj$)",
                                         R"(re:^lm_head$)"}));
  for (const std::string& m : mods) EXPECT_TRUE(matches(t, m)) << m;
  for (const char* other : {"model.layers.1.mlp.down_proj", "model.layers.100.mlp.down_proj",
                            "model.layers.2.mlp.down_proj_x", "model.layers.1.self_attn.q_proj2",
                            "model.layers.1.self_attn.k_proj", "lm_headx"}) {
    EXPECT_FALSE(matches(t, other)) << other;
  }
  std::vector<std::string> reversed(mods.rbegin(), mods.rend());
  EXPECT_EQ(module_targets(reversed), t);  // independent of the order written
}

TEST(CompressedTensorsMixedConfig, OneGroupPerSchemeAndFormatMixedPrecision) {
  const std::map<std::pair<int, int64_t>, std::vector<std::string>> schemes = {
      {{4, 32}, {"model.layers.0.self_attn.q_proj"}},
      {{8, 0}, {"model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"}}};
  const auto c = compressed_tensors_config(schemes, {"lm_head", "model.layers.1.self_attn.o_proj"});
  EXPECT_EQ(c["format"], "mixed-precision");
  EXPECT_EQ(c["quant_method"], "compressed-tensors");
  ASSERT_EQ(c["config_groups"].size(), 2u);
  const auto& g0 = c["config_groups"]["group_0"];
  const auto& g1 = c["config_groups"]["group_1"];
  EXPECT_EQ(g0["format"], "pack-quantized");
  EXPECT_EQ(g1["format"], "pack-quantized");
  EXPECT_EQ(g0["weights"]["num_bits"], 4);
  EXPECT_EQ(g0["weights"]["strategy"], "group");
  EXPECT_EQ(g0["weights"]["group_size"], 32);
  EXPECT_EQ(g0["targets"], nlohmann::ordered_json({R"(re:^model\.layers\.0\.self_attn\.q_proj$)"}));
  EXPECT_EQ(g1["weights"]["num_bits"], 8);
  EXPECT_EQ(g1["weights"]["strategy"], "channel");
  EXPECT_TRUE(g1["weights"]["group_size"].is_null());
  EXPECT_EQ(g1["targets"],
            nlohmann::ordered_json({R"(re:^model\.layers\.(?:0|1)\.mlp\.down_proj$)"}));
  EXPECT_EQ(c["ignore"], nlohmann::ordered_json({"lm_head", "model.layers.1.self_attn.o_proj"}));
}

TEST(CompressedTensorsMixedConfig, OneSchemeTargetsLinear) {
  const auto c = compressed_tensors_config({{{4, 128}, {"model.layers.0.mlp.up_proj"}}}, {"lm_head"});
  EXPECT_EQ(c["format"], "pack-quantized");
  ASSERT_EQ(c["config_groups"].size(), 1u);
  EXPECT_EQ(c["config_groups"]["group_0"]["targets"], nlohmann::ordered_json({"Linear"}));
}
