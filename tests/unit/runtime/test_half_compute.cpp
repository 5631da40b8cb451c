// Executor HalfCompute policies on fp16 graphs: PerOp rounds every op's output to fp16 (a GPU
// fp16 kernel), Ort keeps values in f32 between ops that ONNX Runtime's CPU provider computes
// in f32 and rounds only where ORT does (graph outputs, inputs of its fp16 kernels, Casts).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "cli/option_parsers.h"
#include "ir/half.h"
#include "kernels/int4.h"
#include "runtime/int4_fusion.h"
#include "runtime/op_utils.h"
#include "tests/unit/runtime/runtime_test_util.h"

using namespace qforge;
using namespace qforge::rt_test;

namespace {

Tensor to_half(const Tensor& t) { return Tensor::from_f32(t.to_f32(), t.shape(), DType::F16); }

Node node(std::string op, std::vector<std::string> in, std::vector<std::string> out,
          std::vector<Attribute> attrs = {}) {
  Node n;
  n.op_type = std::move(op);
  n.name = out.at(0);
  n.inputs = std::move(in);
  n.outputs = std::move(out);
  n.attributes = std::move(attrs);
  return n;
}

// x -> Mul(x, a) -> Add(., b) -> Tanh -> Mul(., a) -> Sigmoid -> y, in `dtype` (f16 or f32),
// with `middle` between Add and Tanh when given (LayerNormalization -> Identity, or Identity). The
// constants are fp16-exact, so the f32 graph sees the same values.
Graph chain(DType dtype, const Tensor& a, const Tensor& b, const std::string& middle = "") {
  Graph g;
  g.set_opset("", 21);
  g.inputs.push_back({.name = "x", .dtype = dtype});
  g.outputs.push_back({.name = "y", .dtype = dtype});
  const auto as = [&](const Tensor& t) { return dtype == DType::F16 ? to_half(t) : t; };
  g.set_initializer("a", as(a));
  g.set_initializer("b", as(b));
  g.nodes.push_back(node("Mul", {"x", "a"}, {"m"}));
  g.nodes.push_back(node("Add", {"m", "b"}, {"s"}));
  std::string into_tanh = "s";
  if (middle == "LayerNormalization") {
    g.set_initializer("gamma", as(f32({8}, {1, 1, 1, 1, 1, 1, 1, 1})));
    g.nodes.push_back(node("LayerNormalization", {"s", "gamma"}, {"ln"}, {attr_int("axis", -1)}));
    g.nodes.push_back(node("Identity", {"ln"}, {"id"}));
    into_tanh = "id";
  } else if (!middle.empty()) {  // one data-movement op: Identity
    g.nodes.push_back(node(middle, {"s"}, {"id"}));
    into_tanh = "id";
  }
  g.nodes.push_back(node("Tanh", {into_tanh}, {"t"}));
  g.nodes.push_back(node("Mul", {"t", "a"}, {"m2"}));
  g.nodes.push_back(node("Sigmoid", {"m2"}, {"y"}));
  return g;
}

Tensor run(const Graph& g, const Tensor& x, HalfCompute policy, int threads = 1,
           std::vector<std::string>* kept = nullptr) {
  Executor ex(g, {.device = Device::Cpu, .threads = threads, .half_compute = policy});
  EXPECT_EQ(ex.half_compute(), policy);
  if (kept) *kept = ex.values_kept_f32();
  return ex.run({{"x", x}}).at(0);
}

struct Inputs {
  Tensor x = to_half(random_f32({16, 8}, 11, -3.0f, 3.0f));
  Tensor a = Tensor::from_f32(to_half(random_f32({8}, 12, 0.5f, 3.0f)).to_f32(), {8}, DType::F32);
  Tensor b = Tensor::from_f32(to_half(random_f32({8}, 13, -1.0f, 1.0f)).to_f32(), {8}, DType::F32);
  Tensor x32 = Tensor::from_f32(x.to_f32(), x.shape(), DType::F32);
};

size_t differing(const Tensor& p, const Tensor& q) {
  const auto u = p.data<uint16_t>(), v = q.data<uint16_t>();
  size_t n = 0;
  for (size_t i = 0; i < u.size(); ++i) n += u[i] != v[i] ? 1 : 0;
  return n;
}

TEST(HalfCompute, OrtKeepsF32BetweenOpsAndRoundsOnceAtTheOutput) {
  const Inputs in;
  const Tensor ref = to_half(run(chain(DType::F32, in.a, in.b), in.x32, HalfCompute::PerOp));
  std::vector<std::string> kept;
  const Tensor ort = run(chain(DType::F16, in.a, in.b), in.x, HalfCompute::Ort, 1, &kept);
  ASSERT_EQ(ort.dtype(), DType::F16);
  EXPECT_TRUE(ort.equals(ref)) << differing(ort, ref) << " elements differ";
  EXPECT_EQ(kept, (std::vector<std::string>{"m", "m2", "s", "t"}));
  // Thread count changes nothing.
  EXPECT_TRUE(run(chain(DType::F16, in.a, in.b), in.x, HalfCompute::Ort, 4).equals(ort));
}

TEST(HalfCompute, PerOpRoundsEveryStep) {
  const Inputs in;
  const Tensor a = to_half(in.a), b = to_half(in.b);
  // Step by step, each op alone (its output is a graph output, rounded to fp16).
  Tensor v = run1({.op = "Mul", .inputs = {in.x, a}});
  v = run1({.op = "Add", .inputs = {v, b}});
  v = run1({.op = "Tanh", .inputs = {v}});
  v = run1({.op = "Mul", .inputs = {v, a}});
  v = run1({.op = "Sigmoid", .inputs = {v}});
  ASSERT_EQ(v.dtype(), DType::F16);
  std::vector<std::string> kept;
  const Tensor per_op = run(chain(DType::F16, in.a, in.b), in.x, HalfCompute::PerOp, 1, &kept);
  EXPECT_TRUE(per_op.equals(v)) << differing(per_op, v) << " elements differ";
  EXPECT_TRUE(kept.empty());
  // The policies differ on this chain: intermediate rounding shows in the output.
  const Tensor ort = run(chain(DType::F16, in.a, in.b), in.x, HalfCompute::Ort);
  EXPECT_GT(differing(per_op, ort), 0u);
}

TEST(HalfCompute, AutoIsOrtOnCpu) {
  const Inputs in;
  Executor ex(chain(DType::F16, in.a, in.b), {.device = Device::Cpu});
  EXPECT_EQ(ex.half_compute(), HalfCompute::Ort);
  EXPECT_EQ(parse_half_compute("per-op"), HalfCompute::PerOp);
  EXPECT_EQ(parse_half_compute("ort"), HalfCompute::Ort);
  EXPECT_EQ(parse_half_compute("auto"), HalfCompute::Auto);
  EXPECT_FALSE(parse_half_compute("fp16").has_value());
}

// Ops with an fp16 CPU kernel in ORT between f32-computing ops: LayerNormalization -> Identity
// run in fp16 (each has a reader or producer with an fp16 kernel), so LayerNorm's input and
// output are rounded; Identity alone between two f32-computing ops is forced to f32 by ORT (an
// "isolated" fp16 node), so nothing rounds there.
TEST(HalfCompute, OrtRoundsAtInputsOfFp16Kernels) {
  const Inputs in;
  std::vector<std::string> kept;
  const Tensor ln =
      run(chain(DType::F16, in.a, in.b, "LayerNormalization"), in.x, HalfCompute::Ort, 1, &kept);
  EXPECT_EQ(kept, (std::vector<std::string>{"m", "m2", "t"}));  // not s: LayerNorm reads it

  // Reference: the f32 graph with the LayerNorm input rounded to fp16 (s's value as f16, back
  // to f32), LayerNorm's output rounded too (it is an fp16 kernel).
  Graph g32 = chain(DType::F32, in.a, in.b, "LayerNormalization");
  for (Node& n : g32.nodes) {
    if (n.op_type == "LayerNormalization") {
      n.inputs[0] = "s16w";
      n.outputs[0] = "ln32";
    }
  }
  auto cast = [](std::string in, std::string out, DType to) {
    return node("Cast", {std::move(in)}, {std::move(out)}, {attr_int("to", dtype_to_onnx(to))});
  };
  g32.nodes.insert(g32.nodes.begin() + 2, cast("s", "s16", DType::F16));
  g32.nodes.insert(g32.nodes.begin() + 3, cast("s16", "s16w", DType::F32));
  g32.nodes.insert(g32.nodes.begin() + 5, cast("ln32", "ln16", DType::F16));
  g32.nodes.insert(g32.nodes.begin() + 6, cast("ln16", "ln", DType::F32));
  const Tensor ref = to_half(run(g32, in.x32, HalfCompute::PerOp));
  EXPECT_TRUE(ln.equals(ref)) << differing(ln, ref) << " elements differ";

  const Tensor id =
      run(chain(DType::F16, in.a, in.b, "Identity"), in.x, HalfCompute::Ort, 1, &kept);
  EXPECT_EQ(kept, (std::vector<std::string>{"id", "m", "m2", "s", "t"}));
  EXPECT_TRUE(id.equals(run(chain(DType::F16, in.a, in.b), in.x, HalfCompute::Ort)));
}

// A model Cast f32 -> f16 read by an f32-computing op cancels against the Cast ORT inserts
// before that op: no rounding. The graph output stays rounded.
TEST(HalfCompute, OrtFoldsModelCastsNextToF32Ops) {
  const Inputs in;
  Graph g;
  g.set_opset("", 21);
  g.inputs.push_back({.name = "x", .dtype = DType::F32});
  g.outputs.push_back({.name = "y", .dtype = DType::F16});
  g.outputs.push_back({.name = "h", .dtype = DType::F16});
  g.nodes.push_back(node("Exp", {"x"}, {"e"}));
  g.nodes.push_back(node("Cast", {"e"}, {"h"}, {attr_int("to", dtype_to_onnx(DType::F16))}));
  g.nodes.push_back(node("Tanh", {"h"}, {"y"}));
  Executor ort(g, {.device = Device::Cpu, .half_compute = HalfCompute::Ort});
  Executor per_op(g, {.device = Device::Cpu, .half_compute = HalfCompute::PerOp});
  const Tensor x = Tensor::from_f32(random_f32({64}, 5, -2.0f, 2.0f).to_f32(), {64}, DType::F32);
  const auto o = ort.run({{"x", x}});
  const auto p = per_op.run({{"x", x}});
  // Both round h itself (a graph output) the same way.
  EXPECT_TRUE(o.at(1).equals(p.at(1)));
  // Ort: y = tanh(exp(x)) in f32, rounded once; PerOp: tanh of the rounded h.
  Graph g32;
  g32.set_opset("", 21);
  g32.inputs.push_back({.name = "x", .dtype = DType::F32});
  g32.outputs.push_back({.name = "y"});
  g32.nodes.push_back(node("Exp", {"x"}, {"e"}));
  g32.nodes.push_back(node("Tanh", {"e"}, {"y"}));
  const Tensor ref = to_half(run(g32, x, HalfCompute::PerOp));
  EXPECT_TRUE(o.at(0).equals(ref)) << differing(o.at(0), ref) << " elements differ";
  EXPECT_EQ(ort.values_kept_f32(), (std::vector<std::string>{"h"}));
}

// x (f16) -> MatMul(x, DequantizeLinear(int4 [32, 16], fp16 block scales)) -> Relu -> y: the
// int4 product is fused (Int4MatMul) or not, under both policies.
Graph int4_graph() {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> qd(-8, 7);
  std::uniform_real_distribution<float> sd(0.01f, 0.1f);
  const int64_t k = 32, n = 16, block = 16;
  std::vector<int8_t> qv(static_cast<size_t>(k * n));
  for (int8_t& v : qv) v = static_cast<int8_t>(qd(rng));
  Tensor q(DType::I4, {k, n});
  pack_int4(qv, q.mutable_data<uint8_t>());
  std::vector<float> sv(static_cast<size_t>(k / block * n));
  for (float& v : sv) v = sd(rng);
  Graph g;
  g.set_opset("", 21);
  g.inputs.push_back({.name = "x", .dtype = DType::F16});
  g.outputs.push_back({.name = "y", .dtype = DType::F16});
  g.set_initializer("w_q", q);
  g.set_initializer("w_s", Tensor::from_f32(sv, {k / block, n}, DType::F16));
  g.nodes.push_back(node("DequantizeLinear", {"w_q", "w_s"}, {"w"},
                         {attr_int("axis", 0), attr_int("block_size", block)}));
  g.nodes.push_back(node("MatMul", {"x", "w"}, {"mm"}));
  g.nodes.push_back(node("Mul", {"mm", "mm"}, {"sq"}));
  g.nodes.push_back(node("Relu", {"sq"}, {"y"}));
  return g;
}

}  // namespace

