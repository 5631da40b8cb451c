#include "ir/quantized_linear.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace qforge
