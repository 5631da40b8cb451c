// The executor's float fusions (runtime/op_fusion.h): which subgraphs become one op, which are
// left alone, and what the fused ops compute against the unfused graph.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numbers>
#include <string>
#include <unordered_set>

#include "kernels/cpu/vmath_cpu.h"
#include "kernels/packed_gemm.h"
#include "runtime/executor.h"
#include "runtime/op_fusion.h"
#include "runtime/op_utils.h"
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

namespace {

// RMSNorm as exporters write it over x [rows, 48]. `pow`: Pow(x, 2), else Mul(x, x); `div`:
// Div(1, sqrt), else Reciprocal; `weight`: a last Mul by w [48] (w first when `pow`).
Graph rms_norm_graph(bool pow, bool div, bool weight, int64_t opset = 17) {
  Graph g = base_graph();
  g.set_opset("", opset);
  g.set_initializer("two", f32({}, {2.0f}));
  g.set_initializer("eps", f32({}, {1e-5f}));
  g.set_initializer("one", f32({}, {1.0f}));
  g.set_initializer("w", random_f32({48}, 21, 0.5f, 1.5f));
  g.nodes.push_back(pow ? node("Pow", {"x", "two"}, "sq") : node("Mul", {"x", "x"}, "sq"));
  Node mean = node("ReduceMean", {"sq"}, "mean");
  if (opset >= 18) {
    g.set_initializer("axes", i64({1}, {-1}));
    mean.inputs.push_back("axes");
  } else {
    mean.attributes.push_back(attr_ints("axes", {-1}));
  }
  g.nodes.push_back(mean);
  g.nodes.push_back(node("Add", {"mean", "eps"}, "var"));
  g.nodes.push_back(node("Sqrt", {"var"}, "root"));
  g.nodes.push_back(div ? node("Div", {"one", "root"}, "inv")
                        : node("Reciprocal", {"root"}, "inv"));
  g.nodes.push_back(node("Mul", {"x", "inv"}, weight ? "normed" : "y"));
  if (weight) g.nodes.push_back(node("Mul", pow ? std::vector<std::string>{"w", "normed"}
                                                : std::vector<std::string>{"normed", "w"},
                                     "y"));
  g.outputs.push_back({.name = "y"});
  return g;
}

}  // namespace

TEST(OpFusion, RmsNormChainsAreOnePassWithTheSameFloatSteps) {
  const Tensor x = random_f32({37, 48}, 22, -3.0f, 3.0f);
  for (bool pow : {false, true}) {
    for (bool div : {false, true}) {
      for (bool weight : {false, true}) {
        for (int64_t opset : {17, 18}) {
          SCOPED_TRACE(std::to_string(pow) + std::to_string(div) + std::to_string(weight) +
                       " opset " + std::to_string(opset));
          const Graph g = rms_norm_graph(pow, div, weight, opset);
          Graph fused = g;
          EXPECT_EQ(fuse_float_ops(fused).rms_norm, 1);
          ASSERT_EQ(fused.nodes.size(), 1u);
          EXPECT_EQ(fused.nodes[0].op_type, "RmsNorm");
          const std::vector<float> want = run_graph(g, x, false);
          // Only the order of the squares' double sum differs: at most one f32 rounding of
          // the mean apart.
          for (int threads : {1, 2}) {
            const std::vector<float> got = run_graph(g, x, true, threads);
            ASSERT_EQ(got.size(), want.size());
            for (size_t i = 0; i < got.size(); ++i) {
              EXPECT_NEAR(got[i], want[i], 4e-7f * std::abs(want[i]) + 1e-30f) << i;
            }
          }
        }
      }
    }
  }
}

TEST(OpFusion, RmsNormIsLeftAloneOverOtherAxesOrWithoutItsSteps) {
  const auto fused_count = [](Graph g) { return fuse_float_ops(g).rms_norm; };
  {  // the mean over axis 0
    Graph g = rms_norm_graph(false, false, true);
    g.nodes[1].attributes = {attr_ints("axes", {0})};
    EXPECT_EQ(fused_count(g), 0);
  }
  {  // keepdims 0
    Graph g = rms_norm_graph(false, false, true);
    g.nodes[1].attributes.push_back(attr_int("keepdims", 0));
    EXPECT_EQ(fused_count(g), 0);
  }
  {  // x^3
    Graph g = rms_norm_graph(true, false, true);
    g.set_initializer("two", f32({}, {3.0f}));
    EXPECT_EQ(fused_count(g), 0);
  }
  {  // 2 / sqrt
    Graph g = rms_norm_graph(false, true, true);
    g.set_initializer("one", f32({}, {2.0f}));
    EXPECT_EQ(fused_count(g), 0);
  }
  {  // the scale multiplies another value than x
    Graph g = rms_norm_graph(false, false, false);
    g.inputs.push_back({.name = "v", .dtype = DType::F32});
    g.nodes[5].inputs = {"v", "inv"};
    EXPECT_EQ(fused_count(g), 0);
  }
  {  // the mean is also read elsewhere
    Graph g = rms_norm_graph(false, false, true);
    g.outputs.push_back({.name = "mean"});
    EXPECT_EQ(fused_count(g), 0);
  }
}

TEST(OpFusion, SiluIsOnePassWithTheSameBits) {
  Graph g = base_graph();
  g.nodes.push_back(node("Sigmoid", {"x"}, "s"));
  g.nodes.push_back(node("Mul", {"s", "x"}, "y"));
  g.outputs.push_back({.name = "y"});
  Graph fused = g;
  EXPECT_EQ(fuse_float_ops(fused).silu, 1);
  ASSERT_EQ(fused.nodes.size(), 1u);
  EXPECT_EQ(fused.nodes[0].op_type, "Silu");
  const Tensor x = random_f32({5, 999}, 23, -20.0f, 20.0f);
  for (int threads : {1, 2}) EXPECT_EQ(run_graph(g, x, true, threads), run_graph(g, x, false));
  // Sigmoid of another value than the Mul's other operand stays as it is.
  g.inputs.push_back({.name = "v", .dtype = DType::F32});
  g.nodes[1].inputs = {"s", "v"};
  EXPECT_EQ(fuse_float_ops(g).silu, 0);
}

