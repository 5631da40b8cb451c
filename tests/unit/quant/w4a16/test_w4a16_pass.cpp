#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "ir/error.h"
#include "kernels/int4.h"
#include "tests/unit/quant/w4a16/w4a16_fixtures.h"

using namespace qforge;
using namespace qforge::test::w4a16;

namespace {

W4A16Options all_layers(int block = 32) {
  W4A16Options o;
  o.block_size = block;
  o.exclude_output_projection = false;
  return o;
}

// The float graph with each listed weight replaced by its reference dequantized values.
Graph with_reference_weights(Graph g, const std::vector<std::pair<std::string, int64_t>>& weights,
                             int64_t block) {
  for (const auto& [name, axis] : weights) {
    const Tensor w = *g.find_initializer(name);
    g.set_initializer(name, Tensor::from_f32(reference_dequantized(w, axis, block), w.shape()));
  }
  return g;
}

void expect_same(const Tensor& a, const Tensor& b) {
  ASSERT_EQ(a.shape(), b.shape());
  ASSERT_EQ(a.dtype(), b.dtype());
  const auto va = a.to_f32(), vb = b.to_f32();
  for (size_t i = 0; i < va.size(); ++i) ASSERT_EQ(va[i], vb[i]) << "element " << i;
}

}  // namespace

TEST(W4A16Pass, MatMulGetsBlockedDequantizeOnAxis0) {
  Graph g = mlp(64, 16, 8);
  const PassReport report = run_pass(g, all_layers(32));
  EXPECT_EQ(report.stats["quantized"], 2);
  EXPECT_EQ(g.opset(), 21);
  EXPECT_FALSE(g.has_initializer("w1"));
  const Node* fc1 = nullptr;
  for (const Node& n : g.nodes)
    if (n.name == "fc1") fc1 = &n;
  ASSERT_NE(fc1, nullptr);
  const Node* cast = producer_of(g, fc1->inputs[1]);
  ASSERT_NE(cast, nullptr);
  ASSERT_EQ(cast->op_type, "Cast");
  EXPECT_EQ(cast->attr_int("to", 0), 1);  // back to f32
  const Node* dq = producer_of(g, cast->inputs[0]);
  ASSERT_NE(dq, nullptr);
  ASSERT_EQ(dq->op_type, "DequantizeLinear");
  EXPECT_EQ(dq->attr_int("axis", -1), 0);
  EXPECT_EQ(dq->attr_int("block_size", -1), 32);
  ASSERT_EQ(dq->inputs.size(), 2u);  // no zero point: symmetric
  const Tensor* q = g.find_initializer(dq->inputs[0]);
  const Tensor* s = g.find_initializer(dq->inputs[1]);
  ASSERT_NE(q, nullptr);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(q->dtype(), DType::I4);
  EXPECT_EQ(q->shape(), (Shape{64, 16}));
  EXPECT_EQ(s->dtype(), DType::F16);
  EXPECT_EQ(s->shape(), (Shape{2, 16}));
  const auto& row = report.stats["tensors"][0];
  EXPECT_EQ(row["name"], "w1");
  EXPECT_EQ(row["axis"], 0);
  EXPECT_EQ(row["block_size"], 32);
  EXPECT_EQ(row["bytes_before"], 64 * 16 * 4);
  EXPECT_EQ(row["bytes_after"], 64 * 16 / 2 + 2 * 16 * 2);
  EXPECT_GT(row["sqnr_db"].get<double>(), 15.0);
}

