// Exclusions, op-type filters, overrides, missing and zero ranges, and int32 bias.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "cli/option_parsers.h"
#include "ir/error.h"
#include "tests/unit/quant/static/static_fixtures.h"

using namespace qforge;
using namespace qforge::test;

namespace {

// x -> Conv 'conv' (w, b) -> r -> Gemm 'head' (g) -> y
Graph conv_then_gemm() {
  Graph g;
  g.set_opset("", 13);
  g.inputs = {{.name = "x"}};
  g.set_initializer("w", random_weight({4, 2, 1, 1}, 11));
  g.set_initializer("b", random_weight({4}, 12));
  g.set_initializer("g", random_weight({3, 4}, 13));
  g.nodes.push_back(make_node("conv", "Conv", {"x", "w", "b"}, {"c"}));
  g.nodes.push_back(make_node("flat", "Flatten", {"c"}, {"r"}));
  g.nodes.push_back(
      make_node("head", "Gemm", {"r", "g"}, {"y"}, {Attribute::make_int("transB", 1)}));
  g.outputs = {{.name = "y"}};
  return g;
}

const std::map<std::string, float> kRanges = {{"x", 1.0f}, {"c", 2.0f}, {"r", 2.0f}};

}  // namespace

TEST(StaticInt8Policy, ExcludeByNodeNameRegex) {
  Graph g = conv_then_gemm();
  StaticInt8Options o;
  o.activation_amax = kRanges;
  o.exclude = std::regex("^he");
  o.exclude_pattern = "^he";
  const PassReport r = run_static(g, o);
  EXPECT_EQ(find_node(g, "head")->inputs, (std::vector<std::string>{"r", "g"}));
  EXPECT_TRUE(g.has_initializer("g")) << "excluded node keeps its float weight";
  expect_activation_qdq(g, "conv", 0, "x", 1.0f);
  EXPECT_EQ(r.stats["excluded"], 1);
  EXPECT_EQ(r.stats["nodes_quantized"], 1);
}

TEST(StaticInt8Policy, OpTypesRestrictWhatIsQuantized) {
  Graph g = conv_then_gemm();
  StaticInt8Options o;
  o.activation_amax = kRanges;
  o.op_types = {"Gemm"};
  run_static(g, o);
  EXPECT_EQ(find_node(g, "conv")->inputs, (std::vector<std::string>{"x", "w", "b"}));
  expect_activation_qdq(g, "head", 0, "r", 2.0f);

  Graph bad = conv_then_gemm();
  o.op_types = {"Relu"};
  EXPECT_THROW(run_static(bad, o), Error);
}

TEST(StaticInt8Policy, OverridesSetAmaxAndPerTensorWeights) {
  Graph g = conv_then_gemm();
  StaticInt8Options o;
  o.activation_amax = kRanges;
  o.overrides.insert(parse_tensor_override("x=amax:0.5"));
  o.overrides.insert(parse_tensor_override("w=per-tensor"));
  o.overrides.insert(parse_tensor_override("g=amax:0.25"));
  const PassReport r = run_static(g, o);
  expect_activation_qdq(g, "conv", 0, "x", 0.5f);
  const Tensor w = random_weight({4, 2, 1, 1}, 11);
  expect_quantized(g, "conv", 1, w.to_f32(), w.shape(), std::nullopt);
  const Node* dq = producer_of(g, find_node(g, "head")->inputs[1]);
  ASSERT_NE(dq, nullptr);
  EXPECT_EQ(dq->attr("axis"), nullptr);
  EXPECT_EQ(g.find_initializer(dq->inputs[1])->data<float>()[0], 0.25f / 127.0f);
  for (int8_t q : g.find_initializer(dq->inputs[0])->data<int8_t>()) {
    EXPECT_LE(std::abs(static_cast<int>(q)), 127) << "clipped to the symmetric range";
  }
  EXPECT_EQ(r.stats["activation_ranges"][0]["override"], true);
}

