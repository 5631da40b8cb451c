// AWQ (quant/awq.h): the scaled graph computes what the original does, weights sharing an input
// share its scales, 1/s is folded or inserted as a Mul, and on a layer with outlier input
// channels AWQ's output error is below round-to-nearest's.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cli/option_parsers.h"
#include "ir/error.h"
#include "kernels/device.h"
#include "ir/half.h"
#include "quant/w4a16/awq.h"
#include "quant/w4a16/awq_search.h"
#include "quant/w4a16/w4a16.h"
#include "runtime/executor.h"
#include "w4a16_fixtures.h"

namespace qforge::test::w4a16 {
namespace {

constexpr int64_t kK = 64;

// [rows, k] normal values; every 16th channel from 3 on is `outlier` times larger.
Tensor outlier_input(int64_t rows, int64_t k, uint32_t seed, float outlier = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(rows * k));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < k; ++c)
      v[static_cast<size_t>(r * k + c)] = dist(rng) * (c % 16 == 3 ? outlier : 1.0f);
  return Tensor::from_f32(v, {rows, k});
}

// Per-channel constant: 1 + small noise, every 16th channel from 3 on 25 (an outlier feature).
Tensor channel_gain(int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(0.8f, 1.2f);
  std::vector<float> v(static_cast<size_t>(k));
  for (int64_t c = 0; c < k; ++c) v[static_cast<size_t>(c)] = c % 16 == 3 ? 25.0f : dist(rng);
  return Tensor::from_f32(v, {k});
}

void add_input(Graph& g, int64_t k) {
  g.name = "awq";
  g.set_opset("", 17);
  g.inputs.push_back({.name = "x",
                      .dtype = DType::F32,
                      .shape = std::vector<Dim>{Dim{.param = "batch"}, Dim{.value = k}}});
}

void add_output(Graph& g, const std::string& name, int64_t n) {
  g.outputs.push_back({.name = name,
                       .dtype = DType::F32,
                       .shape = std::vector<Dim>{Dim{.param = "batch"}, Dim{.value = n}}});
}

// x -> `norm` -> h -> MatMul(wq, wk, wv) -> q + k + v -> Relu -> y. norm: "ln"
// (LayerNormalization with an outlier gain), "rms" (Mul by the gain: RMSNorm's weight) or
// "residual" (LayerNormalization, and y = Relu(q + k + v + h): h has a reader that is not
// scaled).
Graph qkv_graph(const std::string& norm) {
  Graph g;
  add_input(g, kK);
  g.set_initializer("gain", channel_gain(kK, 7));
  if (norm == "rms") {
    g.nodes.push_back(make_node("norm", "Mul", {"x", "gain"}, {"h"}));
  } else {
    g.set_initializer("bias", random_weight({kK}, 8));
    g.nodes.push_back(make_node("norm", "LayerNormalization", {"x", "gain", "bias"}, {"h"},
                                {Attribute::make_int("axis", -1)}));
  }
  for (const char* w : {"wq", "wk", "wv"}) {
    g.set_initializer(w, random_weight({kK, kK}, static_cast<uint32_t>(w[1])));
    g.nodes.push_back(
        make_node(std::string(w) + "_mm", "MatMul", {"h", w}, {std::string(w) + "_out"}));
  }
  g.nodes.push_back(make_node("add1", "Add", {"wq_out", "wk_out"}, {"s1"}));
  g.nodes.push_back(make_node("add2", "Add", {"s1", "wv_out"}, {"s2"}));
  std::string last = "s2";
  if (norm == "residual") {
    g.nodes.push_back(make_node("add3", "Add", {"s2", "h"}, {"s3"}));
    last = "s3";
  }
  g.nodes.push_back(make_node("relu", "Relu", {last}, {"y"}));
  add_output(g, "y", kK);
  return g;
}

W4A16Options options(int block) {
  W4A16Options o;
  o.block_size = block;
  o.device = Device::Cpu;
  return o;
}

AwqCalibration calibrate(const Graph& g, const std::vector<W4A16Target>& targets,
                         const std::vector<Tensor>& batches, int64_t max_rows = 512) {
  AwqObserver observer(awq_activation_channels(g, targets), max_rows);
  Executor exec(g, {.device = Device::Cpu, .threads = 1});
  exec.set_observer([&](const std::string& n, const Tensor& v) { observer.observe(n, v); });
  for (const Tensor& x : batches) exec.run({{"x", x}});
  AwqCalibration c;
  c.activations = observer.take();
  return c;
}

