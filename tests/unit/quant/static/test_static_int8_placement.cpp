// Where static INT8 puts Q/DQ for each op type, and that one pair serves every reader.
#include <gtest/gtest.h>

#include "tests/unit/quant/static/static_fixtures.h"

using namespace qforge;
using namespace qforge::test;

TEST(StaticInt8, ConvGetsActivationQdqAndPerChannelWeight) {
  const Tensor w = random_weight({4, 3, 3, 3}, 1);
  Graph g = single_op("Conv", w);
  g.set_initializer("b", random_weight({4}, 2));
  g.nodes[0].inputs.emplace_back("b");
  const PassReport r = run_static(g, {{"x", 2.5f}});
  expect_activation_qdq(g, "Conv_0", 0, "x", 2.5f);
  expect_quantized(g, "Conv_0", 1, w.to_f32(), w.shape(), 0);
  EXPECT_EQ(find_node(g, "Conv_0")->inputs[2], "b") << "bias stays float by default";
  EXPECT_FALSE(g.has_initializer("w")) << "float weight no longer read";
  EXPECT_EQ(count_ops(g, "QuantizeLinear"), 1u) << "no QuantizeLinear on the constant weight";
  EXPECT_EQ(g.opset(""), 13) << "raised from 11 for DequantizeLinear's axis";
  EXPECT_EQ(g.outputs[0].name, "y");
  EXPECT_EQ(r.stats["nodes_quantized"], 1);
  EXPECT_EQ(r.stats["activations"], 1);
  EXPECT_EQ(r.stats["weights"], 1);
  EXPECT_EQ(r.stats["tensors"][0]["axis"], 0);
}

TEST(StaticInt8, WeightAxisPerOpType) {
  struct Case {
    std::string op;
    Shape shape;
    std::vector<Attribute> attrs;
    int64_t axis;
  };
  const std::vector<Case> cases = {
      {"ConvTranspose", {3, 5, 2, 2}, {}, 1},
      {"Gemm", {6, 4}, {Attribute::make_int("transB", 1)}, 0},
      {"Gemm", {4, 6}, {Attribute::make_int("transB", 0)}, 1},
      {"Gemm", {4, 6}, {}, 1},
      {"MatMul", {4, 6}, {}, 1},
      {"MatMul", {2, 4, 6}, {}, 2},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.op + " " + shape_to_string(c.shape));
    const Tensor w = random_weight(c.shape, 3);
    Graph g = single_op(c.op, w, c.attrs);
    run_static(g, {{"x", 1.0f}});
    expect_activation_qdq(g, c.op + "_0", 0, "x", 1.0f);
    expect_quantized(g, c.op + "_0", 1, w.to_f32(), c.shape, c.axis);
  }
}

TEST(StaticInt8, ActivationTimesActivationMatMulQuantizesBothInputs) {
  for (const std::string op : {"MatMul", "Gemm"}) {
    SCOPED_TRACE(op);
    Graph g;
    g.set_opset("", 17);
    g.inputs = {{.name = "a", .dtype = DType::F32}, {.name = "b", .dtype = DType::F32}};
    g.nodes.push_back(make_node("mm", op, {"a", "b"}, {"y"}));
    g.outputs.push_back({.name = "y"});
    run_static(g, {{"a", 3.0f}, {"b", 0.5f}});
    expect_activation_qdq(g, "mm", 0, "a", 3.0f);
    expect_activation_qdq(g, "mm", 1, "b", 0.5f);
    EXPECT_EQ(count_ops(g, "QuantizeLinear"), 2u);
    EXPECT_EQ(g.opset(""), 17) << "never lowered";
  }
}

