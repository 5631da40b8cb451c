// DoRA, several weighted adapters, f16/bf16 rounding, lora_bias and modules_to_save.
#include <gtest/gtest.h>

#include "ir/half.h"
#include "quant/lora/lora_merge.h"
#include "tests/unit/quant/lora/lora_test_util.h"

using namespace qforge;
using namespace qforge::lora_test;

namespace {

constexpr float kTol = 1e-6f;

Graph linear_adapter_weights(const std::string& m, int64_t out, int64_t in, int64_t r,
                             uint32_t seed, bool dora = false) {
  Graph w;
  w.set_initializer("base_model.model." + m + ".lora_A.weight", random_tensor({r, in}, seed));
  w.set_initializer("base_model.model." + m + ".lora_B.weight", random_tensor({out, r}, seed + 1));
  if (dora) {
    w.set_initializer("base_model.model." + m + ".lora_magnitude_vector",
                      random_tensor({out}, seed + 2, DType::F32, 0.5f, 2.0f));
  }
  return w;
}

}  // namespace

TEST(LoraMerge, DoraLinearScalesRowsByMagnitudeOverNorm) {
  Graph base;
  base.set_initializer("q.weight", random_tensor({5, 7}, 1));
  const Graph w = linear_adapter_weights("q", 5, 7, 3, 10, true);
  const auto w0 = base.find_initializer("q.weight")->to_f32();
  PassReport report;
  merge_lora(base, {{peft_adapter(config_json(3, 6, "\"use_dora\": true"), w), 1.0}}, {}, report);
  const auto d = ref_delta(random_tensor({3, 7}, 10).to_f32(), random_tensor({5, 3}, 11).to_f32(),
                           5, 7, 3, 2.0f);
  const auto mag = random_tensor({5}, 12, DType::F32, 0.5f, 2.0f).to_f32();
  expect_near_all(base.find_initializer("q.weight")->to_f32(), ref_dora(w0, w0, d, mag, 5, 7), kTol,
                  "dora linear");
  EXPECT_EQ(report.stats["dora_modules"], 1);
}

TEST(LoraMerge, DoraFanInFanOutNormsPerOutputFeature) {
  Graph base;
  base.set_initializer("c.weight", random_tensor({7, 5}, 2));  // [in, out]
  const Graph w = linear_adapter_weights("c", 5, 7, 2, 20, true);
  const auto stored = base.find_initializer("c.weight")->to_f32();
  PassReport report;
  merge_lora(
      base,
      {{peft_adapter(config_json(2, 2, "\"use_dora\": true, \"fan_in_fan_out\": true"), w), 1.0}},
      {}, report);
  const auto w0 = ref_transpose(stored, 7, 5);  // canonical [out, in]
  const auto d = ref_delta(random_tensor({2, 7}, 20).to_f32(), random_tensor({5, 2}, 21).to_f32(),
                           5, 7, 2, 1.0f);
  const auto mag = random_tensor({5}, 22, DType::F32, 0.5f, 2.0f).to_f32();
  const auto want = ref_transpose(ref_dora(w0, w0, d, mag, 5, 7), 5, 7);
  expect_near_all(base.find_initializer("c.weight")->to_f32(), want, kTol, "dora fan_in_fan_out");
}

TEST(LoraMerge, DoraEmbeddingNormsPerEmbeddingDim) {
  Graph base;
  base.set_initializer("emb.weight", random_tensor({9, 4}, 3));
  Graph w;
  w.set_initializer("emb.lora_embedding_A", random_tensor({2, 9}, 30));
  w.set_initializer("emb.lora_embedding_B", random_tensor({4, 2}, 31));
  w.set_initializer("emb.lora_magnitude_vector.weight",
                    random_tensor({4}, 32, DType::F32, 0.5f, 2.0f));
  const auto stored = base.find_initializer("emb.weight")->to_f32();
  PassReport report;
  merge_lora(base, {{peft_adapter(config_json(2, 2, "\"use_dora\": true"), w), 1.0}}, {}, report);
  const auto w0 = ref_transpose(stored, 9, 4);  // [dim, num]
  const auto d = ref_delta(random_tensor({2, 9}, 30).to_f32(), random_tensor({4, 2}, 31).to_f32(),
                           4, 9, 2, 1.0f);
  const auto mag = random_tensor({4}, 32, DType::F32, 0.5f, 2.0f).to_f32();
  const auto want = ref_transpose(ref_dora(w0, w0, d, mag, 4, 9), 4, 9);
  expect_near_all(base.find_initializer("emb.weight")->to_f32(), want, kTol, "dora embedding");
}