std::vector<Tensor> calib_batches(int64_t k, float outlier = 1.0f) {
  return {outlier_input(96, k, 100, outlier), outlier_input(96, k, 101, outlier)};
}

// max |a - b| / max |a|
double rel_diff(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.to_f32(), y = b.to_f32();
  double diff = 0.0, scale = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(x[i]) - y[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(x[i])));
  }
  return diff / scale;
}

double sq_error(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.to_f32(), y = b.to_f32();
  double e = 0.0;
  for (size_t i = 0; i < x.size(); ++i) e += (static_cast<double>(x[i]) - y[i]) * (x[i] - y[i]);
  return e;
}

// Applies AWQ without quantizing; returns the report (one "awq" row per activation).
PassReport scale_only(Graph& g, const AwqCalibration& calib, int block) {
  const std::vector<W4A16Target> targets = plan_w4a16_targets(g, options(block));
  AwqOptions o;
  o.block_size = block;
  o.device = Device::Cpu;
  o.clip = false;  // clipping changes the float weights on purpose
  PassReport report;
  apply_awq(g, targets, calib, o, report);
  g.topological_sort();
  g.check();
  return report;
}

size_t count_op(const Graph& g, const std::string& op) {
  size_t n = 0;
  for (const Node& node : g.nodes) n += node.op_type == op ? 1 : 0;
  return n;
}

TEST(Awq, FoldsIntoLayerNormAndQkvShareOneScale) {
  const Graph original = qkv_graph("ln");
  Graph g = original;
  const auto calib = calibrate(g, plan_w4a16_targets(g, options(32)), calib_batches(kK));
  const PassReport report = scale_only(g, calib, 32);
  ASSERT_EQ(report.stats["awq"].size(), 1u) << report.stats.dump();
  const auto& row = report.stats["awq"][0];
  EXPECT_EQ(row["activation"], "h");
  EXPECT_EQ(row["weights"].size(), 3u);
  EXPECT_GT(row["alpha"].get<double>(), 0.0) << row.dump();
  EXPECT_LT(row["error_awq"].get<double>(), row["error_rtn"].get<double>());
  EXPECT_NE(row["inverse_scale"].get<std::string>().find("LayerNormalization"), std::string::npos);
  EXPECT_EQ(count_op(g, "Mul"), 0u);
  EXPECT_FALSE(g.find_initializer("gain")->equals(*original.find_initializer("gain")));

  // Folding is exact: same outputs on held-out data.
  const Tensor x = outlier_input(32, kK, 555);
  EXPECT_LT(rel_diff(run_graph(original, x), run_graph(g, x)), 1e-5);

  // One s for Q, K and V: row k of each weight is scaled by the same factor.
  const std::vector<float> q0 = original.find_initializer("wq")->to_f32();
  const std::vector<float> q1 = g.find_initializer("wq")->to_f32();
  for (const char* w : {"wk", "wv"}) {
    const std::vector<float> a = original.find_initializer(w)->to_f32();
    const std::vector<float> b = g.find_initializer(w)->to_f32();
    for (int64_t k = 0; k < kK; ++k) {
      const auto i = static_cast<size_t>(k * kK + 5);
      EXPECT_NEAR(b[i] / a[i], q1[i] / q0[i], 1e-4 * std::fabs(q1[i] / q0[i])) << w << " row " << k;
    }
  }
}

TEST(Awq, FoldsIntoRmsNormWeight) {
  const Graph original = qkv_graph("rms");
  Graph g = original;
  const auto calib = calibrate(g, plan_w4a16_targets(g, options(32)), calib_batches(kK));
  const PassReport report = scale_only(g, calib, 32);
  ASSERT_EQ(report.stats["awq"].size(), 1u);
  EXPECT_GT(report.stats["awq"][0]["alpha"].get<double>(), 0.0);
  EXPECT_NE(report.stats["awq"][0]["inverse_scale"].get<std::string>().find("Mul 'norm'"),
            std::string::npos)
      << report.stats.dump();
  EXPECT_EQ(count_op(g, "Mul"), 1u);  // the norm's own Mul, no new one
  const Tensor x = outlier_input(32, kK, 556);
  EXPECT_LT(rel_diff(run_graph(original, x), run_graph(g, x)), 1e-5);
}

