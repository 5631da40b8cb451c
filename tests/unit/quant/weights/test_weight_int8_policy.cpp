// Which weights the pass quantizes, shares, keeps or skips, and what it reports about it.
#include <gtest/gtest.h>

#include <limits>

#include "ir/error.h"
#include "tests/unit/quant/weights/weight_int8_fixtures.h"

using namespace qforge;
using namespace qforge::test;

namespace {

// x -> mm_a(x, w) -> a; x -> mm_b(x, w) -> b: one weight, two MatMuls.
Graph shared_weight_graph(const Tensor& w) {
  Graph g;
  g.set_opset("", 17);
  g.inputs.push_back({.name = "x", .dtype = DType::F32});
  g.set_initializer("w", w);
  g.nodes.push_back(make_node("mm_a", "MatMul", {"x", "w"}, {"a"}));
  g.nodes.push_back(make_node("mm_b", "MatMul", {"x", "w"}, {"b"}));
  g.outputs.push_back({.name = "a"});
  g.outputs.push_back({.name = "b"});
  return g;
}

bool any_warning_has(const PassReport& r, const std::string& text) {
  for (const auto& w : r.warnings)
    if (w.find(text) != std::string::npos) return true;
  return false;
}

size_t count_op(const Graph& g, const std::string& op) {
  return static_cast<size_t>(std::count_if(g.nodes.begin(), g.nodes.end(),
                                           [&](const Node& n) { return n.op_type == op; }));
}

}  // namespace

TEST(WeightInt8Policy, SharedWeightIsQuantizedOnceAndRemoved) {
  const Tensor w = random_weight({6, 5}, 20);
  Graph g = shared_weight_graph(w);
  const PassReport r = run_pass(g);
  EXPECT_EQ(r.stats["quantized"], 1);
  EXPECT_EQ(count_op(g, "DequantizeLinear"), 1u);
  const Node* dq = expect_quantized(g, "mm_a", 1, w.to_f32(), {6, 5}, 1);
  ASSERT_NE(dq, nullptr);
  EXPECT_EQ(find_node(g, "mm_b")->inputs[1], dq->outputs[0]);
  EXPECT_FALSE(g.has_initializer("w"));
  EXPECT_FALSE(r.stats["tensors"][0]["float_kept"].get<bool>());
}

TEST(WeightInt8Policy, ExcludedNodeKeepsFloatCopy) {
  const Tensor w = random_weight({6, 5}, 21);
  Graph g = shared_weight_graph(w);
  WeightInt8Options options;
  options.exclude = std::regex("_b$");
  options.exclude_pattern = "_b$";
  const PassReport r = run_pass(g, options);
  EXPECT_EQ(r.stats["excluded"], 1);
  EXPECT_EQ(r.stats["quantized"], 1);
  expect_quantized(g, "mm_a", 1, w.to_f32(), {6, 5}, 1);
  EXPECT_EQ(find_node(g, "mm_b")->inputs[1], "w");
  ASSERT_TRUE(g.has_initializer("w"));
  EXPECT_TRUE(g.find_initializer("w")->equals(w));
  EXPECT_TRUE(r.stats["tensors"][0]["float_kept"].get<bool>());
  EXPECT_EQ(r.stats["bytes_after"], 30 + 5 * 4 + 5 + 30 * 4) << "float copy counted";
  EXPECT_TRUE(any_warning_has(r, "MatMul 'mm_b'")) << "warning names the float reader";
  EXPECT_EQ(r.stats["exclude"], "_b$");
}

TEST(WeightInt8Policy, WeightAlsoReadByOtherOpKeepsFloatCopy) {
  const Tensor w = random_weight({4, 4}, 22);
  Graph g = single_op("MatMul", w);
  g.nodes.push_back(make_node("add", "Add", {"y", "w"}, {"z"}));
  g.outputs[0].name = "z";
  const PassReport r = run_pass(g);
  expect_quantized(g, "MatMul_0", 1, w.to_f32(), {4, 4}, 1);
  EXPECT_TRUE(g.has_initializer("w"));
  EXPECT_EQ(find_node(g, "add")->inputs[1], "w");
  EXPECT_TRUE(any_warning_has(r, "Add 'add'"));
}

TEST(WeightInt8Policy, OpTypesOptionLimitsOps) {
  Graph g = single_op("Conv", random_weight({4, 2, 3, 3}, 23));
  WeightInt8Options options;
  options.op_types = {"MatMul"};
  const PassReport r = run_pass(g, options);
  EXPECT_EQ(r.stats["quantized"], 0);
  EXPECT_EQ(g.nodes.size(), 1u);
  EXPECT_TRUE(g.has_initializer("w"));
  EXPECT_EQ(g.opset(""), 11) << "nothing quantized: opset untouched";
}

TEST(WeightInt8Policy, UnknownOpTypeIsUsageError) {
  WeightInt8Options options;
  options.op_types = {"Gather"};
  try {
    make_weight_int8_pass(options);
    FAIL() << "accepted op type without a weight rule";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::Usage);
    EXPECT_NE(std::string(e.what()).find("'Gather'"), std::string::npos) << e.what();
  }
}