TEST(OpFusion, HalfSiluRoundsAsTheTwoOpsDo) {
  Graph g = base_graph();
  g.inputs[0].dtype = DType::F16;
  g.nodes.push_back(node("Sigmoid", {"x"}, "s"));
  g.nodes.push_back(node("Mul", {"x", "s"}, "y"));
  g.outputs.push_back({.name = "y"});
  const Tensor x = ops::from_f32(random_f32({3, 333}, 24, -12.0f, 12.0f), DType::F16);
  for (HalfCompute mode : {HalfCompute::PerOp, HalfCompute::Ort}) {
    std::vector<std::vector<uint16_t>> outs;
    for (bool fuse : {true, false}) {
      const Executor ex(g, {.threads = 1, .half_compute = mode, .fuse_ops = fuse});
      outs.push_back(values<uint16_t>(ex.run({{"x", x}}).at(0)));
    }
    EXPECT_EQ(outs[0], outs[1]) << (mode == HalfCompute::PerOp ? "per op" : "as ORT");
  }
}

namespace {

// x [3, 6, 9, 9] -> Conv(w, b; pads 1, `group`) -> c -> Relu -> y.
Graph conv_relu_graph(int64_t group) {
  Graph g = base_graph();
  g.set_initializer("w", random_f32({8, 6 / group, 3, 3}, 31));
  g.set_initializer("b", random_f32({8}, 32));
  Node conv = node("Conv", {"x", "w", "b"}, "c");
  conv.attributes = {attr_int("group", group), attr_ints("pads", {1, 1, 1, 1})};
  g.nodes.push_back(std::move(conv));
  g.nodes.push_back(node("Relu", {"c"}, "y"));
  g.outputs.push_back({.name = "y"});
  return g;
}

std::vector<uint32_t> bits_of(const std::vector<float>& v) {
  std::vector<uint32_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = std::bit_cast<uint32_t>(v[i]);
  return b;
}

}  // namespace

// Conv -> Relu: one ConvRelu whose output has the two ops' bits, whether the kernel stores
// through the Relu (packed weights) or a pass follows (unpacked, grouped), at 1 and 2 threads.
TEST(OpFusion, ConvThenReluIsOneOpWithTheSameBits) {
  const Tensor x = random_f32({3, 6, 9, 9}, 33);
  for (int64_t group : {1, 2}) {
    const Graph g = conv_relu_graph(group);
    Graph fused = g;
    EXPECT_EQ(fuse_float_ops(fused).conv_relu, 1);
    ASSERT_EQ(fused.nodes.size(), 1u);
    EXPECT_EQ(fused.nodes[0].op_type, "ConvRelu");
    EXPECT_EQ(fused.nodes[0].outputs, std::vector<std::string>{"y"});
    for (bool pack : {true, false}) {
      const auto want = bits_of(run_graph(g, x, false, 1, pack));
      size_t zeros = 0;
      for (uint32_t b : want) zeros += b == 0;
      ASSERT_GT(zeros, want.size() / 4) << "the Relu must clip part of the output";
      for (int threads : {1, 2}) {
        EXPECT_EQ(bits_of(run_graph(g, x, true, threads, pack)), want)
            << "group " << group << ", pack " << pack << ", " << threads << " threads";
      }
    }
  }
}

TEST(OpFusion, ConvReadElsewhereKeepsItsRelu) {
  {  // the convolution is a graph output too
    Graph g = conv_relu_graph(1);
    g.outputs.push_back({.name = "c"});
    EXPECT_EQ(fuse_float_ops(g).conv_relu, 0);
  }
  {  // another node reads it
    Graph g = conv_relu_graph(1);
    g.nodes.push_back(node("Neg", {"c"}, "n"));
    g.outputs.push_back({.name = "n"});
    EXPECT_EQ(fuse_float_ops(g).conv_relu, 0);
  }
  {  // the Relu reads another value
    Graph g = conv_relu_graph(1);
    g.nodes[1].inputs = {"x"};
    g.nodes.push_back(node("Neg", {"c"}, "n"));
    g.outputs.push_back({.name = "n"});
    EXPECT_EQ(fuse_float_ops(g).conv_relu, 0);
  }
}

namespace {

// x [4, 5, 7, 7] -> Conv(w[, b]; pads 1) -> c -> BatchNormalization -> n -> Relu -> y.
Graph conv_bn_graph(bool conv_bias) {
  Graph g = base_graph();
  g.set_initializer("w", random_f32({6, 5, 3, 3}, 41));
  g.set_initializer("b", random_f32({6}, 42));
  g.set_initializer("scale", random_f32({6}, 43, 0.5f, 2.0f));
  g.set_initializer("shift", random_f32({6}, 44));
  g.set_initializer("mean", random_f32({6}, 45));
  g.set_initializer("var", random_f32({6}, 46, 0.1f, 3.0f));
  Node conv = node("Conv", conv_bias ? std::vector<std::string>{"x", "w", "b"}
                                     : std::vector<std::string>{"x", "w"}, "c");
  conv.attributes = {attr_ints("pads", {1, 1, 1, 1})};
  g.nodes.push_back(std::move(conv));
  Node bn = node("BatchNormalization", {"c", "scale", "shift", "mean", "var"}, "n");
  bn.attributes = {attr_float("epsilon", 1e-3f)};
  g.nodes.push_back(std::move(bn));
  g.nodes.push_back(node("Relu", {"n"}, "y"));
  g.outputs.push_back({.name = "y"});
  return g;
}

}  // namespace

