// The records static INT8 attaches: activations, weights and int32 biases, each describing
// the tensors and nodes the pass wrote.
#include <gtest/gtest.h>

#include "tests/unit/quant/quant_record_checks.h"
#include "tests/unit/quant/static/static_fixtures.h"

using namespace qforge;
using namespace qforge::test;
using namespace qforge::test::records;

TEST(StaticInt8Records, ActivationWeightAndInt32BiasOfAConv) {
  Graph g = single_op("Conv", random_weight({4, 3, 3, 3}, 1));
  g.set_initializer("b", random_weight({4}, 2));
  g.nodes[0].inputs.emplace_back("b");
  StaticInt8Options options;
  options.activation_amax = {{"x", 2.5f}};
  options.int32_bias = true;
  run_static(g, options);
  ASSERT_EQ(g.quant_records().size(), 3u);

  const QuantRecord& act = g.quant_records()[0];
  EXPECT_EQ(act.kind, QuantKind::Activation);
  EXPECT_EQ(act.source, "x");
  EXPECT_EQ(act.dtype, DType::I8);
  EXPECT_FALSE(act.axis);
  const Node* q = node_producing(g, act.name);
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->op_type, "QuantizeLinear");
  EXPECT_EQ(q->inputs, (std::vector<std::string>{"x", act.scale, act.zero_point}));
  expect_dequantize_record(g, act, Shape{});
  expect_feeds(g, act, "Conv_0", 0);

  const QuantRecord& weight = g.quant_records()[1];
  EXPECT_EQ(weight.kind, QuantKind::Weight);
  EXPECT_EQ(weight.name, "w_quantized");
  EXPECT_EQ(weight.source, "w");
  EXPECT_EQ(weight.dtype, DType::I8);
  EXPECT_EQ(weight.axis, 0);
  EXPECT_EQ(weight.scale, "w_scale");
  EXPECT_EQ(weight.zero_point, "w_zero_point");
  expect_dequantize_record(g, weight, Shape{4});
  expect_feeds(g, weight, "Conv_0", 1);

  const QuantRecord& bias = g.quant_records()[2];
  EXPECT_EQ(bias.kind, QuantKind::Weight);
  EXPECT_EQ(bias.name, "b_quantized");
  EXPECT_EQ(bias.source, "b");
  EXPECT_EQ(bias.dtype, DType::I32);
  EXPECT_EQ(bias.bits, 32);
  EXPECT_EQ(bias.axis, 0);
  expect_dequantize_record(g, bias, Shape{4});
  expect_feeds(g, bias, "Conv_0", 2);
}

TEST(StaticInt8Records, SharedActivationHasOneRecordAndOverriddenWeightIsPerTensor) {
  // y = x @ w1, z = x @ w2: x quantized once for both readers; w2 clipped by an override.
  Graph g = single_op("MatMul", random_weight({4, 3}, 3));
  g.set_initializer("w2", random_weight({4, 5}, 4));
  g.nodes.push_back(make_node("MatMul_1", "MatMul", {"x", "w2"}, {"z"}));
  g.outputs.push_back({.name = "z"});
  StaticInt8Options options;
  options.activation_amax = {{"x", 1.0f}};
  options.overrides["w2"] = TensorOverride{.amax = 0.5f};
  run_static(g, options);
  ASSERT_EQ(g.quant_records().size(), 3u);
  const QuantRecord& act = g.quant_records()[0];
  EXPECT_EQ(act.kind, QuantKind::Activation);
  expect_feeds(g, act, "MatMul_0", 0);
  expect_feeds(g, act, "MatMul_1", 0);
  EXPECT_EQ(g.quant_records()[1].axis, 1);
  expect_dequantize_record(g, g.quant_records()[1], Shape{3});
  const QuantRecord& clipped = g.quant_records()[2];
  EXPECT_EQ(clipped.source, "w2");
  EXPECT_FALSE(clipped.axis);
  expect_dequantize_record(g, clipped, Shape{});
  expect_feeds(g, clipped, "MatMul_1", 1);
}
