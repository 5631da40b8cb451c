// The runtime's W4A16 paths: blocked int4 DequantizeLinear [-> Cast] -> MatMul fused into the
// packed product (runtime/int4_fusion.h), against the same graph unfused; com.microsoft
// MatMulNBits (repacked at plan time or per run) against the dequantized weight.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ir/half.h"
#include "kernels/int4.h"
#include "quant/w4a16/w4a16_matmulnbits.h"
#include "runtime/executor.h"
#include "runtime/int4_fusion.h"
#include "runtime_test_util.h"

using namespace qforge;
using namespace qforge::rt_test;

namespace {

struct Int4Case {
  int64_t m, k, n, block;
  DType act = DType::F32;   // MatMul's A (and output) dtype
  DType scale = DType::F16;  // DequantizeLinear's scale (and output) dtype
  bool zero_points = false;
};

struct Weights {
  Tensor q;       // I4 [k, n]
  Tensor scales;  // [blocks, n]
  Tensor zp;      // I4 [blocks, n] or empty
  std::vector<int8_t> qv, zv;
  std::vector<float> sv;
};

Weights make_weights(const Int4Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> qd(-8, 7);
  std::uniform_real_distribution<float> sd(0.01f, 0.1f);
  const int64_t blocks = int4_block_count(c.k, c.block);
  Weights w;
  w.qv.resize(static_cast<size_t>(c.k * c.n));
  for (int8_t& v : w.qv) v = static_cast<int8_t>(qd(rng));
  w.q = Tensor(DType::I4, {c.k, c.n});
  pack_int4(w.qv, w.q.mutable_data<uint8_t>());
  w.sv.resize(static_cast<size_t>(blocks * c.n));
  for (float& v : w.sv) v = f16_to_f32(f32_to_f16(sd(rng)));  // fp16 values, exact in f32
  w.scales = Tensor::from_f32(w.sv, {blocks, c.n}, c.scale);
  if (c.zero_points) {
    w.zv.resize(w.sv.size());
    for (int8_t& v : w.zv) v = static_cast<int8_t>(qd(rng));
    w.zp = Tensor(DType::I4, {blocks, c.n});
    pack_int4(w.zv, w.zp.mutable_data<uint8_t>());
  }
  return w;
}

// x -> MatMul(x, DequantizeLinear(q, s[, zp]) [-> Cast]) -> y, plus a second MatMul reading the
// same weight (both get fused).
Graph dq_matmul_graph(const Int4Case& c, const Weights& w) {
  Graph g;
  g.set_opset("", 21);
  g.inputs.push_back({.name = "x", .dtype = c.act});
  g.set_initializer("w_q", w.q);
  g.set_initializer("w_s", w.scales);
  Node dq;
  dq.name = "dq";
  dq.op_type = "DequantizeLinear";
  dq.inputs = {"w_q", "w_s"};
  if (c.zero_points) {
    g.set_initializer("w_zp", w.zp);
    dq.inputs.push_back("w_zp");
  }
  dq.outputs = {"w_dq"};
  dq.set_attr(attr_int("axis", 0));
  dq.set_attr(attr_int("block_size", c.block));
  g.nodes.push_back(dq);
  std::string b = "w_dq";
  if (c.act != c.scale) {
    Node cast;
    cast.name = "cast";
    cast.op_type = "Cast";
    cast.inputs = {"w_dq"};
    cast.outputs = {"w_cast"};
    cast.set_attr(attr_int("to", dtype_to_onnx(c.act)));
    g.nodes.push_back(cast);
    b = "w_cast";
  }
  for (const char* y : {"y", "y2"}) {
    Node mm;
    mm.name = std::string("mm_") + y;
    mm.op_type = "MatMul";
    mm.inputs = {"x", b};
    mm.outputs = {y};
    g.nodes.push_back(mm);
    g.outputs.push_back({.name = y});
  }
  return g;
}

Tensor activations(const Int4Case& c, uint32_t seed) {
  const Tensor x = random_f32({c.m, c.k}, seed);
  return c.act == DType::F32 ? x : Tensor::from_f32(x.data<float>(), {c.m, c.k}, c.act);
}

std::vector<float> run_graph(const Graph& g, const Tensor& x, bool fuse, int threads = 2,
                             size_t output = 0) {
  Executor ex(g, {.device = Device::Cpu, .threads = threads, .fuse_int4 = fuse});
  return ex.run({{"x", x}}).at(output).to_f32();
}

// |a - b| within a few f32 roundings of the sum of |x * w| (the two paths add in other orders).
void expect_close(const std::vector<float>& a, const std::vector<float>& b, const Tensor& x,
                  int64_t n, float rel) {
  ASSERT_EQ(a.size(), b.size());
  const std::vector<float> xv = x.to_f32();
  const auto k = static_cast<int64_t>(xv.size() / (a.size() / static_cast<size_t>(n)));
  for (size_t i = 0; i < a.size(); ++i) {
    const auto row = static_cast<int64_t>(i) / n;
    double mag = 0;
    for (int64_t kk = 0; kk < k; ++kk) mag += std::fabs(xv[static_cast<size_t>(row * k + kk)]) * 1.5;
    ASSERT_NEAR(a[i], b[i], rel * mag + 1e-6) << "element " << i;
  }
}

class Int4Fusion : public ::testing::TestWithParam<Int4Case> {};

}  // namespace

