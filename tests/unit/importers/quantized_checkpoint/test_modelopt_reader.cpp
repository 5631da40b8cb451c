// ModelOpt's Hugging Face export read back: known integers packed by qforge's ModelOpt packer,
// the config's group size against the scales, the pre-quant scale folded where exact and refused
// where not, exclude_modules matched as ModelOpt's prefix wildcards, hand-made corrupt folders
// refused naming the tensor.
#include "importers/quantized_checkpoint/modelopt_reader.h"

#include <gtest/gtest.h>

#include "exporters/modelopt/modelopt_writer.h"
#include "importers/quantized_checkpoint/modelopt_int4.h"
#include "ir/error.h"
#include "ir/quantized_linear.h"

using namespace qforge;

namespace {

const std::string kModule = "model.layers.0.self_attn.o_proj";

int q_at(int64_t r, int64_t c) { return static_cast<int>((r * 5 + c * 3) % 16) - 8; }

Tensor int4_values(int64_t n, int64_t k) {
  std::vector<int8_t> q;
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < k; ++c) q.push_back(static_cast<int8_t>(q_at(r, c)));
  }
  return linear_values_tensor(q, 4, n, k);
}

Tensor scales(Shape shape, DType dtype = DType::F32) {
  int64_t count = 1;
  for (const int64_t d : shape) count *= d;
  std::vector<float> v(static_cast<size_t>(count));
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.0078125f * static_cast<float>(i + 1);
  return Tensor::from_f32(v, std::move(shape), dtype);
}

Graph raw(int64_t n = 4, int64_t k = 64, int64_t group = 32) {
  Graph g;
  g.set_initializer(kModule + ".weight", pack_modelopt_int4(int4_values(n, k)));
  g.set_initializer(kModule + ".weight_scale", scales({n, k / group}));
  g.set_initializer("lm_head.weight", Tensor(DType::F16, {8, k}));
  return g;
}

std::string hf_quant(const std::string& algo = "W4A16_AWQ", const std::string& extra = "") {
  return R"({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": ")" + algo +
         R"(", "kv_cache_quant_algo": null, "group_size": 32, "has_zero_point": false,
         "pre_quant_scale": true, "exclude_modules": ["lm_head", "model.layers.1*"])" + extra +
         "}}";
}

const std::string kConfig = R"({"model_type": "llama", "dtype": "float16"})";

// The message of reading `g`; "" when it reads. `want` is the category expected.
std::string refusal(Graph g, const std::string& side, const std::string& config = kConfig,
                    ErrorCategory want = ErrorCategory::InvalidInput) {
  try {
    read_modelopt(config, "m/config.json", side, "m/hf_quant_config.json", g);
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), want) << e.what();
    return e.what();
  }
  return "";
}

}  // namespace

TEST(ModeloptReader, ReadsTheIntegersAndScalesPackedTwoRowsPerByte) {
  Graph g = raw();
  const QuantizedCheckpoint q =
      read_modelopt(kConfig, "m/config.json", hf_quant(), "m/hf_quant_config.json", g);
  EXPECT_EQ(q.quant_method, "modelopt");
  EXPECT_EQ(q.format, "W4A16_AWQ");
  ASSERT_EQ(q.schemes.size(), 1u);
  EXPECT_EQ(q.schemes[0].bits, 4);
  EXPECT_EQ(q.schemes[0].group_size, 32);
  EXPECT_EQ(q.quantized_linears, 1);
  EXPECT_EQ(q.ignore, (std::vector<std::string>{"lm_head", "model.layers.1*"}));
  const QuantRecord* r = g.find_quant_record(kModule + ".weight");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->block_size, 32);
  EXPECT_TRUE(g.find_initializer(kModule + ".weight")->equals(int4_values(4, 64)));
  // k / 128 multiples are exact in fp16: the scale becomes the model's dtype.
  const Tensor& s = *g.find_initializer(kModule + ".weight_scale");
  EXPECT_EQ(s.dtype(), DType::F16);
  EXPECT_EQ(s.to_f32(), scales({4, 2}).to_f32());
  g.check_quant_records();
}