// Conv -> BatchNormalization -> Relu: the normalization folded into the convolution's weights
// and bias, then one ConvRelu; the output within float rounding of the three ops.
TEST(OpFusion, BatchNormalizationFoldsIntoItsConv) {
  const Tensor x = random_f32({4, 5, 7, 7}, 47);
  for (bool conv_bias : {true, false}) {
    const Graph g = conv_bn_graph(conv_bias);
    Graph fused = g;
    const FusedOps f = fuse_float_ops(fused);
    EXPECT_EQ(f.conv_batch_norm, 1);
    EXPECT_EQ(f.conv_relu, 1);
    ASSERT_EQ(fused.nodes.size(), 1u);
    EXPECT_EQ(fused.nodes[0].op_type, "ConvRelu");
    ASSERT_EQ(fused.nodes[0].inputs.size(), 3u);
    EXPECT_NE(fused.nodes[0].inputs[1], "w");  // new weights; the original stays as it was
    EXPECT_TRUE(fused.find_initializer("w")->equals(*g.find_initializer("w")));
    const auto want = run_graph(g, x, false);
    float top = 0.0f;
    for (float v : want) top = std::max(top, std::fabs(v));
    for (int threads : {1, 2}) {
      const auto got = run_graph(g, x, true, threads);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_NEAR(got[i], want[i], 2e-6f * top) << "conv bias " << conv_bias << " at " << i;
      }
    }
  }
}

TEST(OpFusion, BatchNormalizationStaysWhereItsParametersOrTheConvAreNotFixed) {
  {  // a parameter is a graph input a feed may replace
    Graph g = conv_bn_graph(true);
    g.inputs.push_back({.name = "mean", .dtype = DType::F32});
    EXPECT_EQ(fuse_float_ops(g).conv_batch_norm, 0);
  }
  {  // the convolution is read elsewhere too
    Graph g = conv_bn_graph(true);
    g.outputs.push_back({.name = "c"});
    EXPECT_EQ(fuse_float_ops(g).conv_batch_norm, 0);
  }
  {  // the weights are fed
    Graph g = conv_bn_graph(false);
    g.inputs.push_back({.name = "w", .dtype = DType::F32});
    EXPECT_EQ(fuse_float_ops(g).conv_batch_norm, 0);
  }
  {  // parameters of another length than the output channels
    Graph g = conv_bn_graph(true);
    g.set_initializer("var", random_f32({1}, 48, 0.1f, 3.0f));
    EXPECT_EQ(fuse_float_ops(g).conv_batch_norm, 0);
  }
}

namespace {

// x -> Add(x, v) -> s -> Relu -> y, both inputs of `dtype` (v broadcast along the rows).
Graph add_relu_graph(DType dtype) {
  Graph g = base_graph();
  g.inputs[0].dtype = dtype;
  g.inputs.push_back({.name = "v", .dtype = dtype});
  g.nodes.push_back(node("Add", {"x", "v"}, "s"));
  g.nodes.push_back(node("Relu", {"s"}, "y"));
  g.outputs.push_back({.name = "y"});
  return g;
}

template <typename T>
std::vector<T> run_add_relu(const Graph& g, const Tensor& x, const Tensor& v, bool fuse,
                            int threads = 1, HalfCompute mode = HalfCompute::Auto) {
  const Executor ex(g, {.threads = threads, .half_compute = mode, .fuse_ops = fuse});
  return values<T>(ex.run({{"x", x}, {"v", v}}).at(0));
}

}  // namespace

// Add -> Relu (a residual connection): one AddRelu with the two ops' bits, in f32, f16 (per op
// and as ONNX Runtime computes halves) and int8, whose sums wrap before the Relu sees them.
TEST(OpFusion, AddThenReluIsOnePassWithTheSameBits) {
  {
    const Graph g = add_relu_graph(DType::F32);
    Graph fused = g;
    EXPECT_EQ(fuse_float_ops(fused).add_relu, 1);
    ASSERT_EQ(fused.nodes.size(), 1u);
    EXPECT_EQ(fused.nodes[0].op_type, "AddRelu");
    const Tensor x = random_f32({7, 300}, 51), v = random_f32({300}, 52);
    const auto want = bits_of(run_add_relu<float>(g, x, v, false));
    size_t zeros = 0;
    for (uint32_t b : want) zeros += b == 0;
    ASSERT_GT(zeros, want.size() / 4);
    for (int threads : {1, 2}) {
      EXPECT_EQ(bits_of(run_add_relu<float>(g, x, v, true, threads)), want);
    }
  }
  {
    const Graph g = add_relu_graph(DType::F16);
    const Tensor x = ops::from_f32(random_f32({5, 77}, 53, -3.0f, 3.0f), DType::F16);
    const Tensor v = ops::from_f32(random_f32({77}, 54, -3.0f, 3.0f), DType::F16);
    for (HalfCompute mode : {HalfCompute::PerOp, HalfCompute::Ort}) {
      EXPECT_EQ(run_add_relu<uint16_t>(g, x, v, true, 1, mode),
                run_add_relu<uint16_t>(g, x, v, false, 1, mode));
    }
  }
  {
    const Graph g = add_relu_graph(DType::I8);
    Tensor x(DType::I8, {6}), v(DType::I8, {6});
    const std::vector<int8_t> xs = {100, -100, 5, -5, 127, 0}, vs = {100, -100, -6, 6, 1, 0};
    std::copy(xs.begin(), xs.end(), x.mutable_data<int8_t>().begin());
    std::copy(vs.begin(), vs.end(), v.mutable_data<int8_t>().begin());
    // 200 wraps to -56 and -200 to 56 before the Relu; 127 + 1 to -128.
    const std::vector<int8_t> want = {0, 56, 0, 1, 0, 0};
    EXPECT_EQ(run_add_relu<int8_t>(g, x, v, false), want);
    EXPECT_EQ(run_add_relu<int8_t>(g, x, v, true), want);
  }
  {  // the sum is read elsewhere too
    Graph g = add_relu_graph(DType::F32);
    g.outputs.push_back({.name = "s"});
    EXPECT_EQ(fuse_float_ops(g).add_relu, 0);
  }
}

