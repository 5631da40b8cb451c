// --precision rules as data: first match wins, the default elsewhere, fused parts share one
// precision, a rule matching nothing is a usage error; the plan's bits per weight.
#include <gtest/gtest.h>

#include "ir/error.h"
#include "quant/weights/linear_precision.h"
#include "quant/weights/linear_weight_quant.h"

using namespace qforge;

namespace {

Graph two_layers() {
  Graph g;
  for (int l = 0; l < 2; ++l)
    for (const char* m : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                          "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"})
      g.set_initializer("model.layers." + std::to_string(l) + "." + m + ".weight",
                        Tensor(DType::F32, {8, 64}));
  g.set_initializer("lm_head.weight", Tensor(DType::F32, {8, 64}));
  return g;
}

std::string usage_message(const Graph& g, const LinearWeightQuantOptions& o) {
  try {
    plan_linear_weight_quant(g, o);
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::Usage);
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST(LinearPrecision, FirstMatchWinsAndTheDefaultElsewhere) {
  const PrecisionRules rules({{R"(down_proj$)", LinearPrecision::Int8},
                              {R"(mlp\.)", LinearPrecision::Float}},
                             LinearPrecision::Int4);
  int rule = 9;
  EXPECT_EQ(rules.of("model.layers.0.mlp.down_proj", &rule), LinearPrecision::Int8);
  EXPECT_EQ(rule, 0);
  EXPECT_EQ(rules.of("model.layers.0.mlp.up_proj", &rule), LinearPrecision::Float);
  EXPECT_EQ(rule, 1);
  EXPECT_EQ(rules.of("model.layers.0.self_attn.q_proj", &rule), LinearPrecision::Int4);
  EXPECT_EQ(rule, -1);
}

TEST(LinearPrecision, FusedGroupKey) {
  EXPECT_EQ(fused_group_key("model.layers.3.self_attn.k_proj"),
            "model.layers.3.self_attn.{q_proj|k_proj|v_proj}");
  EXPECT_EQ(fused_group_key("model.layers.3.mlp.up_proj"), "model.layers.3.mlp.{gate_proj|up_proj}");
  EXPECT_EQ(fused_group_key("model.layers.3.mlp.down_proj"), "");
}

TEST(LinearPrecision, PlanGivesBitsPerWeightAndKeepsFloatOnes) {
  LinearWeightQuantOptions o;
  o.block_size = 32;
  o.precision = {{R"(mlp\.down_proj$)", LinearPrecision::Int8},
                 {R"(layers\.1\.self_attn\.o_proj$)", LinearPrecision::Float}};
  const LinearWeightPlan plan = plan_linear_weight_quant(two_layers(), o);
  ASSERT_EQ(plan.quantize.size(), plan.bits.size());
  EXPECT_EQ(plan.quantize.size(), 13u);
  for (size_t i = 0; i < plan.quantize.size(); ++i) {
    EXPECT_EQ(plan.bits[i], plan.quantize[i].find("down_proj") != std::string::npos ? 8 : 4)
        << plan.quantize[i];
  }
  ASSERT_EQ(plan.kept.size(), 2u);  // the float o_proj and lm_head, in graph order
  EXPECT_EQ(plan.kept[0].name, "model.layers.1.self_attn.o_proj.weight");
  EXPECT_NE(plan.kept[0].why.find("--precision"), std::string::npos) << plan.kept[0].why;
  EXPECT_EQ(plan.kept[1].name, "lm_head.weight");
}

TEST(LinearPrecision, RulesThatSplitAFusedLinearOrMatchNothingAreUsageErrors) {
  LinearWeightQuantOptions o;
  o.precision = {{R"(layers\.0\.self_attn\.v_proj)", LinearPrecision::Int8}};
  EXPECT_NE(usage_message(two_layers(), o).find("engines fuse"), std::string::npos);
  o.precision = {{R"(layers\.9\.)", LinearPrecision::Int8}};
  EXPECT_NE(usage_message(two_layers(), o).find("matches no decoder Linear"), std::string::npos);
  o.precision = {{R"(mlp)", LinearPrecision::Int8}, {R"(down_proj)", LinearPrecision::Float}};
  EXPECT_NE(usage_message(two_layers(), o).find("'down_proj=float' matches no"),
            std::string::npos);
  o.precision = {{R"((mlp)", LinearPrecision::Int8}};
  EXPECT_NE(usage_message(two_layers(), o).find("is not a regular expression"), std::string::npos);
}

TEST(LinearPrecision, Int8ModulesNeedNoBlockThatDividesThem) {
  Graph g;
  g.set_initializer("model.layers.0.mlp.down_proj.weight", Tensor(DType::F32, {8, 96}));
  g.set_initializer("model.layers.0.mlp.up_proj.weight", Tensor(DType::F32, {96, 64}));
  LinearWeightQuantOptions o;
  o.block_size = 64;
  o.precision = {{R"(down_proj)", LinearPrecision::Int8}};
  const LinearWeightPlan plan = plan_linear_weight_quant(g, o);
  EXPECT_EQ(plan.bits, (std::vector<int>{8, 4}));
}