TEST(W4A16Pass, ScalesAndValuesMatchReference) {
  double sq_err[2] = {0.0, 0.0};
  for (const Int4Scale how : {Int4Scale::Amax, Int4Scale::Mse}) {
    SCOPED_TRACE(std::string(int4_scale_name(how)));
    Graph g = mlp(96, 8, 4, 5);
    const Tensor w1 = *g.find_initializer("w1");
    W4A16Options o = all_layers(32);
    o.scale = how;
    const PassReport report = run_pass(g, o);
    EXPECT_EQ(report.stats["scale"], int4_scale_name(how));
    const Node* dq = find_op(g, "DequantizeLinear");
    ASSERT_NE(dq, nullptr);
    const std::vector<float> q = g.find_initializer(dq->inputs[0])->to_f32();
    const std::vector<float> s = g.find_initializer(dq->inputs[1])->to_f32();
    const std::vector<float> ref = reference_dequantized(w1, 0, 32, how);
    const std::vector<float> v = w1.to_f32();
    for (int64_t k = 0; k < 96; ++k) {
      for (int64_t n = 0; n < 8; ++n) {
        const auto e = static_cast<size_t>(k * 8 + n);
        const float scale = s[static_cast<size_t>((k / 32) * 8 + n)];
        ASSERT_EQ(f16_to_f32(f32_to_f16(q[e] * scale)), ref[e]) << "k " << k << " n " << n;
        if (how == Int4Scale::Amax) {  // no clipping: within half a step
          ASSERT_LE(std::fabs(q[e] * scale - v[e]), scale / 2 + 1e-6f) << "k " << k << " n " << n;
        }
        const double d = static_cast<double>(q[e]) * scale - v[e];
        sq_err[how == Int4Scale::Mse ? 1 : 0] += d * d;
      }
    }
  }
  EXPECT_LT(sq_err[1], sq_err[0]) << "the scale search did not lower the weight error";
}

TEST(W4A16Pass, RuntimeMatchesDequantizedFloatModelExactly) {
  for (const int64_t k : {64, 40, 130}) {  // exact blocks, partial last block, several + partial
    SCOPED_TRACE(testing::Message() << "K " << k);
    const Graph original = mlp(k, 24, 6, 9);
    Graph quantized = original;
    run_pass(quantized, all_layers(32));
    const Graph reference = with_reference_weights(original, {{"w1", 0}, {"w2", 0}}, 32);
    const Tensor x = random_weight({3, k}, 77);
    expect_same(run_graph(quantized, x), run_graph(reference, x));
  }
}

TEST(W4A16Pass, PartialLastBlockGetsCeilScaleRows) {
  Graph g = mlp(100, 8, 4);
  run_pass(g, all_layers(64));
  const Node* dq = find_op(g, "DequantizeLinear");
  ASSERT_NE(dq, nullptr);
  EXPECT_EQ(g.find_initializer(dq->inputs[1])->shape(), (Shape{2, 8}));  // ceil(100 / 64)
}

TEST(W4A16Pass, GemmTransBBlocksAlongAxis1) {
  for (const int64_t trans_b : {0, 1}) {
    SCOPED_TRACE(testing::Message() << "transB " << trans_b);
    Graph g;
    g.set_opset("", 17);
    g.inputs.push_back({.name = "x", .dtype = DType::F32});
    const Shape shape = trans_b ? Shape{6, 40} : Shape{40, 6};  // K = 40, N = 6
    g.set_initializer("w", random_weight(shape, 3));
    g.set_initializer("bias", random_weight({6}, 4));
    g.nodes.push_back(make_node("gemm", "Gemm", {"x", "w", "bias"}, {"y"},
                                {Attribute::make_int("transB", trans_b)}));
    g.outputs.push_back({.name = "y"});
    const Graph reference = with_reference_weights(g, {{"w", trans_b}}, 32);
    Graph quantized = g;
    run_pass(quantized, all_layers(32));
    const Node* dq = find_op(quantized, "DequantizeLinear");
    ASSERT_NE(dq, nullptr);
    EXPECT_EQ(dq->attr_int("axis", -1), trans_b);
    EXPECT_EQ(quantized.find_initializer(dq->inputs[1])->shape(),
              trans_b ? (Shape{6, 2}) : (Shape{2, 6}));
    const Tensor x = random_weight({2, 40}, 8);
    expect_same(run_graph(quantized, x), run_graph(reference, x));
  }
}