namespace {

// x -> Conv(w[, b], attrs) -> c; Add(c, z) (or Add(z, c)) -> s -> Relu -> y: a residual
// connection, z a second graph input.
Graph conv_add_relu_graph(const Shape& w_shape, bool bias, std::vector<Attribute> attrs,
                          bool conv_first) {
  Graph g = base_graph();
  g.inputs.push_back({.name = "z", .dtype = DType::F32});
  g.set_initializer("w", random_f32(w_shape, 71));
  std::vector<std::string> ins = {"x", "w"};
  if (bias) {
    g.set_initializer("b", random_f32({w_shape[0]}, 72));
    ins.push_back("b");
  }
  Node conv = node("Conv", ins, "c");
  conv.attributes = std::move(attrs);
  g.nodes.push_back(std::move(conv));
  g.nodes.push_back(node("Add", conv_first ? std::vector<std::string>{"c", "z"}
                                           : std::vector<std::string>{"z", "c"}, "s"));
  g.nodes.push_back(node("Relu", {"s"}, "y"));
  g.outputs.push_back({.name = "y"});
  return g;
}

std::vector<uint32_t> run_residual(const Graph& g, const Tensor& x, const Tensor& z, bool fuse,
                                   int threads, bool pack) {
  const Executor ex(g, {.threads = threads, .pack_weights = pack, .fuse_ops = fuse});
  return bits_of(values<float>(ex.run({{"x", x}, {"z", z}}).at(0)));
}

}  // namespace

// Conv -> Add -> Relu (a residual connection): one ConvAddRelu with the three ops' bits, the
// packed kernel adding z to its finished sums (a stride-1 window read in place, a 1 x 1 window
// of small planes whose images share a product, a strided window's packed columns, a large
// plane, a 1 x 1 window's planes read in place), and AddRelu after the convolution where z broadcasts or the weights are not packed
// (grouped, or packing off); both kernels, 1 and 2 threads, the conv on either side of the Add.
TEST(OpFusion, ConvThenAddThenReluIsOneOpWithTheSameBits) {
  struct Case {
    Shape x, w;
    bool bias;
    std::vector<Attribute> attrs;
    Shape z;  // empty: the output's shape
  };
  const auto pads = [](int64_t p) { return attr_ints("pads", {p, p, p, p}); };
  const std::vector<Case> cases = {
      {{3, 6, 9, 9}, {8, 6, 3, 3}, true, {pads(1)}, {}},
      {{5, 16, 7, 7}, {24, 16, 1, 1}, false, {}, {}},
      {{2, 4, 10, 10}, {7, 4, 3, 3}, true, {pads(1), attr_ints("strides", {2, 2})}, {}},
      {{2, 3, 40, 36}, {9, 3, 1, 1}, true, {}, {}},
      {{3, 6, 9, 9}, {8, 3, 3, 3}, true, {pads(1), attr_int("group", 2)}, {}},
      {{3, 6, 9, 9}, {8, 6, 3, 3}, true, {pads(1)}, {1, 8, 1, 1}},
      // a 1 x 1 window of 128 channels on planes of whole panels: each image's planes read
      // in place
      {{2, 128, 4, 8}, {20, 128, 1, 1}, true, {}, {}},
  };
  uint32_t seed = 700;
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const Case& c = cases[ci];
    const Tensor x = random_f32(c.x, seed++);
    for (const bool conv_first : {true, false}) {
      const Graph g = conv_add_relu_graph(c.w, c.bias, c.attrs, conv_first);
      Graph fused = g;
      const FusedOps f = fuse_float_ops(fused);
      EXPECT_EQ(f.add_relu, 1);
      EXPECT_EQ(f.conv_add_relu, 1);
      ASSERT_EQ(fused.nodes.size(), 1u);
      EXPECT_EQ(fused.nodes[0].op_type, "ConvAddRelu");
      EXPECT_EQ(fused.nodes[0].outputs, std::vector<std::string>{"y"});
      // The output's shape (the unfused graph's, with a z that broadcasts), for z.
      const Shape out = Executor(g, {.fuse_ops = false})
                            .run({{"x", x}, {"z", f32({1}, {0.0f})}})
                            .at(0)
                            .shape();
      const Tensor z = random_f32(c.z.empty() ? out : c.z, seed++);
      for (const bool pack : {true, false}) {
        const auto want = run_residual(g, x, z, false, 1, pack);
        size_t zeros = 0;
        for (uint32_t b : want) zeros += b == 0;
        ASSERT_GT(zeros, want.size() / 5) << "the Relu must clip part of the output";
        for (const bool avx2 : {false, true}) {
          packed_gemm_use_avx2_only(avx2);
          for (const int threads : {1, 2}) {
            EXPECT_EQ(run_residual(g, x, z, true, threads, pack), want)
                << "case " << ci << ", conv first " << conv_first << ", pack " << pack
                << ", avx2 " << avx2 << ", " << threads << " threads";
          }
        }
        packed_gemm_use_avx2_only(false);
      }
    }
  }
  {  // the convolution is read elsewhere too: the Add and Relu fuse, the Conv stays
    Graph g = conv_add_relu_graph({8, 6, 3, 3}, true, {pads(1)}, true);
    g.outputs.push_back({.name = "c"});
    const FusedOps f = fuse_float_ops(g);
    EXPECT_EQ(f.add_relu, 1);
    EXPECT_EQ(f.conv_add_relu, 0);
  }
  {  // both operands are the convolution
    Graph g = conv_add_relu_graph({8, 6, 3, 3}, true, {pads(1)}, true);
    g.nodes[1].inputs = {"c", "c"};
    EXPECT_EQ(fuse_float_ops(g).conv_add_relu, 0);
  }
}