TEST(Awq, InsertsMulWhenTheActivationHasOtherReaders) {
  const Graph original = qkv_graph("residual");
  Graph g = original;
  const auto calib = calibrate(g, plan_w4a16_targets(g, options(32)), calib_batches(kK));
  const PassReport report = scale_only(g, calib, 32);
  ASSERT_EQ(report.stats["awq"].size(), 1u);
  EXPECT_GT(report.stats["awq"][0]["alpha"].get<double>(), 0.0);
  EXPECT_EQ(report.stats["awq"][0]["inverse_scale"], "Mul inserted");
  EXPECT_EQ(count_op(g, "Mul"), 1u);
  EXPECT_TRUE(g.find_initializer("gain")->equals(*original.find_initializer("gain")));
  const Node* add3 = find_op(g, "Add", 2);
  ASSERT_NE(add3, nullptr);
  EXPECT_EQ(add3->inputs[1], "h") << "the residual keeps reading the unscaled activation";
  for (const char* mm : {"wq_mm", "wk_mm", "wv_mm"}) {
    const auto it =
        std::find_if(g.nodes.begin(), g.nodes.end(), [&](const Node& n) { return n.name == mm; });
    ASSERT_NE(it, g.nodes.end());
    EXPECT_EQ(producer_of(g, it->inputs[0])->op_type, "Mul") << mm;
  }
  const Tensor x = outlier_input(32, kK, 557);
  EXPECT_LT(rel_diff(run_graph(original, x), run_graph(g, x)), 1e-5);
}

// x -> MatMul(w0) -> h -> MatMul(w1) -> Relu -> MatMul(w2) -> y: x is a graph input (a Mul is
// inserted), h folds into w0's output columns (w0 already scaled along its rows).
TEST(Awq, FoldsIntoPrecedingMatMulColumns) {
  Graph g;
  add_input(g, kK);
  g.set_initializer("w0", random_weight({kK, 48}, 1));
  g.set_initializer("w1", random_weight({48, 32}, 2));
  g.set_initializer("w2", random_weight({32, 8}, 3));
  g.nodes.push_back(make_node("fc0", "MatMul", {"x", "w0"}, {"h"}));
  g.nodes.push_back(make_node("fc1", "MatMul", {"h", "w1"}, {"h1"}));
  g.nodes.push_back(make_node("act", "Relu", {"h1"}, {"a"}));
  g.nodes.push_back(make_node("fc2", "MatMul", {"a", "w2"}, {"y"}));
  add_output(g, "y", 8);
  const Graph original = g;
  const auto calib = calibrate(g, plan_w4a16_targets(g, options(16)), calib_batches(kK, 20.0f));
  const PassReport report = scale_only(g, calib, 16);
  ASSERT_EQ(report.stats["awq"].size(), 2u) << report.stats.dump();  // fc2 is the output projection
  EXPECT_EQ(report.stats["awq"][0]["activation"], "x");
  EXPECT_GT(report.stats["awq"][0]["alpha"].get<double>(), 0.0);
  EXPECT_EQ(report.stats["awq"][0]["inverse_scale"], "Mul inserted");
  const std::string second = report.stats["awq"][1]["inverse_scale"];
  if (report.stats["awq"][1]["alpha"].get<double>() > 0.0) {
    EXPECT_EQ(second, "folded into MatMul 'fc0'");
  }
  const Tensor x = outlier_input(32, kK, 558, 20.0f);
  EXPECT_LT(rel_diff(run_graph(original, x), run_graph(g, x)), 1e-5);
}

// One MatMul [256, 128] whose input has outlier channels: the quantized layer's output error on
// held-out inputs is smaller with AWQ than with round-to-nearest.
TEST(Awq, BeatsRoundToNearestOnOutlierChannels) {
  const int64_t k = 256, n = 128;
  Graph g;
  add_input(g, k);
  g.set_initializer("w", random_weight({k, n}, 11));
  g.set_initializer("w2", random_weight({n, 4}, 12));
  g.nodes.push_back(make_node("fc", "MatMul", {"x", "w"}, {"h"}));
  g.nodes.push_back(make_node("head", "MatMul", {"h", "w2"}, {"y"}));  // left float
  add_output(g, "y", 4);
  const auto calib = std::make_shared<AwqCalibration>(
      calibrate(g, plan_w4a16_targets(g, options(128)), calib_batches(k, 30.0f)));

  Graph rtn = g, awq = g;
  run_pass(rtn, options(128));
  W4A16Options o = options(128);
  o.method = W4Method::Awq;
  o.awq = calib;
  const PassReport report = run_pass(awq, o);
  EXPECT_EQ(report.stats["method"], "awq");
  EXPECT_EQ(report.stats["quantized"], 1);

  // Compare the quantized layer's output h (before the float head) on held-out rows.
  auto hidden = [](Graph graph) {
    graph.outputs[0].name = "h";
    graph.outputs[0].shape = std::vector<Dim>{Dim{.param = "batch"}, Dim{.value = 128}};
    std::erase_if(graph.nodes, [](const Node& node) { return node.name == "head"; });
    return graph;
  };
  const Tensor x = outlier_input(256, k, 999, 30.0f);
  const Tensor ref = run_graph(hidden(g), x);
  const double e_rtn = sq_error(ref, run_graph(hidden(rtn), x));
  const double e_awq = sq_error(ref, run_graph(hidden(awq), x));
  std::printf("held-out output error: rtn %.4g, awq %.4g (ratio %.3f), alpha %.2f\n", e_rtn, e_awq,
              e_awq / e_rtn, report.stats["awq"][0]["alpha"].get<double>());
  EXPECT_LT(e_awq, 0.8 * e_rtn);
}

