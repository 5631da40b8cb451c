// merge_lora against a plain scalar reference of PEFT's formulas, one layer kind at a time.
#include <gtest/gtest.h>

#include "quant/lora/lora_merge.h"
#include "tests/unit/quant/lora/lora_test_util.h"

using namespace qforge;
using namespace qforge::lora_test;

namespace {

constexpr float kTol = 1e-6f;
const std::string P = "base_model.model.";

std::vector<float> merged(Graph& base, const LoraAdapter& a, const std::string& name,
                          PassReport* report_out = nullptr, double weight = 1.0) {
  PassReport report;
  merge_lora(base, {{a, weight}}, {}, report);
  if (report_out) *report_out = report;
  return base.find_initializer(name)->to_f32();
}

}  // namespace

TEST(LoraMerge, LinearMatchesScalarReference) {
  Graph base;
  base.set_initializer("layer.weight", random_tensor({6, 5}, 1));
  Graph w;
  w.set_initializer(P + "layer.lora_A.weight", random_tensor({3, 5}, 2));
  w.set_initializer(P + "layer.lora_B.weight", random_tensor({6, 3}, 3));
  const auto w0 = base.find_initializer("layer.weight")->to_f32();
  const auto d = ref_delta(random_tensor({3, 5}, 2).to_f32(), random_tensor({6, 3}, 3).to_f32(), 6,
                           5, 3, 2.0f);
  PassReport report;
  const auto got = merged(base, peft_adapter(config_json(3, 6), w), "layer.weight", &report);
  std::vector<float> want(w0.size());
  for (size_t i = 0; i < want.size(); ++i) want[i] = w0[i] + d[i];
  expect_near_all(got, want, kTol, "linear");
  ASSERT_EQ(report.stats["modules"].size(), 1u);
  EXPECT_EQ(report.stats["modules"][0]["match"], "name");
  EXPECT_DOUBLE_EQ(report.stats["modules"][0]["scaling"].get<double>(), 2.0);
  EXPECT_EQ(report.stats["modules_merged"], 1);
}

TEST(LoraMerge, RsLoraDividesBySqrtRank) {
  Graph base;
  base.set_initializer("l.weight", random_tensor({4, 4}, 4));
  Graph w;
  w.set_initializer("l.lora_A.weight", random_tensor({4, 4}, 5));  // no prefix: also accepted
  w.set_initializer("l.lora_B.weight", random_tensor({4, 4}, 6));
  const auto w0 = base.find_initializer("l.weight")->to_f32();
  PassReport report;
  const auto got =
      merged(base, peft_adapter(config_json(4, 8, "\"use_rslora\": true"), w), "l.weight", &report);
  EXPECT_DOUBLE_EQ(report.stats["modules"][0]["scaling"].get<double>(), 4.0);  // 8 / sqrt(4)
  const auto d = ref_delta(random_tensor({4, 4}, 5).to_f32(), random_tensor({4, 4}, 6).to_f32(), 4,
                           4, 4, 4.0f);
  std::vector<float> want(w0.size());
  for (size_t i = 0; i < want.size(); ++i) want[i] = w0[i] + d[i];
  expect_near_all(got, want, kTol, "rslora");
}