TEST(StaticInt8Policy, OverrideParsingAndUnknownNames) {
  for (const char* bad : {"x", "=amax:1", "x=amax:", "x=amax:0", "x=amax:-1", "x=amax:1e40",
                          "x=amax:abc", "x=per-channel"}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(parse_tensor_override(bad), Error);
  }
  const auto [name, o] = parse_tensor_override("onnx::MatMul_7=amax:2.5");
  EXPECT_EQ(name, "onnx::MatMul_7") << "names with colons and '=' split at the last '='";
  EXPECT_EQ(o.amax, 2.5f);
  Graph g = conv_then_gemm();
  StaticInt8Options opts;
  opts.activation_amax = kRanges;
  opts.overrides.insert(parse_tensor_override("nope=per-tensor"));
  try {
    run_static(g, opts);
    FAIL() << "an override naming no value must fail";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::Usage);
    EXPECT_NE(std::string(e.what()).find("'nope'"), std::string::npos) << e.what();
  }
}

TEST(StaticInt8Policy, ZeroOrMissingRangeLeavesReadersFloatWithWarning) {
  Graph g = conv_then_gemm();
  const PassReport r = run_static(g, {{"x", 0.0f}});  // "r" missing
  EXPECT_EQ(count_ops(g, "QuantizeLinear"), 0u);
  EXPECT_EQ(count_ops(g, "DequantizeLinear"), 0u) << "weights of float nodes stay float too";
  EXPECT_EQ(r.stats["skipped_amax_zero"], 1);
  EXPECT_EQ(r.stats["skipped_no_range"], 1);
  EXPECT_TRUE(has_warning(r, "activation 'x' has amax 0")) << r.warnings.size();
  EXPECT_TRUE(has_warning(r, "1 activation(s) have no calibrated range ('r')"));
  EXPECT_EQ(g.opset(""), 13);

  Graph nan = conv_then_gemm();
  const PassReport rn = run_static(nan, {{"x", std::numeric_limits<float>::quiet_NaN()}});
  EXPECT_EQ(rn.stats["skipped_bad_range"], 1);
}

TEST(StaticInt8Policy, Int32BiasHasScaleInputTimesWeight) {
  Graph g = conv_then_gemm();
  StaticInt8Options o;
  o.activation_amax = kRanges;
  o.int32_bias = true;
  const PassReport r = run_static(g, o);
  const Node* conv = find_node(g, "conv");
  const Node* dq = producer_of(g, conv->inputs[2]);
  ASSERT_TRUE(dq && dq->op_type == "DequantizeLinear");
  EXPECT_EQ(dq->attr_int("axis", -1), 0);
  const Tensor& q = *g.find_initializer(dq->inputs[0]);
  const Tensor& s = *g.find_initializer(dq->inputs[1]);
  const Tensor& zp = *g.find_initializer(dq->inputs[2]);
  EXPECT_EQ(q.dtype(), DType::I32);
  EXPECT_EQ(zp.dtype(), DType::I32);
  EXPECT_EQ(zp.shape(), Shape{4});
  const Node* wdq = producer_of(g, conv->inputs[1]);
  const auto ws = g.find_initializer(wdq->inputs[1])->data<float>();
  const std::vector<float> b = random_weight({4}, 12).to_f32();
  for (size_t c = 0; c < 4; ++c) {
    const float scale = (1.0f / 127.0f) * ws[c];
    EXPECT_EQ(s.data<float>()[c], scale) << c;
    EXPECT_EQ(q.data<int32_t>()[c], static_cast<int32_t>(std::nearbyint(double(b[c]) / scale)));
    EXPECT_NEAR(q.data<int32_t>()[c] * scale, b[c], scale * 0.5f + 1e-9f);
  }
  EXPECT_FALSE(g.has_initializer("b"));
  EXPECT_EQ(r.stats["biases_int32"], 1);
  EXPECT_EQ(r.stats["bias"], "int32");
}

TEST(StaticInt8Policy, Int32BiasOverflowKeepsBiasFloat) {
  Graph g = conv_then_gemm();
  std::vector<float> big = {1.0f, 3.0e9f, -2.0f, 0.5f};
  g.set_initializer("b", Tensor::from_f32(big, {4}));
  StaticInt8Options o;
  o.activation_amax = kRanges;
  o.int32_bias = true;
  o.overrides.insert(parse_tensor_override("x=amax:1e-3"));
  const PassReport r = run_static(g, o);
  EXPECT_EQ(find_node(g, "conv")->inputs[2], "b") << "the whole bias stays float";
  EXPECT_TRUE(g.has_initializer("b"));
  EXPECT_EQ(r.stats["biases_float_overflow"], 1);
  EXPECT_EQ(r.stats["biases_int32"], 0);
  EXPECT_TRUE(has_warning(r, "bias 'b' of Conv 'conv' kept float")) << r.warnings.size();
}
