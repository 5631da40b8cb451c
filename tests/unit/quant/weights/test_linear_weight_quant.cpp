#include "quant/weights/linear_weight_quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "ir/error.h"
#include "ir/half.h"

namespace qforge {
namespace {

std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 0.05f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

int8_t nibble_at(const Tensor& q, int64_t i) {
  const auto b = q.data<uint8_t>()[static_cast<size_t>(i / 2)];
  const int v = (b >> (4 * (i % 2))) & 0x0f;
  return static_cast<int8_t>(v >= 8 ? v - 16 : v);
}

// A plain reference: per block of `bs` values along a row, s = fp16(amax / 7) rounded to the
// weight's dtype, q = clamp(round_half_even(w / s), -8, 7).
TEST(LinearWeightQuant, Int4AmaxMatchesPlainReferenceForEveryDtype) {
  const int64_t n = 6, k = 64, bs = 32;
  const auto w = random_values(n * k, 1);
  for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
    Graph g;
    g.set_initializer("model.layers.0.mlp.down_proj.weight", Tensor::from_f32(w, {n, k}, dtype));
    const std::vector<float> wd =
        g.find_initializer("model.layers.0.mlp.down_proj.weight")->to_f32();
    LinearWeightQuantOptions o;
    o.block_size = bs;
    o.int4_scale = Int4Scale::Amax;
    quantize_linear_weight(g, "model.layers.0.mlp.down_proj.weight", o);
    const Tensor& q = *g.find_initializer("model.layers.0.mlp.down_proj.weight");
    const Tensor& s = *g.find_initializer("model.layers.0.mlp.down_proj.weight_scale");
    ASSERT_EQ(q.dtype(), DType::I4);
    ASSERT_EQ(s.dtype(), dtype);
    ASSERT_EQ(s.shape(), (Shape{n, k / bs}));
    const std::vector<float> sv = s.to_f32();
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t b = 0; b < k / bs; ++b) {
        float amax = 0;
        for (int64_t c = b * bs; c < (b + 1) * bs; ++c) {
          amax = std::max(amax, std::abs(wd[r * k + c]));
        }
        float want = f16_to_f32(f32_to_f16(amax / 7.0f));
        if (dtype == DType::BF16) want = bf16_to_f32(f32_to_bf16(want));
        ASSERT_EQ(sv[static_cast<size_t>(r * (k / bs) + b)], want) << dtype_name(dtype);
        for (int64_t c = b * bs; c < (b + 1) * bs; ++c) {
          const float x = std::nearbyint(wd[r * k + c] / want);
          const auto ref = static_cast<int8_t>(std::clamp(x, -8.0f, 7.0f));
          ASSERT_EQ(nibble_at(q, r * k + c), ref) << dtype_name(dtype) << " " << r << "," << c;
        }
      }
    }
    const QuantRecord* rec = g.find_quant_record("model.layers.0.mlp.down_proj.weight");
    ASSERT_NE(rec, nullptr);
    EXPECT_EQ(rec->block_size, bs);
    EXPECT_TRUE(rec->reader.empty());
  }
}

TEST(LinearWeightQuant, Int4MseErrorIsNoWorseThanAmax) {
  const auto w = random_values(8 * 128, 2);
  double err[2];
  int i = 0;
  for (Int4Scale rule : {Int4Scale::Amax, Int4Scale::Mse}) {
    Graph g;
    g.set_initializer("model.layers.3.self_attn.q_proj.weight", Tensor::from_f32(w, {8, 128}));
    LinearWeightQuantOptions o;
    o.block_size = 32;
    o.int4_scale = rule;
    const double sqnr =
        quantize_linear_weight(g, "model.layers.3.self_attn.q_proj.weight", o).sqnr_db;
    err[i++] = std::pow(10.0, -sqnr / 10);
  }
  EXPECT_LE(err[1], err[0]);
}

