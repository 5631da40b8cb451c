// What merge_lora refuses, and how it says so; Kohya name matching; the Pass wrapper.
#include <gtest/gtest.h>

#include "quant/lora/lora_merge.h"
#include "tests/unit/quant/lora/lora_test_util.h"

using namespace qforge;
using namespace qforge::lora_test;

namespace {

Graph two_module_weights() {
  Graph w;
  for (const char* m : {"model.q", "model.missing"}) {
    w.set_initializer(std::string("base_model.model.") + m + ".lora_A.weight",
                      random_tensor({2, 4}, 1));
    w.set_initializer(std::string("base_model.model.") + m + ".lora_B.weight",
                      random_tensor({4, 2}, 2));
  }
  return w;
}

}  // namespace

TEST(LoraMerge, UnmatchedKeysAreListedAndNothingChanges) {
  Graph base;
  base.set_initializer("model.q.weight", random_tensor({4, 4}, 3));
  const Tensor before = *base.find_initializer("model.q.weight");
  const LoraAdapter a = peft_adapter(config_json(2, 2), two_module_weights(), "ad");
  expect_error(
      [&] {
        PassReport r;
        merge_lora(base, {{a, 1.0}}, {}, r);
      },
      ErrorCategory::InvalidInput,
      {"2 adapter tensors land on no base weight",
       "ad: base_model.model.model.missing.lora_A.weight",
       "ad: base_model.model.model.missing.lora_B.weight", "allow unmatched"});
  EXPECT_TRUE(base.find_initializer("model.q.weight")->equals(before));
}

TEST(LoraMerge, AllowUnmatchedWarnsAndMergesTheRest) {
  Graph base;
  base.set_initializer("model.q.weight", random_tensor({4, 4}, 3));
  const Tensor before = *base.find_initializer("model.q.weight");
  LoraMergeOptions opts;
  opts.allow_unmatched = true;
  PassReport report;
  merge_lora(base, {{peft_adapter(config_json(2, 2), two_module_weights()), 1.0}}, opts, report);
  ASSERT_EQ(report.warnings.size(), 1u);
  EXPECT_NE(report.warnings[0].find("model.missing.lora_A.weight"), std::string::npos);
  EXPECT_EQ(report.stats["unmatched_keys"], 2);
  EXPECT_FALSE(base.find_initializer("model.q.weight")->equals(before));
}

TEST(LoraMerge, ShapeMismatchNamesWeightAndFactors) {
  Graph base;
  base.set_initializer("model.q.weight", random_tensor({4, 3}, 3));
  Graph w;
  w.set_initializer("model.q.lora_A.weight", random_tensor({2, 4}, 1));
  w.set_initializer("model.q.lora_B.weight", random_tensor({4, 2}, 2));
  expect_error(
      [&] {
        PassReport r;
        merge_lora(base, {{peft_adapter(config_json(2, 2), w), 1.0}}, {}, r);
      },
      ErrorCategory::InvalidInput, {"'model.q.weight' [4, 3]", "[4, 4]", "another model"});
}

TEST(LoraMerge, LoraBiasWithoutBaseBiasIsUnmatched) {
  Graph base;
  base.set_initializer("fc.weight", random_tensor({3, 4}, 3));
  Graph w;
  w.set_initializer("fc.lora_A.weight", random_tensor({2, 4}, 1));
  w.set_initializer("fc.lora_B.weight", random_tensor({3, 2}, 2));
  w.set_initializer("fc.lora_B.bias", random_tensor({3}, 4));
  expect_error(
      [&] {
        PassReport r;
        merge_lora(base, {{peft_adapter(config_json(2, 2, "\"lora_bias\": true"), w), 1.0}}, {}, r);
      },
      ErrorCategory::InvalidInput, {"fc.lora_B.bias"});
}

TEST(LoraMerge, QuantizedBaseIsUnsupported) {
  Graph base;
  base.set_initializer("fc.weight", Tensor(DType::I8, {3, 4}));
  Graph w;
  w.set_initializer("fc.lora_A.weight", random_tensor({2, 4}, 1));
  w.set_initializer("fc.lora_B.weight", random_tensor({3, 2}, 2));
  expect_error(
      [&] {
        PassReport r;
        merge_lora(base, {{peft_adapter(config_json(2, 2), w), 1.0}}, {}, r);
      },
      ErrorCategory::Unsupported, {"'fc.weight' is i8", "merge before quantizing"});
}