TEST(LoraMerge, RankAndAlphaPatternsPickPerModuleScaling) {
  Graph base;
  Graph w;
  for (int layer = 0; layer < 2; ++layer) {
    const std::string m = "model.layers." + std::to_string(layer) + ".self_attn.q_proj";
    const int r = layer == 0 ? 4 : 2;
    base.set_initializer(m + ".weight", random_tensor({8, 8}, 10 + layer));
    w.set_initializer(P + m + ".lora_A.weight", random_tensor({r, 8}, 20 + layer));
    w.set_initializer(P + m + ".lora_B.weight", random_tensor({8, r}, 30 + layer));
  }
  const std::string cfg =
      config_json(4, 8,
                  "\"rank_pattern\": {\"layers\\\\.1\\\\.self_attn\\\\.q_proj\": 2}, "
                  "\"alpha_pattern\": {\"q_proj\": 32, \"layers.0.self_attn.q_proj\": 1}");
  const auto w0 = base.find_initializer("model.layers.1.self_attn.q_proj.weight")->to_f32();
  PassReport report;
  merge_lora(base, {{peft_adapter(cfg, w), 1.0}}, {}, report);
  const auto& rows = report.stats["modules"];
  ASSERT_EQ(rows.size(), 2u);
  // The first matching key wins: "q_proj" comes before the layer-0 key.
  EXPECT_EQ(rows[0]["r"], 4);
  EXPECT_EQ(rows[0]["alpha_from"], "alpha_pattern['q_proj']");
  EXPECT_DOUBLE_EQ(rows[0]["scaling"].get<double>(), 8.0);
  EXPECT_EQ(rows[1]["r"], 2);
  EXPECT_EQ(rows[1]["r_from"], "rank_pattern['layers\\.1\\.self_attn\\.q_proj']");
  EXPECT_DOUBLE_EQ(rows[1]["scaling"].get<double>(), 16.0);
  const auto d = ref_delta(random_tensor({2, 8}, 21).to_f32(), random_tensor({8, 2}, 31).to_f32(),
                           8, 8, 2, 16.0f);
  const auto got = base.find_initializer("model.layers.1.self_attn.q_proj.weight")->to_f32();
  std::vector<float> want(w0.size());
  for (size_t i = 0; i < want.size(); ++i) want[i] = w0[i] + d[i];
  expect_near_all(got, want, 1e-5f, "pattern layer 1");
}

TEST(LoraMerge, FanInFanOutWritesTransposedDelta) {
  Graph base;  // GPT-2 Conv1D: weight stored [in=5, out=7]
  base.set_initializer("h.0.attn.c_attn.weight", random_tensor({5, 7}, 40));
  Graph w;
  w.set_initializer(P + "h.0.attn.c_attn.lora_A.weight", random_tensor({2, 5}, 41));
  w.set_initializer(P + "h.0.attn.c_attn.lora_B.weight", random_tensor({7, 2}, 42));
  const auto w0 = base.find_initializer("h.0.attn.c_attn.weight")->to_f32();
  const auto got = merged(base, peft_adapter(config_json(2, 2, "\"fan_in_fan_out\": true"), w),
                          "h.0.attn.c_attn.weight");
  const auto d = ref_transpose(ref_delta(random_tensor({2, 5}, 41).to_f32(),
                                         random_tensor({7, 2}, 42).to_f32(), 7, 5, 2, 1.0f),
                               7, 5);
  std::vector<float> want(w0.size());
  for (size_t i = 0; i < want.size(); ++i) want[i] = w0[i] + d[i];
  expect_near_all(got, want, kTol, "fan_in_fan_out");
}

TEST(LoraMerge, FanInFanOutContradictingShapeFailsUnlessShapeDecides) {
  Graph w;
  w.set_initializer("c.lora_A.weight", random_tensor({2, 5}, 1));
  w.set_initializer("c.lora_B.weight", random_tensor({7, 2}, 2));
  const LoraAdapter a = peft_adapter(config_json(2, 2), w);  // fan_in_fan_out false
  Graph base;
  base.set_initializer("c.weight", random_tensor({5, 7}, 3));
  const Tensor before = *base.find_initializer("c.weight");
  expect_error(
      [&] {
        PassReport r;
        merge_lora(base, {{a, 1.0}}, {}, r);
      },
      ErrorCategory::InvalidInput,
      {"'c.weight'", "[5, 7]", "fan_in_fan_out=false", "GPT-2 Conv1D"});
  EXPECT_TRUE(base.find_initializer("c.weight")->equals(before));
  PassReport r;
  LoraMergeOptions opts;
  opts.fan_in_fan_out_from_shape = true;
  merge_lora(base, {{a, 1.0}}, opts, r);
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_NE(r.warnings[0].find("fan_in_fan_out"), std::string::npos);
  EXPECT_EQ(r.stats["modules"][0]["layout"], "in,out");
}

