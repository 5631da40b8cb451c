// What the pass writes for each op: axis, scales, int8 values, DequantizeLinear wiring.
#include <gtest/gtest.h>

#include <cstring>

#include "tests/unit/quant/weights/weight_int8_fixtures.h"

using namespace qforge;
using namespace qforge::test;

TEST(WeightInt8, ConvPerChannelOnAxis0) {
  const Shape shape{8, 3, 3, 3};
  const Tensor w = random_weight(shape, 1);
  Graph g = single_op("Conv", w);
  g.set_initializer("b", random_weight({8}, 2));
  g.nodes[0].inputs.emplace_back("b");
  const PassReport r = run_pass(g);
  expect_quantized(g, "Conv_0", 1, w.to_f32(), shape, 0);
  EXPECT_FALSE(g.has_initializer("w")) << "float weight no longer read: removed";
  EXPECT_EQ(g.nodes[0].op_type, "DequantizeLinear");
  EXPECT_EQ(g.nodes[0].name, "w_DequantizeLinear");
  EXPECT_EQ(g.nodes[0].inputs,
            (std::vector<std::string>{"w_quantized", "w_scale", "w_zero_point"}));
  EXPECT_EQ(g.nodes[1].inputs[2], "b") << "bias stays float";
  EXPECT_EQ(g.find_initializer("b")->dtype(), DType::F32);
  EXPECT_EQ(r.stats["quantized"], 1);
  const auto& row = r.stats["tensors"][0];
  EXPECT_EQ(row["name"], "w");
  EXPECT_EQ(row["axis"], 0);
  EXPECT_EQ(row["shape"], nlohmann::ordered_json::array({8, 3, 3, 3}));
  EXPECT_EQ(row["bytes_before"], 8 * 27 * 4);
  EXPECT_EQ(row["bytes_after"], 8 * 27 + 8 * 4 + 8);  // int8 values, f32 scales, int8 zero points
  EXPECT_EQ(r.stats["bytes_before"], 864);
  EXPECT_EQ(r.stats["bytes_after"], 256);
  EXPECT_GT(row["sqnr_db"].get<double>(), 30.0);
  EXPECT_GT(row["max_abs_error"].get<double>(), 0.0);
}

TEST(WeightInt8, GemmAxisFollowsTransB) {
  for (int64_t trans_b : {0, 1}) {
    SCOPED_TRACE("transB " + std::to_string(trans_b));
    const Shape shape = trans_b ? Shape{6, 5} : Shape{5, 6};  // B is [N, K] or [K, N]; N = 6
    const Tensor w = random_weight(shape, 3);
    Graph g = single_op("Gemm", w, {Attribute::make_int("transB", trans_b)});
    run_pass(g);
    expect_quantized(g, "Gemm_0", 1, w.to_f32(), shape, trans_b ? 0 : 1);
    EXPECT_EQ(g.find_initializer("w_scale")->shape(), Shape{6}) << "one scale per output column";
  }
}

TEST(WeightInt8, GemmWithoutTransBAttributeUsesAxis1) {
  const Tensor w = random_weight({4, 7}, 4);
  Graph g = single_op("Gemm", w);
  run_pass(g);
  expect_quantized(g, "Gemm_0", 1, w.to_f32(), {4, 7}, 1);
}

TEST(WeightInt8, MatMulUsesLastAxis) {
  for (const Shape& shape : {Shape{16, 4}, Shape{2, 5, 3}}) {
    SCOPED_TRACE(shape_to_string(shape));
    const Tensor w = random_weight(shape, 5);
    Graph g = single_op("MatMul", w);
    run_pass(g);
    expect_quantized(g, "MatMul_0", 1, w.to_f32(), shape, static_cast<int64_t>(shape.size()) - 1);
  }
}

TEST(WeightInt8, ConvTransposeUsesAxis1) {
  const Shape shape{4, 6, 3, 3};  // [Cin, Cout, kh, kw]
  const Tensor w = random_weight(shape, 6);
  Graph g = single_op("ConvTranspose", w);
  run_pass(g);
  expect_quantized(g, "ConvTranspose_0", 1, w.to_f32(), shape, 1);
  EXPECT_EQ(g.find_initializer("w_scale")->shape(), Shape{6});
}

