#include "ir/quantized_linear.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "ir/error.h"

namespace qforge {
namespace {

TEST(QuantizedLinear, StoresValuesScaleAndRecordInAWeightsOnlyGraph) {
  Graph g;
  g.set_initializer("layer.q_proj.weight", Tensor(DType::F32, {4, 64}));
  store_quantized_linear(g, "layer.q_proj.weight", Tensor(DType::I4, {4, 64}),
                         Tensor(DType::F16, {4, 2}), 32);
  EXPECT_EQ(g.find_initializer("layer.q_proj.weight")->dtype(), DType::I4);
  ASSERT_NE(g.find_initializer("layer.q_proj.weight_scale"), nullptr);
  const QuantRecord* r = g.find_quant_record("layer.q_proj.weight");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->bits, 4);
  EXPECT_EQ(r->axis, 1);
  EXPECT_EQ(r->block_size, 32);
  EXPECT_EQ(r->scale, "layer.q_proj.weight_scale");
  EXPECT_TRUE(r->reader.empty());
  EXPECT_NO_THROW(g.check_quant_records());
}

TEST(QuantizedLinear, PerChannelInt8HasAxisZero) {
  Graph g;
  store_quantized_linear(g, "w", Tensor(DType::I8, {3, 5}), Tensor(DType::F32, {3}), 0);
  const QuantRecord* r = g.find_quant_record("w");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->bits, 8);
  EXPECT_EQ(r->axis, 0);
  EXPECT_EQ(r->block_size, 0);
}

TEST(QuantizedLinear, RefusesAScaleThatDoesNotFit) {
  Graph g;
  EXPECT_THROW(store_quantized_linear(g, "w", Tensor(DType::I4, {4, 64}),
                                      Tensor(DType::F16, {4, 3}), 32),
               Error);
  EXPECT_THROW(store_quantized_linear(g, "w", Tensor(DType::F32, {4, 64}),
                                      Tensor(DType::F16, {4, 2}), 32),
               Error);
}

TEST(QuantizedLinear, ARecordWithoutReaderIsRefusedOnceTheGraphHasNodes) {
  Graph g;
  store_quantized_linear(g, "w", Tensor(DType::I8, {3, 5}), Tensor(DType::F32, {3}), 0);
  Node n;
  n.op_type = "Identity";
  n.inputs = {"w"};
  n.outputs = {"y"};
  g.nodes.push_back(n);
  EXPECT_THROW(g.check_quant_records(), Error);
}

TEST(QuantizedLinear, DequantizesToQTimesScaleRoundedToTheScaleDtype) {
  Graph g;
  // i4 [1, 4] in one block of 4: q = -8, -1, 3, 7; bf16 scale 0.3 (stored as bf16's nearest).
  Tensor q(DType::I4, {1, 4});
  q.mutable_data<uint8_t>()[0] = 0xf8;  // -8 low, -1 high
  q.mutable_data<uint8_t>()[1] = 0x73;  // 3 low, 7 high
  const float s = 0.3f;
  store_quantized_linear(g, "w", q, Tensor::from_f32({&s, 1}, {1, 1}, DType::BF16), 4);
  const float scale = g.find_initializer("w_scale")->to_f32()[0];
  const Tensor w = dequantize_quantized_linear(g, *g.find_quant_record("w"));
  EXPECT_EQ(w.dtype(), DType::BF16);
  EXPECT_EQ(w.shape(), (Shape{1, 4}));
  const std::vector<float> v = w.to_f32();
  const int qs[4] = {-8, -1, 3, 7};
  for (int i = 0; i < 4; ++i) {
    const float want =
        Tensor::from_f32(std::vector<float>{static_cast<float>(qs[i]) * scale}, {1}, DType::BF16)
            .to_f32()[0];
    EXPECT_EQ(v[static_cast<size_t>(i)], want) << i;
  }
  // In f32 on request (a GGUF block's products, as llama.cpp keeps them): exact, not rounded.
  const Tensor exact = dequantize_quantized_linear(g, *g.find_quant_record("w"), DType::F32);
  EXPECT_EQ(exact.dtype(), DType::F32);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(exact.to_f32()[static_cast<size_t>(i)], static_cast<float>(qs[i]) * scale) << i;
  }
  EXPECT_NE(exact.to_f32()[3], v[3]);  // 7 * scale needs 10 significant bits, bf16 has 8
  EXPECT_EQ(dequantize_quantized_linears(g), 1);
  EXPECT_FALSE(g.has_initializer("w_scale"));
  EXPECT_EQ(g.find_quant_record("w"), nullptr);
  EXPECT_TRUE(g.find_initializer("w")->equals(w));
}

TEST(QuantizedLinear, DequantizesPerChannelInt8) {
  Graph g;
  Tensor q(DType::I8, {2, 2});
  const int8_t qv[4] = {-128, 127, 1, -2};
  std::copy(qv, qv + 4, q.mutable_data<int8_t>().begin());
  const std::vector<float> s = {0.5f, 2.0f};
  store_quantized_linear(g, "w", q, Tensor::from_f32(s, {2}), 0);
  const Tensor w = dequantize_quantized_linear(g, *g.find_quant_record("w"));
  EXPECT_EQ(w.to_f32(), (std::vector<float>{-64.0f, 63.5f, 2.0f, -4.0f}));
}

}  // namespace
}  // namespace qforge
