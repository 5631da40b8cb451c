// The executor's float fusions (runtime/op_fusion.h): which subgraphs become one op, which are
// left alone, and what the fused ops compute against the unfused graph.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "kernels/cpu/vmath_cpu.h"
#include "kernels/packed_gemm.h"
#include "runtime/executor.h"
#include "runtime/op_fusion.h"
#include "tests/unit/runtime/runtime_test_util.h"

using namespace qforge;
using namespace qforge::rt_test;

namespace {

Node node(std::string op, std::vector<std::string> ins, std::string out) {
  Node n;
  n.name = out + "_node";
  n.op_type = std::move(op);
  n.inputs = std::move(ins);
  n.outputs = {std::move(out)};
  return n;
}

Graph base_graph() {
  Graph g;
  g.set_opset("", 17);
  g.inputs.push_back({.name = "x", .dtype = DType::F32});
  return g;
}

std::vector<float> run_graph(const Graph& g, const Tensor& x, bool fuse, int threads = 1,
                             bool pack = true) {
  const Executor ex(g, {.threads = threads, .pack_weights = pack, .fuse_ops = fuse});
  return values<float>(ex.run({{"x", x}}).at(0));
}

// x [2, 3, K] -> MatMul(w [K, N]) -> Add(b, .) -> y, the bias first as PyTorch exports it.
Graph matmul_bias_graph(int64_t k, int64_t n) {
  Graph g = base_graph();
  g.set_initializer("w", random_f32({k, n}, 11));
  g.set_initializer("b", random_f32({n}, 12, -4.0f, 4.0f));
  g.nodes.push_back(node("MatMul", {"x", "w"}, "mm"));
  g.nodes.push_back(node("Add", {"b", "mm"}, "y"));
  g.outputs.push_back({.name = "y"});
  return g;
}

// Gelu as exporters write it. `div`: x / sqrt 2, else x * (1 / sqrt 2); `half_first`:
// (x * 0.5) * (1 + erf), else (x * (1 + erf)) * 0.5.
Graph gelu_graph(bool div, bool half_first) {
  Graph g = base_graph();
  g.set_initializer("c", f32({}, {div ? std::numbers::sqrt2_v<float>
                                      : static_cast<float>(1 / std::numbers::sqrt2)}));
  g.set_initializer("one", f32({}, {1.0f}));
  g.set_initializer("half", f32({}, {0.5f}));
  g.nodes.push_back(node(div ? "Div" : "Mul", {"x", "c"}, "s"));
  g.nodes.push_back(node("Erf", {"s"}, "e"));
  g.nodes.push_back(node("Add", {"one", "e"}, "p"));
  if (half_first) {
    g.nodes.push_back(node("Mul", {"x", "half"}, "h"));
    g.nodes.push_back(node("Mul", {"h", "p"}, "y"));
  } else {
    g.nodes.push_back(node("Mul", {"x", "p"}, "t"));
    g.nodes.push_back(node("Mul", {"t", "half"}, "y"));
  }
  g.outputs.push_back({.name = "y"});
  return g;
}

}  // namespace

TEST(OpFusion, MatMulThenBiasAddIsOneProductWhoseSumsStartAtTheBias) {
  const int64_t k = 37, n = 21;
  const Graph g = matmul_bias_graph(k, n);
  Graph fused = g;
  const FusedOps f = fuse_float_ops(fused);
  EXPECT_EQ(f.matmul_bias, 1);
  ASSERT_EQ(fused.nodes.size(), 1u);
  EXPECT_EQ(fused.nodes[0].op_type, "MatMulBias");
  EXPECT_EQ(fused.nodes[0].outputs, std::vector<std::string>{"y"});

  const Tensor x = random_f32({2, 3, k}, 13);
  const auto xs = values<float>(x), ws = values<float>(*g.find_initializer("w"));
  const auto bs = values<float>(*g.find_initializer("b"));
  const std::vector<float> unfused = run_graph(g, x, false);
  // Unpacked, the bias is added to the finished sums: the unfused graph's bits.
  EXPECT_EQ(run_graph(g, x, true, 1, false), run_graph(g, x, false, 1, false));
  if (!packed_gemm_supported()) GTEST_SKIP() << "this CPU lacks AVX2/FMA: no packed product";
  std::vector<float> chain(static_cast<size_t>(6 * n));
  for (int64_t r = 0; r < 6; ++r) {
    for (int64_t j = 0; j < n; ++j) {
      float acc = bs[static_cast<size_t>(j)];
      for (int64_t p = 0; p < k; ++p) {
        acc = std::fma(xs[static_cast<size_t>(r * k + p)], ws[static_cast<size_t>(p * n + j)], acc);
      }
      chain[static_cast<size_t>(r * n + j)] = acc;
    }
  }
  for (int threads : {1, 2, 3}) EXPECT_EQ(run_graph(g, x, true, threads), chain) << threads;
  expect_near_all(chain, unfused, 1e-5f);
}