TEST(ModeloptReader, GroupSizeFromTheScalesWhenTheConfigHasNone) {
  // ModelOpt's own config.json: quant_method modelopt, quant_algo, ignore; no group_size.
  const std::string config = R"({"dtype": "float32", "quantization_config": {"ignore":
      ["lm_head"], "quant_algo": "W4A16_AWQ", "quant_method": "modelopt"}})";
  Graph g = raw(4, 64, 16);
  const QuantizedCheckpoint q = read_modelopt(config, "m/config.json", "", "", g);
  EXPECT_EQ(q.schemes[0].group_size, 16);
  EXPECT_EQ(g.find_quant_record(kModule + ".weight")->block_size, 16);
}

TEST(ModeloptReader, PreQuantScaleOfOnesOrPowersOfTwoPerGroupFolds) {
  Graph g = raw();
  std::vector<float> s(64, 1.0f);
  g.set_initializer(kModule + ".pre_quant_scale", Tensor::from_f32(s, {64}, DType::F16));
  read_modelopt(kConfig, "m/config.json", hf_quant(), "m/hf_quant_config.json", g);
  EXPECT_FALSE(g.has_initializer(kModule + ".pre_quant_scale"));
  EXPECT_EQ(g.find_initializer(kModule + ".weight_scale")->to_f32(), scales({4, 2}).to_f32());

  Graph h = raw();
  for (size_t i = 0; i < 64; ++i) s[i] = i < 32 ? 2.0f : 0.25f;
  h.set_initializer(kModule + ".pre_quant_scale", Tensor::from_f32(s, {64}, DType::F16));
  read_modelopt(kConfig, "m/config.json", hf_quant(), "m/hf_quant_config.json", h);
  const std::vector<float> base = scales({4, 2}).to_f32();
  const std::vector<float> got = h.find_initializer(kModule + ".weight_scale")->to_f32();
  for (size_t i = 0; i < base.size(); ++i) EXPECT_EQ(got[i], base[i] * (i % 2 == 0 ? 2.0f : 0.25f));
}

TEST(ModeloptReader, PreQuantScaleThatVariesWithinAGroupIsRefusedByName) {
  Graph g = raw();
  std::vector<float> s(64, 1.0f);
  s[5] = 1.5f;
  g.set_initializer(kModule + ".pre_quant_scale", Tensor::from_f32(s, {64}, DType::F16));
  const std::string m = refusal(g, hf_quant(), kConfig, ErrorCategory::Unsupported);
  EXPECT_NE(m.find("'" + kModule + ".pre_quant_scale'"), std::string::npos) << m;
  EXPECT_NE(m.find("[5]"), std::string::npos) << m;
}

TEST(ModeloptReader, PreQuantScaleWhoseProductRoundsIsRefused) {
  Graph g = raw();
  g.set_initializer(kModule + ".weight_scale",
                    Tensor::from_f32(std::vector<float>(8, 0.1f), {4, 2}, DType::F32));
  g.set_initializer(kModule + ".pre_quant_scale",
                    Tensor::from_f32(std::vector<float>(64, 3.0f), {64}, DType::F32));
  const std::string m = refusal(g, hf_quant(), kConfig, ErrorCategory::Unsupported);
  EXPECT_NE(m.find("not exact"), std::string::npos) << m;
}