// A ConvAddRelu whose residual z is an op's output that nothing reads afterwards writes its
// output over z where the product reads each element of z just before it stores that element of
// the output (the panel product in one pass, the lane product at any depth): the same bits as
// the three ops, in z's storage (seen through the observer, which keeps no copy). Where z is a
// graph output, is read again later, or the panel product takes several passes (depth over
// 160 where the CPU has AVX-512, over 1024 where it does not), the output gets its own storage
// and z keeps its values.
TEST(OpFusion, ConvAddReluWritesOverAResidualNothingElseReads) {
  if (!packed_gemm_supported()) GTEST_SKIP() << "this CPU lacks AVX2/FMA, the packed kernel's";
  struct Case {
    Shape w;
    int64_t pad;
    bool z_output, z_read_later, in_place;
    int64_t width = 8;  // of the 6-row planes
  };
  const std::vector<Case> cases = {
      {{16, 8, 1, 1}, 0, false, false, true},   // depth 8
      {{16, 8, 3, 3}, 1, false, false, true},   // depth 72
      // Depth 180: on the lane product where it runs (a 3x3 window; a 1x1 window on planes of
      // up to 256 positions where it runs the AVX-512 kernel); on the panels in two passes
      // where the CPU has AVX-512 (passes of up to 160), in one where it does not.
      {{16, 20, 3, 3}, 1, false, false, lane_gemm_supported() || gemm_prepacked_one_pass(180)},
      {{16, 180, 1, 1}, 0, false, false,
       (lane_gemm_supported() && packed_gemm_avx512()) || gemm_prepacked_one_pass(180)},
      {{16, 180, 1, 1}, 0, false, false, gemm_prepacked_one_pass(180), 48},  // 288 positions
      {{16, 8, 1, 1}, 0, true, false, false},
      {{16, 8, 1, 1}, 0, false, true, false},
  };
  uint32_t seed = 800;
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const Case& c = cases[ci];
    Graph g = base_graph();
    g.inputs.push_back({.name = "r", .dtype = DType::F32});
    g.set_initializer("w", random_f32(c.w, seed++));
    g.set_initializer("b", random_f32({c.w[0]}, seed++));
    g.nodes.push_back(node("Relu", {"r"}, "z"));
    Node conv = node("Conv", {"x", "w", "b"}, "c");
    conv.attributes = {attr_ints("pads", {c.pad, c.pad, c.pad, c.pad})};
    g.nodes.push_back(std::move(conv));
    g.nodes.push_back(node("Add", {"c", "z"}, "s"));
    g.nodes.push_back(node("Relu", {"s"}, "y"));
    g.outputs.push_back({.name = "y"});
    if (c.z_output) g.outputs.push_back({.name = "z"});
    if (c.z_read_later) {
      g.nodes.push_back(node("Mul", {"y", "z"}, "m"));
      g.outputs.push_back({.name = "m"});
    }
    const Tensor x = random_f32({2, c.w[1], 6, c.width}, seed++);
    const Tensor r = random_f32({2, c.w[0], 6, c.width}, seed++);
    const std::vector<std::pair<std::string, Tensor>> feeds = {{"x", x}, {"r", r}};
    const std::vector<Tensor> want = Executor(g, {.fuse_ops = false}).run(feeds);
    for (const int threads : {1, 2}) {
      Executor ex(g, {.threads = threads});
      const std::byte* z_at = nullptr;
      const std::byte* y_at = nullptr;
      ex.set_observer([&](const std::string& name, const Tensor& t) {
        if (name == "z") z_at = t.bytes().data();
        if (name == "y") y_at = t.bytes().data();
      });
      const std::vector<Tensor> got = ex.run(feeds);
      const std::string what = "case " + std::to_string(ci) + ", " + std::to_string(threads) +
                               " threads";
      ASSERT_EQ(got.size(), want.size()) << what;
      for (size_t o = 0; o < got.size(); ++o) {
        EXPECT_EQ(bits_of(values<float>(got[o])), bits_of(values<float>(want[o])))
            << what << ", output " << o;
      }
      ASSERT_NE(z_at, nullptr) << what;
      EXPECT_EQ(z_at == y_at, c.in_place) << what;
    }
  }
}

// FusionOptions::exact (calibration's): the fused graph, run unpacked and unfused by the
// executor, computes the unfused graph's bits; what rounds otherwise is left as it was.
TEST(OpFusion, ExactFusionsGiveTheUnfusedBits) {
  const FusionOptions exact{.exact = true};
  std::vector<float> xs;
  for (int i = -400; i <= 400; ++i) xs.push_back(static_cast<float>(i) / 50.0f);
  const std::vector<float> wide = values<float>(random_f32({4001}, 61, -30.0f, 30.0f));
  xs.insert(xs.end(), wide.begin(), wide.end());
  const Tensor x = f32({static_cast<int64_t>(xs.size())}, xs);
  for (bool div : {true, false}) {
    for (bool half_first : {true, false}) {
      SCOPED_TRACE(std::string(div ? "div" : "mul") + (half_first ? ", half first" : ""));
      const Graph g = gelu_graph(div, half_first);
      Graph fused = g;
      EXPECT_EQ(fuse_float_ops(fused, exact).gelu, 1);
      ASSERT_EQ(fused.nodes.size(), 1u);
      EXPECT_EQ(fused.nodes[0].op_type, "GeluChain");
      const std::vector<float> want = run_graph(g, x, false, 1, false);
      for (int threads : {1, 3}) EXPECT_EQ(run_graph(fused, x, false, threads, false), want);
      // The erf read outside too (a graph output here, an observer's value in calibration):
      // the fused op's second output, with the Erf's bits.
      Graph with_erf = g;
      with_erf.outputs.push_back({.name = "e"});
      Graph fused_erf = with_erf;
      EXPECT_EQ(fuse_float_ops(fused_erf, exact).gelu, 1);
      ASSERT_EQ(fused_erf.nodes.size(), 1u);
      const auto run_both = [&](const Graph& graph, int threads) {
        const Executor ex(graph, {.threads = threads, .pack_weights = false, .fuse_ops = false});
        const std::vector<Tensor> out = ex.run({{"x", x}});
        return std::make_pair(values<float>(out.at(0)), values<float>(out.at(1)));
      };
      const auto unfused = run_both(with_erf, 1);
      EXPECT_EQ(unfused.first, want);
      for (int threads : {1, 3}) EXPECT_EQ(run_both(fused_erf, threads), unfused) << threads;
    }
  }
  {  // MatMul + bias: summed, then the bias added, as the Add does, on a packed weight too
    const Graph g = matmul_bias_graph(37, 21);
    Graph fused = g;
    EXPECT_EQ(fuse_float_ops(fused, exact).matmul_bias, 1);
    const Tensor a = random_f32({2, 3, 37}, 62);
    for (const bool pack : {false, true}) {
      EXPECT_EQ(run_graph(fused, a, false, 2, pack), run_graph(g, a, false, 2, pack)) << pack;
    }
  }
  Graph rms = rms_norm_graph(false, false, true);
  const size_t rms_nodes = rms.nodes.size();
  EXPECT_EQ(fuse_float_ops(rms, exact).rms_norm, 0);
  EXPECT_EQ(rms.nodes.size(), rms_nodes) << "RMSNorm sums its squares in another order";
  Graph bn = conv_bn_graph(true);
  const FusedOps f = fuse_float_ops(bn, exact);
  EXPECT_EQ(f.conv_batch_norm, 0) << "folding rounds the weights";
  EXPECT_EQ(f.conv_relu, 0) << "the Relu reads the normalization, not the Conv";
}