TEST_P(Int4Fusion, FusedMatchesUnfused) {
  const Int4Case c = GetParam();
  const Weights w = make_weights(c, 5);
  const Graph g = dq_matmul_graph(c, w);

  Graph fused = g;
  EXPECT_EQ(fuse_int4_matmuls(fused), 2);
  for (const Node& node : fused.nodes) {
    EXPECT_NE(node.op_type, "DequantizeLinear") << "the weight is still dequantized";
    EXPECT_NE(node.op_type, "Cast");
  }

  const Tensor x = activations(c, 9);
  const std::vector<float> a = run_graph(g, x, true), b = run_graph(g, x, false);
  const float rel = c.act == DType::F16 ? 2e-3f : 1e-5f;  // f16 outputs round once more
  expect_close(a, b, x, c.n, rel);
  EXPECT_EQ(a, run_graph(g, x, true, 2, 1)) << "both MatMuls read the same weight";
  const std::vector<float> one = run_graph(g, x, true, 1);
  EXPECT_EQ(std::memcmp(a.data(), one.data(), a.size() * 4), 0) << "bytes depend on threads";
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Int4Fusion,
    ::testing::Values(Int4Case{1, 96, 40, 32}, Int4Case{16, 100, 7, 32},  // partial last block
                      Int4Case{33, 128, 130, 64, DType::F32, DType::F32},  // f32 scales, no Cast
                      Int4Case{4, 64, 48, 16, DType::F16, DType::F16},     // fp16 end to end
                      Int4Case{5, 70, 33, 32, DType::F32, DType::F16, true}));  // zero points

TEST(Int4Fusion, LeavesADequantizedWeightThatIsAlsoAnOutput) {
  const Int4Case c{2, 64, 8, 32};
  const Weights w = make_weights(c, 1);
  Graph g = dq_matmul_graph(c, w);
  g.outputs.push_back({.name = "w_dq"});
  EXPECT_EQ(fuse_int4_matmuls(g), 0);
  const Tensor x = activations(c, 2);
  EXPECT_EQ(run_graph(g, x, true), run_graph(g, x, false));
}