TEST(WeightInt8, PerTensorWritesScalarScaleAndNoAxis) {
  const Shape shape{8, 3, 3, 3};
  const Tensor w = random_weight(shape, 7);
  Graph g = single_op("Conv", w);
  WeightInt8Options options;
  options.per_tensor = true;
  const PassReport r = run_pass(g, options);
  expect_quantized(g, "Conv_0", 1, w.to_f32(), shape, std::nullopt);
  EXPECT_EQ(r.stats["tensors"][0]["axis"], "per-tensor");
  EXPECT_EQ(r.stats["mode"], "per-tensor");
  EXPECT_EQ(r.stats["bytes_after"], 8 * 27 + 4 + 1);
}

TEST(WeightInt8, AllZeroChannelGetsScaleOne) {
  std::vector<float> values = random_values(24, 8);
  std::fill(values.begin() + 6, values.begin() + 12, 0.0f);  // output channel 1 of a Conv [4, 6]
  const Tensor w = Tensor::from_f32(values, {4, 6});
  Graph g = single_op("Conv", w);
  run_pass(g);
  expect_quantized(g, "Conv_0", 1, values, {4, 6}, 0);
  EXPECT_EQ(g.find_initializer("w_scale")->data<float>()[1], 1.0f);
}

TEST(WeightInt8, HalfWeightsGetCastBackAfterDequantize) {
  for (DType dtype : {DType::F16, DType::BF16}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    const Tensor w = random_weight({8, 4}, 9, dtype);
    Graph g = single_op("MatMul", w);
    const PassReport r = run_pass(g);
    // The reference quantizes the f16/bf16 values as stored, widened to f32.
    expect_quantized(g, "MatMul_0", 1, w.to_f32(), {8, 4}, 1, dtype);
    EXPECT_EQ(r.stats["tensors"][0]["dtype"], std::string(dtype_name(dtype)));
    EXPECT_EQ(r.stats["tensors"][0]["bytes_before"], 8 * 4 * 2);
    EXPECT_EQ(g.nodes.size(), 3u);  // DQ, Cast, MatMul
    EXPECT_EQ(g.nodes[1].op_type, "Cast");
    EXPECT_EQ(g.nodes[2].inputs[1], g.nodes[1].outputs[0]);
  }
}

TEST(WeightInt8, DequantizeGoesJustBeforeFirstConsumer) {
  Graph g;
  g.set_opset("", 13);
  g.inputs.push_back({.name = "x", .dtype = DType::F32});
  g.set_initializer("w1", random_weight({4, 4}, 10));
  g.set_initializer("w2", random_weight({4, 4}, 11));
  g.nodes.push_back(make_node("relu", "Relu", {"x"}, {"h0"}));
  g.nodes.push_back(make_node("mm1", "MatMul", {"h0", "w1"}, {"h1"}));
  g.nodes.push_back(make_node("mm2", "MatMul", {"h1", "w2"}, {"y"}));
  g.outputs.push_back({.name = "y"});
  run_pass(g);
  std::vector<std::string> order;
  for (const Node& n : g.nodes) order.push_back(n.name);
  EXPECT_EQ(order, (std::vector<std::string>{"relu", "w1_DequantizeLinear", "mm1",
                                             "w2_DequantizeLinear", "mm2"}));
  EXPECT_NO_THROW(g.check());
}

TEST(WeightInt8, GeneratedNamesAvoidExistingOnes) {
  const Tensor w = random_weight({4, 4}, 12);
  Graph g = single_op("MatMul", w);
  g.set_initializer("w_quantized", random_weight({2}, 13));  // taken by something unrelated
  g.nodes.push_back(make_node("add", "Add", {"y", "w_quantized"}, {"z"}));
  g.outputs[0].name = "z";
  run_pass(g);
  const Node* dq = expect_quantized(g, "MatMul_0", 1, w.to_f32(), {4, 4}, 1);
  ASSERT_NE(dq, nullptr);
  EXPECT_NE(dq->inputs[0], "w_quantized");
  EXPECT_EQ(g.find_initializer("w_quantized")->dtype(), DType::F32) << "existing tensor untouched";
}

TEST(WeightInt8, MisalignedF32WindowIsReadCorrectly) {
  // A window at an odd byte offset, as a memory-mapped file can hand out.
  const std::vector<float> values = random_values(12, 14);
  auto storage = std::make_shared<OwnedStorage>(values.size() * sizeof(float) + 2);
  std::memcpy(storage->mutable_bytes().data() + 2, values.data(), values.size() * sizeof(float));
  const Tensor w(DType::F32, {3, 4}, storage, 2);
  Graph g = single_op("MatMul", w);
  run_pass(g);
  expect_quantized(g, "MatMul_0", 1, values, {3, 4}, 1);
}