// FusionOptions::keep: a value an observer reads stays computed, whatever fusion it is inside.
TEST(OpFusion, KeptValuesStayOutsideEveryFusion) {
  for (const std::string kept : {"s", "p"}) {
    const std::unordered_set<std::string> keep{kept};
    Graph g = gelu_graph(true, false);
    EXPECT_EQ(fuse_float_ops(g, {.exact = true, .keep = &keep}).gelu, 0) << kept;
    EXPECT_EQ(g.nodes.size(), 5u) << kept;
  }
  {  // the erf: the exact GeluChain gives it as a second output; the approximate Gelu cannot
    const std::unordered_set<std::string> keep{"e"};
    Graph g = gelu_graph(true, false);
    EXPECT_EQ(fuse_float_ops(g, {.keep = &keep}).gelu, 0);
    EXPECT_EQ(g.nodes.size(), 5u);
    EXPECT_EQ(fuse_float_ops(g, {.exact = true, .keep = &keep}).gelu, 1);
    ASSERT_EQ(g.nodes.size(), 1u);
    EXPECT_EQ(g.nodes[0].outputs, (std::vector<std::string>{"y", "e"}));
  }
  const std::unordered_set<std::string> output_only{"y", "x"};
  Graph gelu = gelu_graph(true, true);
  EXPECT_EQ(fuse_float_ops(gelu, {.exact = true, .keep = &output_only}).gelu, 1)
      << "the GELU's input and output are outside it";
  const std::unordered_set<std::string> mm{"mm"};
  Graph g = matmul_bias_graph(8, 4);
  EXPECT_EQ(fuse_float_ops(g, {.keep = &mm}).matmul_bias, 0);
  EXPECT_EQ(g.nodes.size(), 2u);
}

namespace {

// x -> (Mul or Div by c, or nothing) -> (Add with `bias`, or nothing) -> Softmax -> y, at
// opset `opset`; the bias is a graph input b, and the Add reads it first when `bias_first`.
Graph softmax_graph(const std::string& scale_op, bool add, bool bias_first, int64_t axis = -1,
                    int64_t opset = 17) {
  Graph g = base_graph();
  g.set_opset("", opset);
  std::string v = "x";
  if (!scale_op.empty()) {
    g.set_initializer("c", f32({}, {scale_op == "Div" ? 2.8284271f : 0.35355339f}));
    g.nodes.push_back(node(scale_op, {v, "c"}, "scaled"));
    v = "scaled";
  }
  if (add) {
    g.inputs.push_back({.name = "b", .dtype = DType::F32});
    g.nodes.push_back(node("Add", bias_first ? std::vector<std::string>{"b", v}
                                             : std::vector<std::string>{v, "b"},
                           "masked"));
    v = "masked";
  }
  g.nodes.push_back(node("Softmax", {v}, "y"));
  g.nodes.back().attributes.push_back(attr_int("axis", axis));
  g.outputs.push_back({.name = "y"});
  return g;
}

std::vector<float> run_softmax_graph(const Graph& g, const Tensor& x, const Tensor& b, bool fuse,
                                     int threads) {
  const Executor ex(g, {.threads = threads, .fuse_ops = fuse});
  std::vector<std::pair<std::string, Tensor>> feeds{{"x", x}};
  if (g.inputs.size() > 1) feeds.emplace_back("b", b);
  return values<float>(ex.run(feeds).at(0));
}

}  // namespace