TEST(WeightInt8Policy, SkipsUnsuitableWeightsWithWarnings) {
  Graph g;
  g.set_opset("", 13);
  g.inputs.push_back({.name = "x", .dtype = DType::F32});
  g.inputs.push_back({.name = "w_input", .dtype = DType::F32});
  g.set_initializer("w_1d", random_weight({4}, 24));
  g.set_initializer("w_int", Tensor(DType::I32, {4, 4}));
  g.set_initializer("w_input", random_weight({4, 4}, 25));  // an initializer that is also an input
  g.nodes.push_back(make_node("mm_1d", "MatMul", {"x", "w_1d"}, {"a"}));
  g.nodes.push_back(make_node("mm_int", "MatMul", {"x", "w_int"}, {"b"}));
  g.nodes.push_back(make_node("mm_input", "MatMul", {"x", "w_input"}, {"c"}));
  g.nodes.push_back(make_node("mm_act", "MatMul", {"x", "a"}, {"d"}));  // activation B
  for (const char* out : {"b", "c", "d"}) g.outputs.push_back({.name = out});
  const Graph before = g;
  const PassReport r = run_pass(g);
  EXPECT_EQ(r.stats["quantized"], 0);
  EXPECT_EQ(r.stats["skipped"], 3);
  EXPECT_EQ(r.stats["not_constant"], 1);
  EXPECT_EQ(r.warnings.size(), 3u);
  EXPECT_TRUE(any_warning_has(r, "'w_1d'"));
  EXPECT_TRUE(any_warning_has(r, "'w_int'"));
  EXPECT_TRUE(any_warning_has(r, "'w_input'"));
  EXPECT_EQ(g.nodes.size(), before.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); ++i) EXPECT_EQ(g.nodes[i].inputs, before.nodes[i].inputs);
}

TEST(WeightInt8Policy, NonFiniteWeightIsInvalidInputNamingIt) {
  for (float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    std::vector<float> values = random_values(12, 26);
    values[7] = bad;  // [3, 4] MatMul B: column 3
    Graph g = single_op("MatMul", Tensor::from_f32(values, {3, 4}));
    try {
      run_pass(g);
      FAIL() << "quantized a weight holding " << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.category(), ErrorCategory::InvalidInput);
      const std::string msg = e.what();
      EXPECT_NE(msg.find("'w'"), std::string::npos) << msg;
      EXPECT_NE(msg.find("NaN or Inf"), std::string::npos) << msg;
      EXPECT_NE(msg.find("channel 3"), std::string::npos) << msg;
    }
  }
}

TEST(WeightInt8Policy, RaisesOpsetTo13ForPerChannelAndWarns) {
  Graph g = single_op("MatMul", random_weight({4, 4}, 27));
  g.nodes.push_back(make_node("sm", "Softmax", {"y"}, {"z"}));
  g.outputs[0].name = "z";
  const PassReport r = run_pass(g);
  EXPECT_EQ(g.opset(""), 13);
  EXPECT_EQ(r.stats["opset"], 13);
  EXPECT_TRUE(any_warning_has(r, "from 11 to 13"));
  EXPECT_TRUE(any_warning_has(r, "Softmax")) << "Softmax's axis changed meaning at 13";
}

TEST(WeightInt8Policy, KeepsAiOnnxOpsetKey) {
  Graph g = single_op("MatMul", random_weight({4, 4}, 28));
  g.opset_imports.clear();
  g.set_opset("ai.onnx", 12);
  run_pass(g);
  EXPECT_EQ(g.opset_imports.count(""), 0u);
  EXPECT_EQ(g.opset("ai.onnx"), 13);
}

TEST(WeightInt8Policy, PerTensorNeedsOnlyOpset10) {
  for (int64_t start : {9, 11}) {
    Graph g = single_op("MatMul", random_weight({4, 4}, 29));
    g.set_opset("", start);
    WeightInt8Options options;
    options.per_tensor = true;
    const PassReport r = run_pass(g, options);
    EXPECT_EQ(g.opset(""), std::max<int64_t>(start, 10)) << "from " << start;
    EXPECT_EQ(any_warning_has(r, "opset"), start < 10);
  }
}

TEST(WeightInt8Policy, OpsetNotLoweredWhenHigher) {
  Graph g = single_op("MatMul", random_weight({4, 4}, 30));
  g.set_opset("", 21);
  const PassReport r = run_pass(g);
  EXPECT_EQ(g.opset(""), 21);
  EXPECT_TRUE(r.warnings.empty());
}

TEST(WeightInt8Policy, CudaWithoutDeviceIsUnsupported) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device answers: nothing to refuse";
  Graph g = single_op("MatMul", random_weight({4, 4}, 31));
  WeightInt8Options options;
  options.device = Device::Cuda;
  PassReport report;
  try {
    make_weight_int8_pass(options)->run(g, report);
    FAIL() << "ran on CUDA without a device";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::Unsupported);
  }
  EXPECT_TRUE(g.has_initializer("w")) << "graph untouched";
}

TEST(WeightInt8Policy, AllZeroWeightReportsExactAndNoSqnr) {
  Graph g = single_op("MatMul", Tensor(DType::F32, {4, 3}));
  const PassReport r = run_pass(g);
  const auto& row = r.stats["tensors"][0];
  EXPECT_EQ(row["max_abs_error"], 0.0);
  EXPECT_EQ(row["sqnr_db"], "inf") << "no error: SQNR +inf, written as \"inf\" (ir/json_number.h)";
  for (float s : g.find_initializer("w_scale")->data<float>()) EXPECT_EQ(s, 1.0f);
}
