// BatchNormalization folding: the folded conv computes what conv + BN computed (run by the
// runtime on random data), and the cases that must not fold are left alone.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "quant/static/fold_batchnorm.h"
#include "runtime/executor.h"
#include "tests/unit/quant/static/static_fixtures.h"

using namespace qforge;
using namespace qforge::test;

namespace {

PassReport run_fold(Graph& g) {
  PassReport r;
  r.pass = "fold-batchnorm";
  make_fold_batchnorm_pass()->run(g, r);
  return r;
}

Tensor uniform(const Shape& shape, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(shape_numel(shape));
  for (float& x : v) x = dist(rng);
  return Tensor::from_f32(v, shape);
}

struct ConvBn {
  std::string op = "Conv";
  Shape weight;
  int64_t channels = 0;  // output channels
  int64_t group = 1;
  bool bias = true;
};

// x [2, C_in, 5, 5] -> conv -> "c" -> BatchNormalization -> "y" (graph output)
Graph conv_bn(const ConvBn& c, int64_t in_channels) {
  Graph g;
  g.set_opset("", 17);
  g.inputs.push_back({.name = "x",
                      .dtype = DType::F32,
                      .shape = std::vector<Dim>{{2, ""}, {in_channels, ""}, {5, ""}, {5, ""}}});
  g.set_initializer("w", uniform(c.weight, 1, -1.0f, 1.0f));
  std::vector<std::string> conv_in = {"x", "w"};
  if (c.bias) {
    g.set_initializer("b", uniform({c.channels}, 2, -0.5f, 0.5f));
    conv_in.emplace_back("b");
  }
  g.set_initializer("gamma", uniform({c.channels}, 3, 0.5f, 1.5f));
  g.set_initializer("beta", uniform({c.channels}, 4, -0.3f, 0.3f));
  g.set_initializer("mean", uniform({c.channels}, 5, -0.5f, 0.5f));
  g.set_initializer("var", uniform({c.channels}, 6, 0.2f, 2.0f));
  g.nodes.push_back(make_node(
      "conv", c.op, conv_in, {"c"},
      {Attribute::make_int("group", c.group), Attribute::make_ints("pads", {1, 1, 1, 1})}));
  g.nodes.push_back(make_node("bn", "BatchNormalization", {"c", "gamma", "beta", "mean", "var"},
                              {"y"}, {Attribute::make_float("epsilon", 1e-3f)}));
  g.outputs.push_back({.name = "y"});
  return g;
}

std::vector<float> run_graph(const Graph& g, const Tensor& x) {
  ExecutorOptions opts;
  opts.threads = 1;
  Executor exec(g, opts);
  return exec.run({{"x", x}})[0].to_f32();
}

}  // namespace

TEST(FoldBatchNorm, FoldedConvMatchesConvPlusBatchNorm) {
  const std::vector<std::pair<ConvBn, int64_t>> cases = {
      {{"Conv", {6, 4, 3, 3}, 6, 1, true}, 4},
      {{"Conv", {6, 2, 3, 3}, 6, 2, false}, 4},  // grouped, bias created
      {{"ConvTranspose", {4, 3, 3, 3}, 3, 1, true}, 4},
      {{"ConvTranspose", {4, 2, 3, 3}, 4, 2, false}, 4},  // output channel = group * 2 + j
  };
  for (const auto& [c, in_channels] : cases) {
    SCOPED_TRACE(c.op + " weight " + shape_to_string(c.weight) + " group " +
                 std::to_string(c.group) + (c.bias ? " with bias" : " without bias"));
    const Graph original = conv_bn(c, in_channels);
    Graph folded = original;
    const PassReport r = run_fold(folded);
    ASSERT_EQ(r.stats["folded"], 1);
    ASSERT_EQ(folded.nodes.size(), 1u);
    const Node& conv = folded.nodes[0];
    EXPECT_EQ(conv.outputs[0], "y") << "the conv takes over the BN output name";
    ASSERT_EQ(conv.inputs.size(), 3u) << "a bias is created when absent";
    EXPECT_EQ(conv.inputs[1], "w_folded");
    EXPECT_EQ(conv.inputs[2], c.bias ? "b_folded" : "w_bias_folded");
    for (const char* gone : {"w", "b", "gamma", "beta", "mean", "var"}) {
      EXPECT_FALSE(folded.has_initializer(gone)) << gone << " is no longer read";
    }
    const Tensor x = uniform({2, in_channels, 5, 5}, 7, -2.0f, 2.0f);
    const std::vector<float> want = run_graph(original, x);
    const std::vector<float> got = run_graph(folded, x);
    ASSERT_EQ(want.size(), got.size());
    double worst = 0.0;
    for (size_t i = 0; i < want.size(); ++i) {
      worst = std::max(worst, std::fabs(double(want[i]) - got[i]) / (1.0 + std::fabs(want[i])));
    }
    EXPECT_LT(worst, 1e-5) << "worst relative difference over " << want.size() << " values";
  }
}

TEST(FoldBatchNorm, LeavesPairsThatCannotFold) {
  const ConvBn c{"Conv", {3, 2, 3, 3}, 3, 1, true};
  {
    Graph g = conv_bn(c, 2);
    g.nodes.push_back(make_node("other", "Relu", {"c"}, {"r"}));
    g.outputs.push_back({.name = "r"});
    const PassReport r = run_fold(g);
    EXPECT_EQ(r.stats["folded"], 0);
    EXPECT_EQ(r.stats["skipped"], 1);
    EXPECT_TRUE(has_warning(r, "the conv output 'c' has other readers"));
    EXPECT_EQ(g.nodes.size(), 3u);
  }
  {
    Graph g = conv_bn(c, 2);
    g.remove_initializer("mean");
    g.inputs.push_back({.name = "mean", .dtype = DType::F32});
    const PassReport r = run_fold(g);
    EXPECT_EQ(r.stats["folded"], 0);
    EXPECT_TRUE(has_warning(r, "'mean' is not a constant initializer"));
  }
  {
    Graph g = conv_bn(c, 2);
    g.nodes[1].outputs = {"y", "running_mean", "running_var"};
    g.nodes[1].set_attr(Attribute::make_int("training_mode", 1));
    const PassReport r = run_fold(g);
    EXPECT_EQ(r.stats["folded"], 0);
    EXPECT_TRUE(has_warning(r, "training-mode outputs"));
  }
  {
    Graph g = conv_bn(c, 2);
    g.set_initializer("var", uniform({4}, 6, 0.2f, 2.0f));  // 4 values for 3 channels
    const PassReport r = run_fold(g);
    EXPECT_EQ(r.stats["folded"], 0);
    EXPECT_TRUE(has_warning(r, "'var' has 4 values for 3 output channels"));
  }
}

TEST(FoldBatchNorm, SharedWeightKeepsItsOriginalForOtherReaders) {
  const ConvBn c{"Conv", {3, 2, 3, 3}, 3, 1, true};
  Graph g = conv_bn(c, 2);
  g.nodes.push_back(
      make_node("conv2", "Conv", {"x", "w"}, {"z"}, {Attribute::make_ints("pads", {1, 1, 1, 1})}));
  g.outputs.push_back({.name = "z"});
  const PassReport r = run_fold(g);
  EXPECT_EQ(r.stats["folded"], 1);
  EXPECT_TRUE(g.has_initializer("w")) << "still read by conv2";
  EXPECT_TRUE(g.has_initializer("w_folded"));
  EXPECT_EQ(find_node(g, "conv2")->inputs[1], "w");
}