TEST(StaticInt8, ResidualAddQuantizesBothInputsButBiasAddStaysFloat) {
  Graph g;
  g.set_opset("", 13);
  g.inputs = {{.name = "a"}, {.name = "b"}};
  g.set_initializer("bias", random_weight({4}, 5));
  g.nodes.push_back(make_node("residual", "Add", {"a", "b"}, {"s"}));
  g.nodes.push_back(make_node("bias_add", "Add", {"s", "bias"}, {"y"}));
  g.outputs.push_back({.name = "y"});
  const PassReport r = run_static(g, {{"a", 1.0f}, {"b", 2.0f}, {"s", 3.0f}});
  expect_activation_qdq(g, "residual", 0, "a", 1.0f);
  expect_activation_qdq(g, "residual", 1, "b", 2.0f);
  EXPECT_EQ(find_node(g, "bias_add")->inputs, (std::vector<std::string>{"s", "bias"}));
  EXPECT_EQ(r.stats["add_with_constant"], 1);
  EXPECT_EQ(count_ops(g, "QuantizeLinear"), 2u);
}

TEST(StaticInt8, PoolingInputsAndOtherOpsUntouched) {
  for (const std::string op : {"MaxPool", "AveragePool", "GlobalAveragePool"}) {
    SCOPED_TRACE(op);
    Graph g;
    g.set_opset("", 13);
    g.inputs = {{.name = "x"}};
    g.nodes.push_back(make_node("relu", "Relu", {"x"}, {"r"}));
    g.nodes.push_back(make_node("pool", op, {"r"}, {"y"}));
    g.outputs.push_back({.name = "y"});
    run_static(g, {{"x", 1.0f}, {"r", 4.0f}, {"y", 4.0f}});
    EXPECT_EQ(find_node(g, "relu")->inputs[0], "x") << "Relu is not quantized";
    expect_activation_qdq(g, "pool", 0, "r", 4.0f);
    EXPECT_EQ(g.nodes.back().outputs[0], "y") << "graph output still produced by the pool";
  }
}

TEST(StaticInt8, OneSharedQdqPerTensorWhateverTheReaders) {
  const Tensor w1 = random_weight({2, 3, 1, 1}, 6);
  const Tensor w2 = random_weight({5, 3, 1, 1}, 7);
  Graph g;
  g.set_opset("", 13);
  g.inputs = {{.name = "x"}};
  g.set_initializer("w1", w1);
  g.set_initializer("w2", w2);
  g.nodes.push_back(make_node("relu", "Relu", {"x"}, {"r"}));
  g.nodes.push_back(make_node("c1", "Conv", {"r", "w1"}, {"y1"}));
  g.nodes.push_back(make_node("c2", "Conv", {"r", "w2"}, {"y2"}));
  g.nodes.push_back(make_node("sig", "Sigmoid", {"r"}, {"y3"}));
  g.outputs = {{.name = "y1"}, {.name = "y2"}, {.name = "y3"}, {.name = "r"}};
  const PassReport r = run_static(g, {{"x", 1.0f}, {"r", 1.5f}});
  expect_activation_qdq(g, "c1", 0, "r", 1.5f);
  expect_activation_qdq(g, "c2", 0, "r", 1.5f);
  EXPECT_EQ(find_node(g, "c1")->inputs[0], find_node(g, "c2")->inputs[0]);
  EXPECT_EQ(count_ops(g, "QuantizeLinear"), 1u);
  EXPECT_EQ(find_node(g, "sig")->inputs[0], "r") << "a reader that is not quantized keeps float";
  EXPECT_EQ(r.stats["activations"], 1);
  EXPECT_EQ(r.stats["activation_ranges"][0]["name"], "r");
}

TEST(StaticInt8, SharedWeightQuantizedOnce) {
  const Tensor w = random_weight({4, 4}, 8);
  Graph g;
  g.set_opset("", 13);
  g.inputs = {{.name = "a"}, {.name = "b"}};
  g.set_initializer("w", w);
  g.nodes.push_back(make_node("m1", "MatMul", {"a", "w"}, {"y1"}));
  g.nodes.push_back(make_node("m2", "MatMul", {"b", "w"}, {"y2"}));
  g.outputs = {{.name = "y1"}, {.name = "y2"}};
  const PassReport r = run_static(g, {{"a", 1.0f}, {"b", 1.0f}});
  EXPECT_EQ(find_node(g, "m1")->inputs[1], find_node(g, "m2")->inputs[1]);
  EXPECT_EQ(r.stats["weights"], 1);
  EXPECT_EQ(count_ops(g, "DequantizeLinear"), 3u);  // a, b, w
}