TEST(LinearWeightQuant, Int8PerRowScaleIsAmaxOver127) {
  const int64_t n = 4, k = 48;
  const auto w = random_values(n * k, 3);
  for (DType dtype : {DType::F32, DType::BF16}) {
    Graph g;
    g.set_initializer("model.layers.0.mlp.up_proj.weight", Tensor::from_f32(w, {n, k}, dtype));
    const std::vector<float> wd =
        g.find_initializer("model.layers.0.mlp.up_proj.weight")->to_f32();
    LinearWeightQuantOptions o;
    o.bits = 8;
    quantize_linear_weight(g, "model.layers.0.mlp.up_proj.weight", o);
    const Tensor& q = *g.find_initializer("model.layers.0.mlp.up_proj.weight");
    const std::vector<float> s =
        g.find_initializer("model.layers.0.mlp.up_proj.weight_scale")->to_f32();
    ASSERT_EQ(q.dtype(), DType::I8);
    ASSERT_EQ(s.size(), static_cast<size_t>(n));
    for (int64_t r = 0; r < n; ++r) {
      float amax = 0;
      for (int64_t c = 0; c < k; ++c) amax = std::max(amax, std::abs(wd[r * k + c]));
      const float want =
          dtype == DType::BF16 ? bf16_to_f32(f32_to_bf16(amax / 127.0f)) : amax / 127.0f;
      ASSERT_EQ(s[r], want);
      for (int64_t c = 0; c < k; ++c) {
        const float x = std::clamp(std::nearbyint(wd[r * k + c] / want), -127.0f, 127.0f);
        ASSERT_EQ(q.data<int8_t>()[r * k + c], static_cast<int8_t>(x));
      }
    }
  }
}

TEST(LinearWeightQuant, PlanQuantizesDecoderProjectionsAndKeepsTheRestFloat) {
  Graph g;
  for (const char* name :
       {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.q_proj.bias", "model.layers.0.self_attn.qkv_proj.weight",
        "model.layers.0.mlp.gate_up_proj.weight", "model.layers.0.input_layernorm.weight",
        "model.layers.10.mlp.down_proj.weight", "lm_head.weight", "model.norm.weight"}) {
    const bool matrix = std::string(name).ends_with("proj.weight") ||
                        std::string(name).find("embed") != std::string::npos ||
                        std::string(name).starts_with("lm_head");
    g.set_initializer(name, matrix ? Tensor(DType::BF16, {8, 64}) : Tensor(DType::BF16, {64}));
  }
  LinearWeightQuantOptions o;
  o.block_size = 32;
  const LinearWeightPlan plan = plan_linear_weight_quant(g, o);
  EXPECT_EQ(plan.quantize, (std::vector<std::string>{
                               "model.layers.0.self_attn.q_proj.weight",
                               "model.layers.0.self_attn.qkv_proj.weight",
                               "model.layers.0.mlp.gate_up_proj.weight",
                               "model.layers.10.mlp.down_proj.weight"}));
  ASSERT_EQ(plan.kept.size(), 1u);
  EXPECT_EQ(plan.kept[0].name, "lm_head.weight");
}

TEST(LinearWeightQuant, BlockSizeThatDoesNotDivideInputFeaturesIsAUsageErrorNamingAFit) {
  Graph g;
  g.set_initializer("model.layers.0.mlp.down_proj.weight", Tensor(DType::F32, {8, 96}));
  LinearWeightQuantOptions o;
  o.block_size = 64;
  try {
    plan_linear_weight_quant(g, o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::Usage);
    EXPECT_NE(std::string(e.what()).find("model.layers.0.mlp.down_proj.weight"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("--block-size 32"), std::string::npos) << e.what();
  }
}

TEST(LinearWeightQuant, NanIsRefusedNamingTheWeight) {
  std::vector<float> w(64, 0.5f);
  w[7] = std::nanf("");
  Graph g;
  g.set_initializer("model.layers.0.mlp.up_proj.weight", Tensor::from_f32(w, {2, 32}));
  LinearWeightQuantOptions o;
  o.block_size = 32;
  EXPECT_THROW(quantize_linear_weight(g, "model.layers.0.mlp.up_proj.weight", o), Error);
}

TEST(LinearWeightQuant, PassQuantizesThePlanAndReportsTheFloatLinears) {
  Graph g;
  g.set_initializer("model.layers.0.mlp.up_proj.weight",
                    Tensor::from_f32(random_values(8 * 64, 4), {8, 64}));
  g.set_initializer("lm_head.weight", Tensor::from_f32(random_values(8 * 64, 5), {8, 64}));
  LinearWeightQuantOptions o;
  o.block_size = 64;
  PassReport report;
  make_linear_weight_quant_pass(o)->run(g, report);
  EXPECT_EQ(report.stats["quantized"], 1);
  EXPECT_EQ(report.stats["float_linears"], nlohmann::ordered_json::array({"lm_head.weight"}));
  EXPECT_EQ(g.find_initializer("model.layers.0.mlp.up_proj.weight")->dtype(), DType::I4);
  EXPECT_EQ(g.find_initializer("lm_head.weight")->dtype(), DType::F32);
  EXPECT_NO_THROW(g.check_quant_records());
}

}  // namespace
}  // namespace qforge