TEST(LoraMerge, SquareWeightFollowsFanInFanOutFlag) {
  for (bool fif : {false, true}) {
    Graph base;
    base.set_initializer("c.weight", random_tensor({4, 4}, 50));
    Graph w;
    w.set_initializer("c.lora_A.weight", random_tensor({2, 4}, 51));
    w.set_initializer("c.lora_B.weight", random_tensor({4, 2}, 52));
    const auto w0 = base.find_initializer("c.weight")->to_f32();
    const std::string cfg =
        config_json(2, 2, std::string("\"fan_in_fan_out\": ") + (fif ? "true" : "false"));
    const auto got = merged(base, peft_adapter(cfg, w), "c.weight");
    auto d = ref_delta(random_tensor({2, 4}, 51).to_f32(), random_tensor({4, 2}, 52).to_f32(), 4, 4,
                       2, 1.0f);
    if (fif) d = ref_transpose(d, 4, 4);
    std::vector<float> want(w0.size());
    for (size_t i = 0; i < want.size(); ++i) want[i] = w0[i] + d[i];
    expect_near_all(got, want, kTol, fif ? "square fan_in_fan_out" : "square linear");
  }
}

TEST(LoraMerge, Conv1x1And3x3MatchReference) {
  for (int k : {1, 3}) {
    Graph base;
    base.set_initializer("conv.weight", random_tensor({6, 4, k, k}, 60 + k));
    Graph w;
    w.set_initializer("conv.lora_A.weight", random_tensor({3, 4, k, k}, 70 + k));
    w.set_initializer("conv.lora_B.weight", random_tensor({6, 3, 1, 1}, 80 + k));
    const auto w0 = base.find_initializer("conv.weight")->to_f32();
    PassReport report;
    const auto got = merged(base, peft_adapter(config_json(3, 1.5), w), "conv.weight", &report);
    const auto d = ref_delta(random_tensor({3, 4, k, k}, 70 + k).to_f32(),
                             random_tensor({6, 3, 1, 1}, 80 + k).to_f32(), 6, 4 * k * k, 3, 0.5f);
    std::vector<float> want(w0.size());
    for (size_t i = 0; i < want.size(); ++i) want[i] = w0[i] + d[i];
    expect_near_all(got, want, kTol, "conv k=" + std::to_string(k));
    EXPECT_EQ(report.stats["modules"][0]["kind"], "conv");
  }
}

TEST(LoraMerge, GroupedConvIsRefusedAsPeftDoes) {
  Graph base;
  base.set_initializer("conv.weight", random_tensor({8, 2, 3, 3}, 1));  // groups = 4 / 2
  Graph w;
  w.set_initializer("conv.lora_A.weight", random_tensor({2, 4, 3, 3}, 2));
  w.set_initializer("conv.lora_B.weight", random_tensor({8, 2, 1, 1}, 3));
  expect_error(
      [&] {
        PassReport r;
        merge_lora(base, {{peft_adapter(config_json(2, 2), w), 1.0}}, {}, r);
      },
      ErrorCategory::Unsupported, {"'conv.weight'", "grouped convolution (groups=2)", "PEFT"});
}

TEST(LoraMerge, EmbeddingAddsTransposedProduct) {
  Graph base;
  base.set_initializer("emb.weight", random_tensor({10, 6}, 90));  // [num, dim]
  Graph w;
  w.set_initializer(P + "emb.lora_embedding_A", random_tensor({2, 10}, 91));
  w.set_initializer(P + "emb.lora_embedding_B", random_tensor({6, 2}, 92));
  const auto w0 = base.find_initializer("emb.weight")->to_f32();
  PassReport report;
  const auto got = merged(base, peft_adapter(config_json(2, 4), w), "emb.weight", &report);
  const auto d = ref_transpose(ref_delta(random_tensor({2, 10}, 91).to_f32(),
                                         random_tensor({6, 2}, 92).to_f32(), 6, 10, 2, 2.0f),
                               6, 10);
  std::vector<float> want(w0.size());
  for (size_t i = 0; i < want.size(); ++i) want[i] = w0[i] + d[i];
  expect_near_all(got, want, kTol, "embedding");
  EXPECT_EQ(report.stats["modules"][0]["kind"], "embedding");
}