// The clip search only ever lowers the sample error, and what it clips is what RTN then sees:
// no scaled weight exceeds the limits it chose.
TEST(Awq, ClipSearchLowersTheSampleError) {
  const Graph original = qkv_graph("residual");
  Graph g = original;
  const auto targets = plan_w4a16_targets(g, options(32));
  const auto calib = calibrate(g, targets, calib_batches(kK));
  AwqOptions o;
  o.block_size = 32;
  o.device = Device::Cpu;
  PassReport report;
  apply_awq(g, targets, calib, o, report);
  ASSERT_EQ(report.stats["awq"].size(), 1u);
  const auto& row = report.stats["awq"][0];
  EXPECT_LE(row["clip_error_after"].get<double>(), row["clip_error_before"].get<double>());
  EXPECT_GT(row["clipped_block_columns"].get<int64_t>(), 0) << row.dump();
  EXPECT_LT(row["clip_error_after"].get<double>(), row["clip_error_before"].get<double>());
  // Scaling multiplies row k by one s_k; clipping leaves some entries of a row below that.
  const std::vector<float> w0 = original.find_initializer("wq")->to_f32();
  const std::vector<float> w1 = g.find_initializer("wq")->to_f32();
  int64_t clipped = 0;
  for (int64_t k = 0; k < kK; ++k) {
    double s_k = 0.0;
    for (int64_t j = 0; j < kK; ++j) {
      const auto i = static_cast<size_t>(k * kK + j);
      s_k = std::max(s_k, std::fabs(static_cast<double>(w1[i]) / w0[i]));
    }
    for (int64_t j = 0; j < kK; ++j) {
      const auto i = static_cast<size_t>(k * kK + j);
      clipped += std::fabs(static_cast<double>(w1[i]) / w0[i]) < 0.999 * s_k ? 1 : 0;
    }
  }
  EXPECT_GT(clipped, 0);
}