// Attention's scaled, masked scores: the scale, the bias and the Softmax in one pass per row,
// with the three ops' bits, for every form the fusion takes; what it does not take stays.
TEST(OpFusion, ScaledMaskedSoftmaxIsOnePassPerRowWithTheSameBits) {
  const Tensor x = random_f32({2, 3, 5, 37}, 71, -20.0f, 20.0f);
  std::vector<float> mask = values<float>(random_f32({2, 1, 5, 37}, 72, -3.0f, 3.0f));
  for (size_t i = 0; i < mask.size(); i += 7) mask[i] = std::numeric_limits<float>::lowest();
  for (size_t i = 37; i < 74; ++i) mask[i] = -std::numeric_limits<float>::infinity();  // a row
  const Tensor b = f32({2, 1, 5, 37}, mask);
  const Tensor per_row = random_f32({2, 3, 5, 1}, 73, -2.0f, 2.0f);  // one bias per row
  const Tensor wider = random_f32({4, 2, 3, 5, 37}, 74);  // broadcasts x to more rows
  struct Case {
    std::string scale;
    bool add, bias_first;
    const Tensor* bias;
  };
  const Case cases[] = {{"Div", true, false, &b},     {"Mul", true, true, &b},
                        {"", true, false, &b},        {"Mul", false, false, nullptr},
                        {"Div", true, false, &per_row}, {"Mul", true, true, &wider}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.scale + (c.add ? " + bias" : "") + (c.bias_first ? " first" : "") +
                 (c.bias != nullptr ? " " + shape_to_string(c.bias->shape()) : ""));
    const Graph g = softmax_graph(c.scale, c.add, c.bias_first);
    for (const bool exact : {false, true}) {
      Graph fused = g;
      EXPECT_EQ(fuse_float_ops(fused, {.exact = exact}).softmax, 1);
      ASSERT_EQ(fused.nodes.size(), 1u);
      EXPECT_EQ(fused.nodes[0].op_type, "ScaleAddSoftmax");
    }
    const Tensor& bias = c.bias != nullptr ? *c.bias : b;
    const std::vector<float> want = run_softmax_graph(g, x, bias, false, 1);
    for (int threads : {1, 3}) {
      const std::vector<float> got = run_softmax_graph(g, x, bias, true, threads);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
            << "element " << i << ", " << threads << " thread(s)";
      }
    }
  }
  // Left alone: a Softmax alone, another axis, opset 12's coerced 2-D Softmax, a kept value.
  Graph alone = softmax_graph("", false, false);
  EXPECT_EQ(fuse_float_ops(alone).softmax, 0);
  Graph axis = softmax_graph("Div", true, false, 3);
  EXPECT_EQ(fuse_float_ops(axis).softmax, 0);
  Graph old = softmax_graph("Div", true, false, -1, 12);
  EXPECT_EQ(fuse_float_ops(old).softmax, 0);
  const std::unordered_set<std::string> keep{"masked"};
  Graph kept = softmax_graph("Div", true, false);
  EXPECT_EQ(fuse_float_ops(kept, {.exact = true, .keep = &keep}).softmax, 0);
  const std::unordered_set<std::string> keep_scaled{"scaled"};
  Graph partly = softmax_graph("Div", true, false);
  EXPECT_EQ(fuse_float_ops(partly, {.exact = true, .keep = &keep_scaled}).softmax, 1);
  ASSERT_EQ(partly.nodes.size(), 2u) << "the Div stays; the Add and Softmax fuse";
}

namespace {

// Attention as exporters write it: scores = q @ K' (K' a computed [.., K, N], or the keys
// [.., N, K] through a Transpose of their last two dims), then Div by a constant, Add of the
// mask input `b`, Softmax, and the product with v. `scale_op` "" and no bias: a plain Softmax.
struct AttentionShapes {
  Shape q, keys, v, bias;
  bool transposed = true;  // keys given as rows [.., N, K]
  std::string scale_op = "Div";
  // The probabilities through Where(IsNaN(p), 0, p) before the product, as transformers' exports
  // write it; the mask then also hides every key of the first batch element's rows (NaN rows).
  bool nan_guard = false;
};

Graph attention_graph(const AttentionShapes& s) {
  Graph g = base_graph();
  g.inputs[0].name = "q";
  g.inputs.push_back({.name = "k", .dtype = DType::F32});
  g.inputs.push_back({.name = "v", .dtype = DType::F32});
  std::string keys = "k";
  if (s.transposed) {
    std::vector<int64_t> perm(s.keys.size());
    for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int64_t>(i);
    std::swap(perm[perm.size() - 1], perm[perm.size() - 2]);
    g.nodes.push_back(node("Transpose", {"k"}, "kt"));
    g.nodes.back().attributes.push_back(attr_ints("perm", perm));
    keys = "kt";
  }
  g.nodes.push_back(node("MatMul", {"q", keys}, "scores"));
  std::string v = "scores";
  if (!s.scale_op.empty()) {
    g.set_initializer("c", f32({}, {s.scale_op == "Div" ? 2.8284271f : 0.35355339f}));
    g.nodes.push_back(node(s.scale_op, {v, "c"}, "scaled"));
    v = "scaled";
  }
  if (!s.bias.empty()) {
    g.inputs.push_back({.name = "b", .dtype = DType::F32});
    g.nodes.push_back(node("Add", {v, "b"}, "masked"));
    v = "masked";
  }
  g.nodes.push_back(node("Softmax", {v}, "probs"));
  g.nodes.back().attributes.push_back(attr_int("axis", -1));
  std::string probs = "probs";
  if (s.nan_guard) {
    g.set_initializer("zero", f32({}, {0.0f}));
    g.nodes.push_back(node("IsNaN", {"probs"}, "nan"));
    g.nodes.push_back(node("Where", {"nan", "zero", "probs"}, "guarded"));
    probs = "guarded";
  }
  g.nodes.push_back(node("MatMul", {probs, "v"}, "y"));
  g.outputs.push_back({.name = "y"});
  return g;
}

std::vector<std::pair<std::string, Tensor>> attention_feeds(const AttentionShapes& s) {
  std::vector<std::pair<std::string, Tensor>> feeds{{"q", random_f32(s.q, 81, -2.0f, 2.0f)},
                                                    {"k", random_f32(s.keys, 82, -2.0f, 2.0f)},
                                                    {"v", random_f32(s.v, 83)}};
  if (!s.bias.empty()) {
    std::vector<float> mask = values<float>(random_f32(s.bias, 84, -3.0f, 3.0f));
    for (size_t i = 0; i < mask.size(); i += 5) mask[i] = -std::numeric_limits<float>::infinity();
    if (s.nan_guard) {  // the first batch element's rows: every key masked, a NaN softmax
      const size_t first = mask.size() / static_cast<size_t>(s.bias[0]);
      std::fill_n(mask.begin(), first, -std::numeric_limits<float>::infinity());
    }
    feeds.emplace_back("b", f32(s.bias, mask));
  }
  return feeds;
}

}  // namespace