TEST(LoraMerge, PrefixedAdapterBindsBySuffixAndReportsIt) {
  Graph base;  // a BertModel state dict; the adapter was trained on BertForSequenceClassification
  base.set_initializer("encoder.layer.0.attention.self.query.weight", random_tensor({4, 4}, 3));
  Graph w;
  w.set_initializer("base_model.model.bert.encoder.layer.0.attention.self.query.lora_A.weight",
                    random_tensor({2, 4}, 1));
  w.set_initializer("base_model.model.bert.encoder.layer.0.attention.self.query.lora_B.weight",
                    random_tensor({4, 2}, 2));
  PassReport report;
  merge_lora(base, {{peft_adapter(config_json(2, 2), w), 1.0}}, {}, report);
  EXPECT_EQ(report.stats["modules"][0]["match"], "suffix");
  EXPECT_EQ(report.stats["modules"][0]["initializer"],
            "encoder.layer.0.attention.self.query.weight");
}

TEST(LoraMerge, KohyaFlatNamesBindToDottedWeights) {
  Graph base;
  base.set_initializer("down_blocks.0.attentions.0.proj_in.weight", random_tensor({6, 4, 1, 1}, 3));
  base.set_initializer("text_model.encoder.layers.0.self_attn.q_proj.weight",
                       random_tensor({4, 4}, 4));
  Graph w;
  w.set_initializer("lora_unet_down_blocks_0_attentions_0_proj_in.lora_down.weight",
                    random_tensor({2, 4, 1, 1}, 1));
  w.set_initializer("lora_unet_down_blocks_0_attentions_0_proj_in.lora_up.weight",
                    random_tensor({6, 2, 1, 1}, 2));
  w.set_initializer("lora_unet_down_blocks_0_attentions_0_proj_in.alpha",
                    Tensor::from_f32(std::vector<float>{1.0f}, {}));
  w.set_initializer("lora_te_text_model_encoder_layers_0_self_attn_q_proj.lora_down.weight",
                    random_tensor({2, 4}, 5));
  w.set_initializer("lora_te_text_model_encoder_layers_0_self_attn_q_proj.lora_up.weight",
                    random_tensor({4, 2}, 6));
  LoraAdapter a = build_kohya_adapter(w, "k.safetensors");
  const auto w0 = base.find_initializer("down_blocks.0.attentions.0.proj_in.weight")->to_f32();
  PassReport report;
  merge_lora(base, {{a, 1.0}}, {}, report);
  ASSERT_EQ(report.stats["modules"].size(), 2u);
  EXPECT_EQ(report.stats["modules"][0]["match"], "flat-name");
  EXPECT_DOUBLE_EQ(report.stats["modules"][0]["scaling"].get<double>(), 0.5);  // alpha 1 / r 2
  EXPECT_DOUBLE_EQ(report.stats["modules"][1]["scaling"].get<double>(),
                   1.0);  // no alpha: alpha = r
  const auto d = ref_delta(random_tensor({2, 4, 1, 1}, 1).to_f32(),
                           random_tensor({6, 2, 1, 1}, 2).to_f32(), 6, 4, 2, 0.5f);
  std::vector<float> want(w0.size());
  for (size_t i = 0; i < want.size(); ++i) want[i] = w0[i] + d[i];
  expect_near_all(base.find_initializer("down_blocks.0.attentions.0.proj_in.weight")->to_f32(),
                  want, 1e-6f, "kohya conv");
}

TEST(LoraMerge, PassWrapperRunsInPipeline) {
  Graph base;
  base.set_initializer("fc.weight", random_tensor({3, 4}, 3));
  Graph w;
  w.set_initializer("fc.lora_A.weight", random_tensor({2, 4}, 1));
  w.set_initializer("fc.lora_B.weight", random_tensor({3, 2}, 2));
  Pipeline pipeline;
  pipeline.add(make_lora_merge_pass({{peft_adapter(config_json(2, 2), w), 1.0}}, {}));
  const PipelineReport report = pipeline.run(base);
  ASSERT_EQ(report.passes.size(), 1u);
  EXPECT_EQ(report.passes[0].pass, "lora-merge");
  EXPECT_EQ(report.passes[0].stats["modules_merged"], 1);
}