// AwqOptions::clip_scales: the clip search picks each block's scale, among ratio * amax / 7 and
// the signed ratio * amax / 8, and `after` is exactly the sample error of rounding with the
// scales it returns (no clamp first); amax / 7 is the first candidate, so `before` is the same
// as without it. Same scales for any thread count.
TEST(Awq, ClipSearchWithScalesReturnsTheScalesItMeasured) {
  constexpr int64_t k = 64, n = 24, rows = 96, block = 32;
  AwqActivation act;
  act.channels = k;
  act.sample = outlier_input(rows, k, 21, 6.0f).to_f32();
  AwqMember m;
  m.n = n;
  m.w = outlier_input(k, n, 22).to_f32();
  for (int64_t c = 0; c < n; ++c)  // one large weight per column, of either sign
    m.w[static_cast<size_t>(((c * 7) % k) * n + c)] = (c % 2 == 0 ? 5.0f : -5.0f);
  const std::vector<float> s(static_cast<size_t>(k), 1.0f);
  AwqOptions o;
  o.block_size = block;
  const AwqClip plain = awq_search_clip(act, s, m, o);
  o.clip_scales = true;
  const int saved = cpu_threads();
  set_cpu_threads(1);
  const AwqClip one = awq_search_clip(act, s, m, o);
  set_cpu_threads(4);
  const AwqClip four = awq_search_clip(act, s, m, o);
  set_cpu_threads(saved);
  EXPECT_TRUE(plain.scale.empty());
  ASSERT_EQ(one.scale.size(), static_cast<size_t>((k / block) * n));
  EXPECT_EQ(one.scale, four.scale);
  EXPECT_EQ(one.after, four.after);
  EXPECT_DOUBLE_EQ(one.before, plain.before);
  EXPECT_LT(one.after, one.before);
  int negative = 0;
  double error = 0.0;
  for (int64_t c = 0; c < n; ++c) {
    std::vector<double> d(static_cast<size_t>(k));
    for (int64_t r = 0; r < k; ++r) {
      const float sc = f16_to_f32(one.scale[static_cast<size_t>((r / block) * n + c)]);
      const float w = m.w[static_cast<size_t>(r * n + c)];
      d[static_cast<size_t>(r)] = w - std::clamp(std::nearbyint(w / sc), -8.0f, 7.0f) * sc;
    }
    for (int64_t b = 0; b < k / block; ++b) {
      const uint16_t bits = one.scale[static_cast<size_t>(b * n + c)];
      negative += (bits & 0x8000) != 0 ? 1 : 0;
      double amax = 0.0;
      for (int64_t r = b * block; r < (b + 1) * block; ++r)
        amax = std::max(amax, std::fabs(static_cast<double>(m.w[static_cast<size_t>(r * n + c)])));
      EXPECT_LE(std::fabs(f16_to_f32(bits)), amax / 7.0 * 1.001) << "block " << b << " col " << c;
      EXPECT_GE(std::fabs(f16_to_f32(bits)), 0.55 * amax / 8.0 * 0.999);
      double e = 0.0;  // this block's share of the output error, as the search measures it
      for (int64_t i = 0; i < rows; ++i) {
        double y = 0.0;
        for (int64_t r = b * block; r < (b + 1) * block; ++r)
          y += static_cast<double>(act.sample[static_cast<size_t>(i * k + r)]) *
               d[static_cast<size_t>(r)];
        e += y * y;
      }
      error += e;
    }
  }
  EXPECT_NEAR(one.after, error, 1e-4 * error);
  EXPECT_GT(negative, 0);  // the signed candidates are used on this data
}

TEST(Awq, SameGraphForAnyThreadCount) {
  auto convert = [](int threads) {
    set_cpu_threads(threads);
    Graph g = qkv_graph("residual");
    W4A16Options o = options(32);
    o.method = W4Method::Awq;
    o.awq = std::make_shared<AwqCalibration>(
        calibrate(g, plan_w4a16_targets(g, options(32)), calib_batches(kK)));
    run_pass(g, o);
    return g;
  };
  const int saved = cpu_threads();
  const Graph one = convert(1), four = convert(4);
  set_cpu_threads(saved);
  ASSERT_EQ(one.initializers().size(), four.initializers().size());
  for (size_t i = 0; i < one.initializers().size(); ++i) {
    EXPECT_EQ(one.initializers()[i].first, four.initializers()[i].first);
    EXPECT_TRUE(one.initializers()[i].second.equals(four.initializers()[i].second))
        << one.initializers()[i].first;
  }
}

TEST(Awq, ReservoirKeepsAFixedNumberOfRowsAndTheMean) {
  std::map<std::string, int64_t> channels{{"x", 4}};
  AwqObserver obs(channels, 10);
  std::vector<float> v(4 * 100);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 4) - 1.5f;
  for (int b = 0; b < 3; ++b) obs.observe("x", Tensor::from_f32(v, {100, 4}));
  obs.observe("other", Tensor::from_f32(v, {100, 4}));
  obs.observe("x", Tensor::from_f32(std::vector<float>(6, 1.0f), {2, 3}));  // wrong K: ignored
  const AwqActivation& a = obs.activations().at("x");
  EXPECT_EQ(a.rows, 300u);
  EXPECT_EQ(a.sample_rows(), 10);
  const std::vector<float> m = a.mean_abs();
  EXPECT_FLOAT_EQ(m[0], 1.5f);
  EXPECT_FLOAT_EQ(m[1], 0.5f);
  EXPECT_EQ(obs.activations().count("other"), 0u);
}

TEST(Awq, PassWithoutCalibrationFails) {
  Graph g = qkv_graph("ln");
  W4A16Options o = options(32);
  o.method = W4Method::Awq;
  EXPECT_THROW(run_pass(g, o), Error);
  EXPECT_EQ(parse_w4_method("awq"), W4Method::Awq);
  EXPECT_THROW(parse_w4_method("hqq"), Error);
}

}  // namespace
}  // namespace qforge::test::w4a16