TEST(W4A16Pass, ExcludesOutputProjectionLmHeadAndRegexByDefault) {
  {
    Graph g = mlp(32, 16, 8);
    const PassReport report = run_pass(g, W4A16Options{.block_size = 32});
    EXPECT_EQ(report.stats["quantized"], 1);  // fc2 produces the graph output
    EXPECT_EQ(report.stats["excluded"], 1);
    EXPECT_TRUE(g.has_initializer("w2"));
    EXPECT_FALSE(g.has_initializer("w1"));
  }
  {
    Graph g = mlp(32, 16, 8);
    g.nodes[0].name = "model/lm_head/MatMul";
    const PassReport report = run_pass(g, all_layers(32));
    EXPECT_EQ(report.stats["quantized"], 1);
    EXPECT_TRUE(g.has_initializer("w1"));
  }
  {
    Graph g = mlp(32, 16, 8);
    W4A16Options o = all_layers(32);
    o.exclude = std::regex("fc2");
    const PassReport report = run_pass(g, o);
    EXPECT_EQ(report.stats["quantized"], 1);
    EXPECT_TRUE(g.has_initializer("w2"));
  }
}

TEST(W4A16Pass, GatherOnlyWithIncludeGather) {
  auto embedding = [] {
    Graph g;
    g.set_opset("", 17);
    g.inputs.push_back({.name = "ids", .dtype = DType::I64});
    g.set_initializer("table", random_weight({10, 64}, 2));
    g.nodes.push_back(make_node("embed", "Gather", {"table", "ids"}, {"e"}));
    g.nodes.push_back(make_node("act", "Relu", {"e"}, {"y"}));
    g.outputs.push_back({.name = "y"});
    return g;
  };
  Graph off = embedding();
  EXPECT_EQ(run_pass(off, all_layers(32)).stats["quantized"], 0);
  EXPECT_TRUE(off.has_initializer("table"));
  Graph on = embedding();
  W4A16Options o = all_layers(32);
  o.include_gather = true;
  EXPECT_EQ(run_pass(on, o).stats["quantized"], 1);
  const Node* dq = find_op(on, "DequantizeLinear");
  ASSERT_NE(dq, nullptr);
  EXPECT_EQ(dq->attr_int("axis", -1), 1);  // blocks along hidden
  EXPECT_EQ(on.find_initializer(dq->inputs[1])->shape(), (Shape{10, 2}));
  Tensor ids(DType::I64, {3});
  const std::vector<int64_t> idv = {0, 9, 4};
  std::memcpy(ids.mutable_bytes().data(), idv.data(), sizeof(int64_t) * 3);
  const Graph reference = with_reference_weights(embedding(), {{"table", 1}}, 32);
  const Tensor a = Executor(on, {.device = Device::Cpu, .threads = 1}).run({{"ids", ids}}).at(0);
  const Tensor b =
      Executor(reference, {.device = Device::Cpu, .threads = 1}).run({{"ids", ids}}).at(0);
  expect_same(a, b);
}

TEST(W4A16Pass, HalfWeightFeedsConsumerWithoutCast) {
  Graph g;
  g.set_opset("", 17);
  g.inputs.push_back({.name = "x", .dtype = DType::F16});
  g.set_initializer("w", random_weight({64, 8}, 6, DType::F16));
  g.nodes.push_back(make_node("fc", "MatMul", {"x", "w"}, {"h"}));
  g.nodes.push_back(make_node("act", "Relu", {"h"}, {"y"}));
  g.outputs.push_back({.name = "y"});
  run_pass(g, all_layers(32));
  EXPECT_EQ(find_op(g, "Cast"), nullptr);
  const Node* dq = find_op(g, "DequantizeLinear");
  ASSERT_NE(dq, nullptr);
  EXPECT_EQ(find_op(g, "MatMul")->inputs[1], dq->outputs[0]);
}

TEST(W4A16Pass, RejectsBadBlockSizeAndNonFiniteWeights) {
  try {
    make_w4a16_pass(W4A16Options{.block_size = 48});
    ADD_FAILURE() << "block size 48 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::Usage) << e.what();
  }
  Graph g = mlp(32, 4, 4);
  Tensor w = *g.find_initializer("w1");
  std::vector<float> v = w.to_f32();
  v[5] = std::nanf("");
  g.set_initializer("w1", Tensor::from_f32(v, w.shape()));
  try {
    run_pass(g, all_layers(32));
    ADD_FAILURE() << "NaN weight accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::InvalidInput) << e.what();
    EXPECT_NE(std::string(e.what()).find("w1"), std::string::npos) << e.what();
  }
}