TEST(LoraMerge, DoraConvNormsPerOutputChannel) {
  Graph base;
  base.set_initializer("conv.weight", random_tensor({4, 3, 3, 3}, 4));
  Graph w;
  w.set_initializer("conv.lora_A.weight", random_tensor({2, 3, 3, 3}, 40));
  w.set_initializer("conv.lora_B.weight", random_tensor({4, 2, 1, 1}, 41));
  w.set_initializer("conv.lora_magnitude_vector",
                    random_tensor({1, 4, 1, 1}, 42, DType::F32, 0.5f, 2.0f));
  const auto w0 = base.find_initializer("conv.weight")->to_f32();
  PassReport report;
  merge_lora(base, {{peft_adapter(config_json(2, 4, "\"use_dora\": true"), w), 1.0}}, {}, report);
  const auto d = ref_delta(random_tensor({2, 3, 3, 3}, 40).to_f32(),
                           random_tensor({4, 2, 1, 1}, 41).to_f32(), 4, 27, 2, 2.0f);
  const auto mag = random_tensor({1, 4, 1, 1}, 42, DType::F32, 0.5f, 2.0f).to_f32();
  expect_near_all(base.find_initializer("conv.weight")->to_f32(), ref_dora(w0, w0, d, mag, 4, 27),
                  kTol, "dora conv");
}

TEST(LoraMerge, WeightedAdaptersAddInOrder) {
  Graph base;
  base.set_initializer("q.weight", random_tensor({6, 6}, 5));
  const auto w0 = base.find_initializer("q.weight")->to_f32();
  const LoraAdapter a =
      peft_adapter(config_json(2, 4), linear_adapter_weights("q", 6, 6, 2, 50), "A");
  const LoraAdapter b =
      peft_adapter(config_json(3, 3), linear_adapter_weights("q", 6, 6, 3, 60), "B");
  PassReport report;
  merge_lora(base, {{a, 0.7}, {b, 0.3}}, {}, report);
  const auto da = ref_delta(random_tensor({2, 6}, 50).to_f32(), random_tensor({6, 2}, 51).to_f32(),
                            6, 6, 2, static_cast<float>(2.0 * 0.7));
  const auto db = ref_delta(random_tensor({3, 6}, 60).to_f32(), random_tensor({6, 3}, 61).to_f32(),
                            6, 6, 3, static_cast<float>(1.0 * 0.3));
  std::vector<float> want(w0.size());
  for (size_t i = 0; i < want.size(); ++i) want[i] = (w0[i] + da[i]) + db[i];
  expect_near_all(base.find_initializer("q.weight")->to_f32(), want, kTol, "A:0.7 + B:0.3");
  ASSERT_EQ(report.stats["modules"].size(), 2u);
  EXPECT_EQ(report.stats["modules"][1]["adapter"], "B");
  EXPECT_DOUBLE_EQ(report.stats["modules"][1]["weight"].get<double>(), 0.3);
}

TEST(LoraMerge, SecondDoraAdapterTakesItsNormFromTheUnmergedBase) {
  Graph base;
  base.set_initializer("q.weight", random_tensor({4, 5}, 6));
  const auto w0 = base.find_initializer("q.weight")->to_f32();
  const LoraAdapter a = peft_adapter(config_json(2, 2, "\"use_dora\": true"),
                                     linear_adapter_weights("q", 4, 5, 2, 70, true), "A");
  const LoraAdapter b = peft_adapter(config_json(2, 2, "\"use_dora\": true"),
                                     linear_adapter_weights("q", 4, 5, 2, 80, true), "B");
  PassReport report;
  merge_lora(base, {{a, 1.0}, {b, 1.0}}, {}, report);
  const auto da = ref_delta(random_tensor({2, 5}, 70).to_f32(), random_tensor({4, 2}, 71).to_f32(),
                            4, 5, 2, 1.0f);
  const auto db = ref_delta(random_tensor({2, 5}, 80).to_f32(), random_tensor({4, 2}, 81).to_f32(),
                            4, 5, 2, 1.0f);
  const auto ma = random_tensor({4}, 72, DType::F32, 0.5f, 2.0f).to_f32();
  const auto mb = random_tensor({4}, 82, DType::F32, 0.5f, 2.0f).to_f32();
  const auto after_a = ref_dora(w0, w0, da, ma, 4, 5);
  expect_near_all(base.find_initializer("q.weight")->to_f32(), ref_dora(w0, after_a, db, mb, 4, 5),
                  kTol, "two DoRA");
}