namespace {

// x -> MatMulNBits(x, B, scales[, zero points]) -> y, from the packing quant/w4a16 writes.
Graph nbits_graph(const Int4Case& c, const Weights& w, bool constant_weights) {
  const MatMulNBitsWeight p = pack_matmulnbits(w.qv, w.sv, c.k, c.n, c.block);
  const int64_t blocks = int4_block_count(c.k, c.block);
  Graph g;
  g.set_opset("", 21);
  g.set_opset("com.microsoft", 1);
  g.inputs.push_back({.name = "x", .dtype = DType::F32});
  Tensor b(DType::U8, {c.n, blocks, c.block / 2});
  std::memcpy(b.mutable_bytes().data(), p.b.data(), p.b.size());
  Tensor s = Tensor::from_f32(p.scales, {c.n * blocks});
  Node node;
  node.name = "nbits";
  node.op_type = "MatMulNBits";
  node.domain = "com.microsoft";
  node.inputs = {"x", "B", "S"};
  if (constant_weights) {
    g.set_initializer("B", b);
    g.set_initializer("S", s);
  } else {
    g.inputs.push_back({.name = "B", .dtype = DType::U8});
    g.inputs.push_back({.name = "S", .dtype = DType::F32});
  }
  if (c.zero_points) {  // uint8, two per byte, per column
    const int64_t zbytes = (blocks + 1) / 2;
    Tensor zp(DType::U8, {c.n * zbytes});
    auto z = zp.mutable_data<uint8_t>();
    std::fill(z.begin(), z.end(), uint8_t{0});
    for (int64_t col = 0; col < c.n; ++col)
      for (int64_t bl = 0; bl < blocks; ++bl)
        z[static_cast<size_t>(col * zbytes + bl / 2)] |= static_cast<uint8_t>(
            (w.zv[static_cast<size_t>(bl * c.n + col)] + 8) << (4 * (bl % 2)));
    g.set_initializer("Z", zp);
    node.inputs.push_back("Z");
  }
  node.outputs = {"y"};
  node.set_attr(attr_int("K", c.k));
  node.set_attr(attr_int("N", c.n));
  node.set_attr(attr_int("bits", 4));
  node.set_attr(attr_int("block_size", c.block));
  g.nodes.push_back(node);
  g.outputs.push_back({.name = "y"});
  return g;
}

}  // namespace

TEST(MatMulNBits, MatchesTheDequantizedWeight) {
  for (const bool zp : {false, true}) {
    const Int4Case c{7, 100, 33, 32, DType::F32, DType::F32, zp};
    SCOPED_TRACE(zp ? "with zero points" : "default zero point");
    const Weights w = make_weights(c, 17);
    const Tensor x = activations(c, 3);
    const std::vector<float> want = run_graph(dq_matmul_graph(c, w), x, false);
    Graph g = nbits_graph(c, w, true);
    const std::vector<float> planned = run_graph(g, x, true);
    const std::vector<float> per_run = run_graph(g, x, false);
    expect_close(planned, want, x, c.n, 1e-5f);
    EXPECT_EQ(planned, per_run) << "plan-time repacking changes nothing";
    EXPECT_EQ(fuse_int4_matmuls(g), 1);
  }
}

TEST(MatMulNBits, WeightsFedAtRunTime) {
  const Int4Case c{3, 64, 9, 16, DType::F32, DType::F32};
  const Weights w = make_weights(c, 4);
  const Tensor x = activations(c, 6);
  const Graph constant = nbits_graph(c, w, true);
  const Graph fed = nbits_graph(c, w, false);
  Executor ex(fed, {.device = Device::Cpu, .threads = 1});
  const auto y = ex.run({{"x", x},
                         {"B", *constant.find_initializer("B")},
                         {"S", *constant.find_initializer("S")}});
  EXPECT_EQ(y.at(0).to_f32(), run_graph(constant, x, true, 1));
}

TEST(MatMulNBits, BadShapesAndOptionsAreClear) {
  const Int4Case c{2, 64, 8, 32, DType::F32, DType::F32};
  const Weights w = make_weights(c, 8);
  Graph g = nbits_graph(c, w, true);
  g.nodes[0].set_attr(attr_int("N", 9));
  const Tensor x = activations(c, 1);
  Caught e = catch_error([&] { run_graph(g, x, false); });
  EXPECT_EQ(e.category, ErrorCategory::InvalidInput);
  EXPECT_NE(e.message.find("B u8 [8, 2, 16] is not uint8 [N, n_blocks, block_size / 2] = [9, 2, 16]"),
            std::string::npos)
      << e.message;
  g = nbits_graph(c, w, true);
  g.nodes[0].set_attr(attr_int("bits", 8));
  e = catch_error([&] { run_graph(g, x, false); });
  EXPECT_EQ(e.category, ErrorCategory::Unsupported);
  EXPECT_NE(e.message.find("bits = 8"), std::string::npos) << e.message;
}
