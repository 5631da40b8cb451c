// build_peft_adapter / build_kohya_adapter: the key forms PEFT and Kohya write, and what is
// refused; parse_adapter_spec.
#include <gtest/gtest.h>

#include "importers/lora/lora_adapter.h"
#include "tests/unit/quant/lora/lora_test_util.h"

using namespace qforge;
using namespace qforge::lora_test;

namespace {

LoraAdapter build(const std::string& extra,
                  const std::vector<std::pair<std::string, Shape>>& keys) {
  Graph w;
  uint32_t seed = 1;
  for (const auto& [k, s] : keys) w.set_initializer(k, random_tensor(s, seed++));
  return peft_adapter(config_json(2, 4, extra), w);
}

}  // namespace

TEST(LoraAdapter, ReadsEveryPeftKeyForm) {
  const LoraAdapter a =
      build("\"use_dora\": true, \"lora_bias\": true",
            {
                {"base_model.model.model.q.lora_A.weight", {2, 4}},
                {"base_model.model.model.q.lora_B.weight", {3, 2}},
                {"base_model.model.model.q.lora_B.bias", {3}},
                {"base_model.model.model.q.lora_magnitude_vector", {3}},
                {"model.k.lora_A.default.weight", {2, 4}},  // no prefix, adapter name kept
                {"model.k.lora_B.default.weight", {3, 2}},
                {"model.k.lora_B.default.bias", {3}},
                {"model.k.lora_magnitude_vector.default.weight", {3}},
                {"base_model.model.emb.lora_embedding_A", {2, 10}},
                {"base_model.model.emb.lora_embedding_B", {5, 2}},
                {"base_model.model.emb.lora_magnitude_vector", {5}},
                {"base_model.model.emb.base_layer.weight", {10, 5}},
                {"base_model.model.classifier.modules_to_save.default.weight", {2, 5}},
                {"base_model.model.score.bias", {2}},
            });
  ASSERT_EQ(a.modules.size(), 3u);
  EXPECT_EQ(a.modules[0].name, "model.q");
  EXPECT_EQ(a.modules[0].kind, LoraLayerKind::Linear);
  EXPECT_EQ(a.modules[0].out_features(), 3);
  EXPECT_EQ(a.modules[0].in_features(), 4);
  EXPECT_FALSE(a.modules[0].bias.empty());
  EXPECT_FALSE(a.modules[0].magnitude.empty());
  EXPECT_EQ(a.modules[1].name, "model.k");
  EXPECT_EQ(a.modules[1].keys.size(), 4u);
  EXPECT_EQ(a.modules[2].kind, LoraLayerKind::Embedding);
  EXPECT_DOUBLE_EQ(a.modules[2].scaling, 2.0);
  ASSERT_EQ(a.replacements.size(), 3u);
  EXPECT_EQ(a.replacements[0].target, "emb.weight");
  EXPECT_EQ(a.replacements[1].target, "classifier.weight");
  EXPECT_EQ(a.replacements[2].target, "score.bias");
}

TEST(LoraAdapter, ConvFactorsAreConv) {
  const LoraAdapter a =
      build("", {{"c.lora_A.weight", {2, 3, 3, 3}}, {"c.lora_B.weight", {8, 2, 1, 1}}});
  EXPECT_EQ(a.modules[0].kind, LoraLayerKind::Conv);
  EXPECT_EQ(a.modules[0].in_features(), 27);
}