TEST(ModeloptReader, ConfigThatDisagreesWithTheTensorsIsRefusedNamingTheTensor) {
  // Group size 16 in the config, scales of group 32.
  Graph g = raw();
  std::string side = hf_quant();
  side.replace(side.find("\"group_size\": 32"), 16, "\"group_size\": 16");
  EXPECT_NE(refusal(g, side).find(kModule + ".weight_scale'"), std::string::npos);
  // W8A16 on int4 bytes.
  EXPECT_NE(refusal(raw(), hf_quant("W8A16")).find(kModule + ".weight'"), std::string::npos);
  // A packed weight with no scale.
  Graph h = raw();
  h.remove_initializer(kModule + ".weight_scale");
  EXPECT_NE(refusal(h, hf_quant()).find(kModule + ".weight'"), std::string::npos);
  // An excluded module that is packed (ModelOpt's prefix wildcard).
  std::string ex = hf_quant();
  ex.replace(ex.find("model.layers.1*"), 15, "model.layers.0.self_attn*");
  EXPECT_NE(refusal(raw(), ex).find("model.layers.0.self_attn*"), std::string::npos);
  // hf_quant_config.json and config.json disagree.
  const std::string config = R"({"quantization_config": {"quant_method": "modelopt",
      "quant_algo": "W8A16"}})";
  EXPECT_NE(refusal(raw(), hf_quant(), config).find("disagree"), std::string::npos);
}

TEST(ModeloptReader, AlgorithmsAndActivationScalesQforgeDoesNotReadAreUnsupported) {
  EXPECT_NE(refusal(raw(), hf_quant("FP8"), kConfig, ErrorCategory::Unsupported).find("FP8"),
            std::string::npos);
  Graph g = raw();
  g.set_initializer(kModule + ".input_scale", Tensor(DType::F32, {1}));
  EXPECT_NE(refusal(g, hf_quant(), kConfig, ErrorCategory::Unsupported).find("input_scale"),
            std::string::npos);
  EXPECT_NE(refusal(raw(), hf_quant("W4A16_AWQ", R"(, "kv_cache_quant_algo": "FP8")"), kConfig,
                    ErrorCategory::Unsupported)
                .find("kv_cache"),
            std::string::npos);
}

TEST(ModeloptReader, W8A16ReadsInt8PerChannel) {
  Graph g;
  std::vector<int8_t> q;
  for (int i = 0; i < 4 * 8; ++i) q.push_back(static_cast<int8_t>(i * 7 - 100));
  g.set_initializer(kModule + ".weight", linear_values_tensor(q, 8, 4, 8));
  g.set_initializer(kModule + ".weight_scale", scales({4, 1}));
  const QuantizedCheckpoint c = read_modelopt(kConfig, "m/config.json", hf_quant("W8A16"),
                                              "m/hf_quant_config.json", g);
  EXPECT_EQ(c.schemes[0].bits, 8);
  EXPECT_EQ(c.schemes[0].group_size, 0);
  EXPECT_EQ(g.find_initializer(kModule + ".weight_scale")->shape(), Shape{4});
  EXPECT_TRUE(g.find_initializer(kModule + ".weight")->equals(linear_values_tensor(q, 8, 4, 8)));
}

TEST(ModelPatternMatch, MatchesAsFnmatch) {
  EXPECT_TRUE(module_pattern_match("lm_head", "lm_head"));
  EXPECT_FALSE(module_pattern_match("lm_head", "lm_head2"));
  EXPECT_TRUE(module_pattern_match("model.layers.1*", "model.layers.1.mlp.up_proj"));
  EXPECT_TRUE(module_pattern_match("model.layers.1*", "model.layers.12.mlp"));
  EXPECT_FALSE(module_pattern_match("model.layers.1.*", "model.layers.12.mlp"));
  EXPECT_TRUE(module_pattern_match("*.mlp.gate", "model.layers.3.mlp.gate"));
  EXPECT_TRUE(module_pattern_match("model.layers.[0-2].mlp", "model.layers.1.mlp"));
  EXPECT_FALSE(module_pattern_match("model.layers.[!0-2].mlp", "model.layers.1.mlp"));
  EXPECT_TRUE(module_pattern_match("a?c", "abc"));
  EXPECT_TRUE(module_pattern_match("a[", "a["));
}