TEST(LoraMerge, HalfPrecisionBaseIsRoundedOnceFromFp32) {
  for (DType dt : {DType::F16, DType::BF16}) {
    Graph base;
    base.set_initializer("q.weight", random_tensor({16, 16}, 7, dt));
    const auto w0 = base.find_initializer("q.weight")->to_f32();  // exact widening
    const LoraAdapter a =
        peft_adapter(config_json(4, 4), linear_adapter_weights("q", 16, 16, 4, 90), "A");
    const LoraAdapter b =
        peft_adapter(config_json(4, 4), linear_adapter_weights("q", 16, 16, 4, 95), "B");
    PassReport report;
    merge_lora(base, {{a, 0.01}, {b, 0.01}}, {}, report);
    const Tensor& got = *base.find_initializer("q.weight");
    ASSERT_EQ(got.dtype(), dt);
    const auto da = ref_delta(random_tensor({4, 16}, 90).to_f32(),
                              random_tensor({16, 4}, 91).to_f32(), 16, 16, 4, 0.01f);
    const auto db = ref_delta(random_tensor({4, 16}, 95).to_f32(),
                              random_tensor({16, 4}, 96).to_f32(), 16, 16, 4, 0.01f);
    const auto bits = got.data<uint16_t>();
    int rounded_twice_would_differ = 0;
    for (size_t i = 0; i < w0.size(); ++i) {
      const float exact = (w0[i] + da[i]) + db[i];
      const uint16_t once = dt == DType::F16 ? f32_to_f16(exact) : f32_to_bf16(exact);
      EXPECT_NEAR(bits[i], once, 1) << "element " << i;  // one ulp: sgemm may sum in another order
      const float mid = dt == DType::F16 ? f16_to_f32(f32_to_f16(w0[i] + da[i]))
                                         : bf16_to_f32(f32_to_bf16(w0[i] + da[i]));
      const uint16_t twice = dt == DType::F16 ? f32_to_f16(mid + db[i]) : f32_to_bf16(mid + db[i]);
      rounded_twice_would_differ += twice != once && bits[i] == once;
    }
    // Small deltas make per-adapter rounding visible: the merge must not round in between.
    EXPECT_GT(rounded_twice_would_differ, 0) << dtype_name(dt);
  }
}

TEST(LoraMerge, LoraBiasAddsScaledBias) {
  Graph base;
  base.set_initializer("fc.weight", random_tensor({3, 4}, 8));
  base.set_initializer("fc.bias", random_tensor({3}, 9));
  Graph w = linear_adapter_weights("fc", 3, 4, 2, 100);
  w.set_initializer("base_model.model.fc.lora_B.bias", random_tensor({3}, 102));
  const auto b0 = base.find_initializer("fc.bias")->to_f32();
  PassReport report;
  merge_lora(base, {{peft_adapter(config_json(2, 6, "\"lora_bias\": true"), w), 0.5}}, {}, report);
  const auto lb = random_tensor({3}, 102).to_f32();
  std::vector<float> want(3);
  for (int i = 0; i < 3; ++i) want[i] = b0[i] + lb[i] * 1.5f;  // scaling 3 * weight 0.5
  expect_near_all(base.find_initializer("fc.bias")->to_f32(), want, kTol, "lora_bias");
  EXPECT_EQ(report.stats["modules"][0]["bias"], "fc.bias");
}

TEST(LoraMerge, ModulesToSaveReplaceBaseTensorsInBaseDtype) {
  Graph base;
  base.set_initializer("classifier.weight", random_tensor({2, 4}, 11, DType::BF16));
  base.set_initializer("classifier.bias", random_tensor({2}, 12, DType::BF16));
  base.set_initializer("encoder.weight", random_tensor({4, 4}, 13, DType::BF16));
  Graph w = linear_adapter_weights("encoder", 4, 4, 2, 110);
  w.set_initializer("base_model.model.classifier.modules_to_save.default.weight",
                    random_tensor({2, 4}, 14));
  w.set_initializer("base_model.model.classifier.bias", random_tensor({2}, 15));  // PEFT 0.21 form
  PassReport report;
  merge_lora(base,
             {{peft_adapter(config_json(2, 2, "\"modules_to_save\": [\"classifier\"]"), w), 1.0}},
             {}, report);
  const Tensor& cw = *base.find_initializer("classifier.weight");
  EXPECT_EQ(cw.dtype(), DType::BF16);
  EXPECT_TRUE(cw.equals(random_tensor({2, 4}, 14, DType::BF16)));
  EXPECT_TRUE(
      base.find_initializer("classifier.bias")->equals(random_tensor({2}, 15, DType::BF16)));
  EXPECT_EQ(report.stats["tensors_replaced"], 2);
}