TEST(HalfCompute, Int4FusedProductUnderBothPolicies) {
  const Graph g = int4_graph();
  Graph fused = g;
  ASSERT_EQ(fuse_int4_matmuls(fused), 1);
  const Tensor x = to_half(random_f32({8, 32}, 21, -2.0f, 2.0f));
  for (const HalfCompute policy : {HalfCompute::Ort, HalfCompute::PerOp}) {
    SCOPED_TRACE(policy == HalfCompute::Ort ? "ort" : "per-op");
    std::vector<Tensor> got;
    for (const bool fuse : {true, false}) {
      for (const int threads : {1, 3}) {
        Executor ex(
            g,
            {.device = Device::Cpu, .threads = threads, .fuse_int4 = fuse, .half_compute = policy});
        // Ort: the product's output goes on to Mul in f32 (MatMul has no fp16 kernel in ORT).
        const std::vector<std::string> kept = policy == HalfCompute::Ort
                                                  ? std::vector<std::string>{"mm", "sq"}
                                                  : std::vector<std::string>{};
        EXPECT_EQ(ex.values_kept_f32(), kept);
        got.push_back(ex.run({{"x", x}}).at(0));
        ASSERT_EQ(got.back().dtype(), DType::F16);
      }
    }
    EXPECT_TRUE(got[0].equals(got[1])) << "fused: bytes depend on threads";
    EXPECT_TRUE(got[2].equals(got[3])) << "unfused: bytes depend on threads";
    // Fused and unfused add the same products in other orders: a few fp16 ulps at most.
    const auto a = got[0].to_f32(), b = got[2].to_f32();
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_NEAR(a[i], b[i], 4e-3f * std::max(1.0f, std::fabs(b[i]))) << i;
    }
  }
}