// Attention's two products and the softmax between them as one op: the unfused graph's bits
// for every form it takes (keys transposed or not, grouped-query heads broadcast, a causal or
// padding mask, several blocks of query rows and a short last one), at 1 and 3 threads; the
// forms its blocked kernel does not take run the ops one after another, with the same bits.
TEST(OpFusion, AttentionIsOneOpWithTheUnfusedBits) {
  const AttentionShapes cases[] = {
      // MiniLM's: [batch, heads, tokens, 32], a padding mask per sequence.
      {.q = {2, 3, 16, 32}, .keys = {2, 3, 16, 32}, .v = {2, 3, 16, 32}, .bias = {2, 1, 1, 16}},
      // K' computed as it is, a Mul for the scale.
      {.q = {2, 3, 7, 8}, .keys = {2, 3, 8, 19}, .v = {2, 3, 19, 5}, .bias = {2, 1, 7, 19},
       .transposed = false, .scale_op = "Mul"},
      // Grouped-query heads: 2 key/value heads, 3 query heads each; a causal [M, N] mask;
      // 2100 keys make blocks of 15 query rows, the last one short.
      {.q = {1, 2, 3, 40, 8}, .keys = {1, 2, 1, 2100, 8}, .v = {1, 2, 1, 2100, 6},
       .bias = {40, 2100}},
      // A plain Softmax.
      {.q = {3, 5, 4}, .keys = {3, 9, 4}, .v = {3, 9, 7}, .bias = {}, .scale_op = ""},
      // V broadcast over more batch dims than the scores have: the ops one after another.
      {.q = {3, 5, 4}, .keys = {3, 9, 4}, .v = {2, 3, 9, 7}, .bias = {3, 5, 9}},
      // MiniLM's export: a NaN guard after the softmax, rows of it NaN; and on the unfused path.
      {.q = {2, 3, 16, 32}, .keys = {2, 3, 16, 32}, .v = {2, 3, 16, 32}, .bias = {2, 1, 1, 16},
       .nan_guard = true},
      {.q = {3, 5, 4}, .keys = {3, 9, 4}, .v = {2, 3, 9, 7}, .bias = {3, 5, 9}, .nan_guard = true},
  };
  for (const AttentionShapes& s : cases) {
    SCOPED_TRACE("q " + shape_to_string(s.q) + " keys " + shape_to_string(s.keys) + " v " +
                 shape_to_string(s.v));
    const Graph g = attention_graph(s);
    for (const bool exact : {false, true}) {
      Graph fused = g;
      EXPECT_EQ(fuse_float_ops(fused, {.exact = exact}).attention, 1);
      ASSERT_EQ(fused.nodes.size(), 1u)
          << "the Transpose, products, softmax and NaN guard are one node";
      EXPECT_EQ(fused.nodes[0].op_type, "Attention");
    }
    const auto feeds = attention_feeds(s);
    const std::vector<float> want =
        values<float>(Executor(g, {.threads = 1, .fuse_ops = false}).run(feeds).at(0));
    for (int threads : {1, 3}) {
      const std::vector<float> got =
          values<float>(Executor(g, {.threads = threads}).run(feeds).at(0));
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
            << "element " << i << ", " << threads << " thread(s)";
      }
    }
  }
}

// What the attention fusion leaves: scores or probabilities read elsewhere (a kept value, a
// second reader), constant K' or values, a Softmax over another axis, an executor that runs
// its products on a GPU; a Transpose of other dims stays in front of the fused op.
TEST(OpFusion, AttentionLeavesWhatOthersReadAndConstantOperands) {
  const AttentionShapes s{.q = {2, 3, 4}, .keys = {2, 5, 4}, .v = {2, 5, 6}, .bias = {2, 3, 5}};
  for (const char* kept : {"scores", "masked", "probs"}) {
    const std::unordered_set<std::string> keep{kept};
    Graph g = attention_graph(s);
    EXPECT_EQ(fuse_float_ops(g, {.exact = true, .keep = &keep}).attention, 0) << kept;
  }
  Graph twice = attention_graph(s);
  twice.outputs.push_back({.name = "probs"});
  EXPECT_EQ(fuse_float_ops(twice).attention, 0);
  // (Keys through a Transpose are computed values: the Transpose runs on every call.)
  AttentionShapes direct = s;
  direct.keys = {2, 4, 5};
  direct.transposed = false;
  for (const char* name : {"k", "v"}) {
    Graph constant = attention_graph(direct);
    constant.set_initializer(name,
                             random_f32(std::string(name) == "k" ? direct.keys : direct.v, 85));
    std::erase_if(constant.inputs, [&](const ValueInfo& v) { return v.name == name; });
    EXPECT_EQ(fuse_float_ops(constant).attention, 0) << name;
  }
  Graph axis = attention_graph(s);
  for (Node& n : axis.nodes) {
    if (n.op_type == "Softmax") n.attributes = {attr_int("axis", 1)};
  }
  EXPECT_EQ(fuse_float_ops(axis).attention, 0);
  Graph gpu = attention_graph(s);
  EXPECT_EQ(fuse_float_ops(gpu, {.attention = false}).attention, 0);
  // A NaN guard whose probabilities or NaN mask something else reads, or whose value is not a
  // constant f32 scalar: nothing fuses.
  AttentionShapes guarded = s;
  guarded.nan_guard = true;
  for (const char* also : {"probs", "nan"}) {
    Graph g = attention_graph(guarded);
    g.outputs.push_back({.name = also});
    EXPECT_EQ(fuse_float_ops(g).attention, 0) << also;
  }
  Graph vector_zero = attention_graph(guarded);
  vector_zero.set_initializer("zero", f32({2}, {0.0f, 0.0f}));
  EXPECT_EQ(fuse_float_ops(vector_zero).attention, 0);
  // perm [1, 0, 2] is not a swap of the last two dims: the Transpose stays, the rest fuses.
  Graph other = attention_graph(s);
  other.nodes[0].attributes = {attr_ints("perm", {1, 0, 2})};
  EXPECT_EQ(fuse_float_ops(other).attention, 1);
  ASSERT_EQ(other.nodes.size(), 2u);
  EXPECT_EQ(other.nodes[0].op_type, "Transpose");
}
