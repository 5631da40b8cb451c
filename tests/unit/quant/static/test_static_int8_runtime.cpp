// The static INT8 graph run by the runtime: close to the float graph (the scales are sane), not
// equal to it (the Q/DQ pairs are on the path), with and without int32 bias.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "runtime/executor.h"
#include "tests/unit/quant/static/static_fixtures.h"

using namespace qforge;
using namespace qforge::test;

namespace {

// x [2,3,8,8] -> Conv 3x3 -> Relu -> r ; r -> Conv 1x1 -> c2 ; Add(c2, r) (residual) -> MaxPool
// -> Flatten -> Gemm(transB) -> logits [2,10]
Graph small_cnn() {
  Graph g;
  g.set_opset("", 17);
  g.inputs.push_back({.name = "x", .dtype = DType::F32});
  g.set_initializer("w1", random_weight({8, 3, 3, 3}, 21));
  g.set_initializer("b1", random_weight({8}, 22));
  g.set_initializer("w2", random_weight({8, 8, 1, 1}, 23));
  g.set_initializer("b2", random_weight({8}, 24));
  g.set_initializer("wg", random_weight({10, 128}, 25));
  g.set_initializer("bg", random_weight({10}, 26));
  g.nodes.push_back(make_node("conv1", "Conv", {"x", "w1", "b1"}, {"c1"},
                              {Attribute::make_ints("pads", {1, 1, 1, 1})}));
  g.nodes.push_back(make_node("relu", "Relu", {"c1"}, {"r"}));
  g.nodes.push_back(make_node("conv2", "Conv", {"r", "w2", "b2"}, {"c2"}));
  g.nodes.push_back(make_node("residual", "Add", {"c2", "r"}, {"s"}));
  g.nodes.push_back(make_node(
      "pool", "MaxPool", {"s"}, {"p"},
      {Attribute::make_ints("kernel_shape", {2, 2}), Attribute::make_ints("strides", {2, 2})}));
  g.nodes.push_back(make_node("flat", "Flatten", {"p"}, {"f"}));
  g.nodes.push_back(
      make_node("head", "Gemm", {"f", "wg", "bg"}, {"logits"}, {Attribute::make_int("transB", 1)}));
  g.outputs.push_back({.name = "logits"});
  return g;
}

Tensor input(uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(2 * 3 * 8 * 8);
  for (float& x : v) x = dist(rng);
  return Tensor::from_f32(v, {2, 3, 8, 8});
}

// Largest |value| of every float value over a few inputs: a minmax calibration.
std::map<std::string, float> minmax_ranges(const Graph& g) {
  std::map<std::string, float> amax;
  Executor exec(g, {});
  exec.set_observer([&](const std::string& name, const Tensor& t) {
    if (t.dtype() != DType::F32) return;
    for (float v : t.to_f32()) amax[name] = std::max(amax[name], std::fabs(v));
  });
  for (uint32_t seed = 1; seed <= 4; ++seed) exec.run({{"x", input(seed)}});
  return amax;
}

double sqnr_db(const std::vector<float>& ref, const std::vector<float>& got) {
  double signal = 0, noise = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    signal += double(ref[i]) * ref[i];
    noise += (double(ref[i]) - got[i]) * (double(ref[i]) - got[i]);
  }
  return 10.0 * std::log10(signal / noise);
}

}  // namespace

TEST(StaticInt8Runtime, QuantizedGraphTracksTheFloatGraph) {
  const Graph original = small_cnn();
  const std::map<std::string, float> ranges = minmax_ranges(original);
  for (bool int32_bias : {false, true}) {
    SCOPED_TRACE(int32_bias ? "int32 bias" : "float bias");
    Graph quantized = original;
    StaticInt8Options o;
    o.activation_amax = ranges;
    o.int32_bias = int32_bias;
    const PassReport r = run_static(quantized, o);
    EXPECT_EQ(r.stats["nodes_quantized"], 5);  // 2 Conv, Add, MaxPool, Gemm
    EXPECT_EQ(r.stats["activations"], 5);      // x, r, c2, s, f
    const Tensor x = input(99);                // not one of the calibration inputs
    const std::vector<float> want = Executor(original, {}).run({{"x", x}})[0].to_f32();
    const std::vector<float> got = Executor(quantized, {}).run({{"x", x}})[0].to_f32();
    ASSERT_EQ(want.size(), got.size());
    const double sqnr = sqnr_db(want, got);
    EXPECT_GT(sqnr, 25.0) << "int8 everywhere on the path should stay within ~25-40 dB";
    EXPECT_LT(sqnr, 80.0) << "identical outputs: the Q/DQ pairs are not on the path";
  }
}