TEST(OpFusion, BothExportedGeluFormsAreOnePassOfTheExactGelu) {
  std::vector<float> xs;
  for (int i = -400; i <= 400; ++i) xs.push_back(static_cast<float>(i) / 50.0f);
  const Tensor x = f32({static_cast<int64_t>(xs.size())}, xs);
  std::vector<float> want(xs.size());
  gelu_erf_f32(xs.data(), want.data(), static_cast<int64_t>(xs.size()));
  for (bool div : {true, false}) {
    for (bool half_first : {true, false}) {
      SCOPED_TRACE(std::string(div ? "div" : "mul") + (half_first ? ", half first" : ""));
      const Graph g = gelu_graph(div, half_first);
      Graph fused = g;
      EXPECT_EQ(fuse_float_ops(fused).gelu, 1);
      ASSERT_EQ(fused.nodes.size(), 1u);
      EXPECT_EQ(fused.nodes[0].op_type, "Gelu");
      EXPECT_EQ(fused.nodes[0].inputs, std::vector<std::string>{"x"});
      EXPECT_EQ(run_graph(g, x, true), want);
      expect_near_all(run_graph(g, x, false), want, 1e-6f);
    }
  }
}

TEST(OpFusion, LeavesSubgraphsWhoseInsidesAreReadElsewhereOrNotFixed) {
  const auto fused_count = [](Graph g) {
    const FusedOps f = fuse_float_ops(g);
    return f.matmul_bias + f.gelu;
  };
  {  // the product is also a graph output
    Graph g = matmul_bias_graph(4, 3);
    g.outputs.push_back({.name = "mm"});
    EXPECT_EQ(fused_count(g), 0);
  }
  {  // a bias of another shape: [1, N]
    Graph g = matmul_bias_graph(4, 3);
    g.set_initializer("b", random_f32({1, 3}, 1));
    EXPECT_EQ(fused_count(g), 0);
  }
  {  // the bias is also a graph input: a feed may replace it
    Graph g = matmul_bias_graph(4, 3);
    g.inputs.push_back({.name = "b", .dtype = DType::F32});
    EXPECT_EQ(fused_count(g), 0);
  }
  {  // the weight is not a constant
    Graph g = matmul_bias_graph(4, 3);
    g.remove_initializer("w");
    g.inputs.push_back({.name = "w", .dtype = DType::F32});
    EXPECT_EQ(fused_count(g), 0);
  }
  {  // erf's output read by a second node
    Graph g = gelu_graph(true, false);
    g.nodes.push_back(node("Neg", {"e"}, "z"));
    g.outputs.push_back({.name = "z"});
    EXPECT_EQ(fused_count(g), 0);
  }
  {  // x / 2 is not the GELU's scaling
    Graph g = gelu_graph(true, true);
    g.set_initializer("c", f32({}, {2.0f}));
    EXPECT_EQ(fused_count(g), 0);
  }
  {  // (x * 0.25) * (1 + erf)
    Graph g = gelu_graph(false, true);
    g.set_initializer("half", f32({}, {0.25f}));
    EXPECT_EQ(fused_count(g), 0);
  }
  {  // the 0.5 multiplies another value than x
    Graph g = gelu_graph(true, true);
    g.inputs.push_back({.name = "v", .dtype = DType::F32});
    g.nodes[3].inputs = {"v", "half"};
    EXPECT_EQ(fused_count(g), 0);
  }
}

TEST(OpFusion, ConstantNodesBecomeInitializersAndObserversSeeOnlyWhatRuns) {
  Graph g = base_graph();
  Node c = node("Constant", {}, "k");
  Attribute a;
  a.name = "value";
  a.type = AttrType::Tensor;
  a.t = f32({2}, {3.0f, -1.0f});
  c.attributes.push_back(a);
  g.nodes.push_back(c);
  g.nodes.push_back(node("Add", {"x", "k"}, "y"));
  g.outputs.push_back({.name = "y"});
  Graph fused = g;
  EXPECT_EQ(fuse_float_ops(fused).constants, 1);
  ASSERT_EQ(fused.nodes.size(), 1u);
  ASSERT_NE(fused.find_initializer("k"), nullptr);

  const Tensor x = f32({2}, {1.0f, 2.0f});
  for (bool fuse : {true, false}) {
    Executor ex(g, {.threads = 1, .fuse_ops = fuse});
    std::vector<std::string> seen;
    ex.set_observer([&](const std::string& name, const Tensor&) { seen.push_back(name); });
    EXPECT_EQ(values<float>(ex.run({{"x", x}}).at(0)), (std::vector<float>{4.0f, 1.0f}));
    const std::vector<std::string> want =
        fuse ? std::vector<std::string>{"x", "y"} : std::vector<std::string>{"x", "k", "y"};
    EXPECT_EQ(seen, want);
  }
}