TEST(LoraAdapter, RefusesIncompleteOrInconsistentModules) {
  expect_error(
      [] {
        build("", {{"m.lora_A.weight", {2, 4}}});
      },
      ErrorCategory::InvalidInput, {"module 'm'", "lora_A but no lora_B"});
  expect_error(
      [] {
        build("", {{"m.lora_A.weight", {3, 4}}, {"m.lora_B.weight", {5, 3}}});
      },
      ErrorCategory::InvalidInput, {"module 'm' has rank 3", "r gives r=2"});
  expect_error(
      [] {
        build("", {{"m.lora_A.weight", {2, 4}}, {"m.lora_B.weight", {5, 3}}});
      },
      ErrorCategory::InvalidInput, {"do not multiply", "lora_A [2, 4], lora_B [5, 3]"});
  expect_error(
      [] {
        build("", {{"m.lora_A.weight", {2, 4}},
                   {"m.lora_B.weight", {5, 2}},
                   {"m.lora_magnitude_vector", {5}}});
      },
      ErrorCategory::InvalidInput, {"lora_magnitude_vector but use_dora is false"});
  expect_error(
      [] {
        build("\"use_dora\": true", {{"m.lora_A.weight", {2, 4}}, {"m.lora_B.weight", {5, 2}}});
      },
      ErrorCategory::InvalidInput,
      {"use_dora is true but module 'm' has no lora_magnitude_vector"});
  expect_error(
      [] {
        build("\"use_dora\": true", {{"m.lora_A.weight", {2, 4}},
                                     {"m.lora_B.weight", {5, 2}},
                                     {"m.lora_magnitude_vector", {4}}});
      },
      ErrorCategory::InvalidInput, {"lora_magnitude_vector of shape [4]", "5 output rows"});
  expect_error(
      [] {
        build("",
              {{"m.lora_A.weight", {2, 4}}, {"m.lora_B.weight", {5, 2}}, {"m.lora_B.bias", {5}}});
      },
      ErrorCategory::InvalidInput, {"lora_B.bias but lora_bias is false"});
  expect_error(
      [] {
        build("", {{"m.lora_A.a.weight", {2, 4}},
                   {"m.lora_B.a.weight", {5, 2}},
                   {"n.lora_A.b.weight", {2, 4}},
                   {"n.lora_B.b.weight", {5, 2}}});
      },
      ErrorCategory::InvalidInput, {"several adapters (a, b"});
  expect_error(
      [] {
        build("", {{"m.lora_A.x.y.weight", {2, 4}}});
      },
      ErrorCategory::InvalidInput, {"key 'm.lora_A.x.y.weight' is not a PEFT LoRA key"});
  expect_error(
      [] {
        build("", {{"emb.token_adapter.trainable_tokens_delta", {2, 4}}});
      },
      ErrorCategory::Unsupported, {"trainable tokens"});
  expect_error(
      [] {
        build("", {{"m.lora_A.weight", {2, 4}}, {"m.lora_embedding_B", {5, 2}}});
      },
      ErrorCategory::InvalidInput, {"both lora_A/B and lora_embedding_A/B"});
}

TEST(LoraAdapter, KohyaReadsAlphaAndRefusesOtherFormats) {
  Graph w;
  w.set_initializer("lora_te_x_q.lora_down.weight", random_tensor({4, 8}, 1));
  w.set_initializer("lora_te_x_q.lora_up.weight", random_tensor({8, 4}, 2));
  w.set_initializer("lora_te_x_q.alpha",
                    Tensor::from_f32(std::vector<float>{2.0f}, {}, DType::F16));
  ASSERT_TRUE(is_kohya_weights(w));
  const LoraAdapter a = build_kohya_adapter(w, "k.safetensors");
  ASSERT_EQ(a.modules.size(), 1u);
  EXPECT_EQ(a.modules[0].r, 4);
  EXPECT_DOUBLE_EQ(a.modules[0].scaling, 0.5);
  EXPECT_EQ(a.modules[0].alpha_from, "lora_te_x_q.alpha");
  Graph dora = w;
  dora.set_initializer("lora_te_x_q.dora_scale", random_tensor({1, 8}, 3));
  expect_error([&] { build_kohya_adapter(dora, "k.safetensors"); }, ErrorCategory::Unsupported,
               {"k.safetensors", "dora_scale"});
  Graph loha;
  loha.set_initializer("lora_unet_a.hada_w1_a", random_tensor({2, 2}, 4));
  expect_error([&] { build_kohya_adapter(loha, "k.safetensors"); }, ErrorCategory::Unsupported,
               {"LoHa"});
  Graph orphan = w;
  orphan.set_initializer("lora_te_y.alpha", Tensor::from_f32(std::vector<float>{1.0f}, {}));
  expect_error([&] { build_kohya_adapter(orphan, "k.safetensors"); }, ErrorCategory::InvalidInput,
               {"'lora_te_y.alpha' has no lora_down/lora_up"});
}

TEST(LoraAdapter, ParsesAdapterSpecWeights) {
  auto s = parse_adapter_spec("adapters/a:0.7");
  EXPECT_EQ(s.path, "adapters/a");
  EXPECT_DOUBLE_EQ(s.weight, 0.7);
  s = parse_adapter_spec("b:-1e-1");
  EXPECT_DOUBLE_EQ(s.weight, -0.1);
  s = parse_adapter_spec("dir/with:colon");
  EXPECT_EQ(s.path, "dir/with:colon");
  EXPECT_DOUBLE_EQ(s.weight, 1.0);
  s = parse_adapter_spec("plain");
  EXPECT_EQ(s.path, "plain");
  EXPECT_DOUBLE_EQ(s.weight, 1.0);
}