// One node alone: its output is a graph output, so both policies round it once, and
// test_ops_half.cpp's per-op bit exactness (run under the default policy) holds for PerOp too.
TEST(HalfCompute, OneNodeIsTheSameUnderBothPolicies) {
  const Tensor a = to_half(random_f32({4, 16}, 31, -2.0f, 2.0f));
  const Tensor w = to_half(random_f32({16, 8}, 32, -1.0f, 1.0f));
  const Tensor s = to_half(random_f32({16}, 33, 0.5f, 1.5f));
  const std::vector<OneNode> cases = {
      {.op = "Add", .inputs = {a, a}},
      {.op = "Gelu", .inputs = {a}},
      {.op = "Softmax", .inputs = {a}, .attrs = {attr_int("axis", -1)}},
      {.op = "LayerNormalization", .inputs = {a, s}, .attrs = {attr_int("axis", -1)}},
      {.op = "MatMul", .inputs = {a, w}},
      {.op = "Transpose", .inputs = {a}},
  };
  for (const OneNode& spec : cases) {
    std::vector<std::pair<std::string, Tensor>> feeds;
    for (size_t i = 0; i < spec.inputs.size(); ++i) {
      feeds.emplace_back("in" + std::to_string(i), spec.inputs[i]);
    }
    const Graph g = one_node_graph(spec);
    const Tensor ort =
        Executor(g, {.device = Device::Cpu, .half_compute = HalfCompute::Ort}).run(feeds).at(0);
    const Tensor per_op =
        Executor(g, {.device = Device::Cpu, .half_compute = HalfCompute::PerOp}).run(feeds).at(0);
    EXPECT_EQ(ort.dtype(), DType::F16) << spec.op;
    EXPECT_TRUE(ort.equals(per_op)) << spec.op << ": " << differing(ort, per_op) << " differ";
  }
}
