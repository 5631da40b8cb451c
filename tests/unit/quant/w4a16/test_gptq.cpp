// GPTQ (quant/gptq.h): lower output error than round-to-nearest on correlated inputs, the same
// scale rule and format (equal to RTN when H is diagonal), dead inputs, thread-count
// independence, and the usage error without calibration.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cli/option_parsers.h"
#include "ir/error.h"
#include "ir/half.h"
#include "kernels/device.h"
#include "kernels/int4.h"
#include "quant/w4a16/awq.h"
#include "quant/w4a16/gptq.h"
#include "quant/w4a16/w4a16.h"
#include "runtime/executor.h"
#include "w4a16_fixtures.h"

namespace qforge::test::w4a16 {
namespace {

// [rows, k] correlated inputs: z [rows, k] normal, x = z M with M = I + 0.6 * (a random mixing):
// neighbouring channels share most of their signal, as a layer's inputs do.
Tensor correlated_input(int64_t rows, int64_t k, uint32_t seed, int dead_channel = -1) {
  std::mt19937 mix_rng(4242);  // one mixing for every batch: the same distribution
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> m(static_cast<size_t>(k * k), 0.0f);
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < k; ++j)
      m[static_cast<size_t>(i * k + j)] = (i == j ? 1.0f : 0.0f) +
                                          0.6f * dist(mix_rng) / std::sqrt(static_cast<float>(k)) +
                                          (std::abs(i - j) <= 2 ? 0.5f : 0.0f);
  std::mt19937 rng(seed);
  std::vector<float> z(static_cast<size_t>(rows * k)), x(static_cast<size_t>(rows * k), 0.0f);
  for (float& v : z) v = dist(rng);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < k; ++i) {
      const float zi = z[static_cast<size_t>(r * k + i)];
      for (int64_t j = 0; j < k; ++j)
        x[static_cast<size_t>(r * k + j)] += zi * m[static_cast<size_t>(i * k + j)];
    }
  if (dead_channel >= 0)
    for (int64_t r = 0; r < rows; ++r) x[static_cast<size_t>(r * k + dead_channel)] = 0.0f;
  return Tensor::from_f32(x, {rows, k});
}

// x -> MatMul(w) -> h -> MatMul(w2) -> y; w2 is the output projection (left float).
Graph layer(int64_t k, int64_t n) {
  Graph g;
  g.name = "gptq";
  g.set_opset("", 17);
  const Dim batch{.param = "batch"};
  g.inputs.push_back(
      {.name = "x", .dtype = DType::F32, .shape = std::vector<Dim>{batch, Dim{.value = k}}});
  g.set_initializer("w", random_weight({k, n}, 11));
  g.set_initializer("w2", random_weight({n, 4}, 12));
  g.nodes.push_back(make_node("fc", "MatMul", {"x", "w"}, {"h"}));
  g.nodes.push_back(make_node("head", "MatMul", {"h", "w2"}, {"y"}));
  g.outputs.push_back(
      {.name = "y", .dtype = DType::F32, .shape = std::vector<Dim>{batch, Dim{.value = 4}}});
  return g;
}

W4A16Options options(int block, W4Method method = W4Method::Rtn) {
  W4A16Options o;
  o.block_size = block;
  o.device = Device::Cpu;
  o.method = method;
  return o;
}

GptqCalibration calibrate(const Graph& g, const std::vector<Tensor>& batches) {
  const auto targets = plan_w4a16_targets(g, options(32));
  GptqObserver observer(awq_activation_channels(g, targets));
  Executor exec(g, {.device = Device::Cpu, .threads = 1});
  exec.set_observer([&](const std::string& n, const Tensor& v) { observer.observe(n, v); });
  for (const Tensor& x : batches) exec.run({{"x", x}});
  GptqCalibration c;
  c.activations = observer.take();
  return c;
}

double sq_error(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.to_f32(), y = b.to_f32();
  double e = 0.0;
  for (size_t i = 0; i < x.size(); ++i) e += (static_cast<double>(x[i]) - y[i]) * (x[i] - y[i]);
  return e;
}

// The layer's output h on x (the float head removed).
Tensor hidden(Graph graph, const Tensor& x, int64_t n) {
  graph.outputs[0].name = "h";
  graph.outputs[0].shape = std::vector<Dim>{Dim{.param = "batch"}, Dim{.value = n}};
  std::erase_if(graph.nodes, [](const Node& node) { return node.name == "head"; });
  return run_graph(graph, x);
}

TEST(Gptq, ObserverSumsXtX) {
  GptqObserver obs({{"x", 3}});
  const std::vector<float> v = {1, 2, 0, -1, 0, 3};  // rows (1, 2, 0), (-1, 0, 3)
  obs.observe("x", Tensor::from_f32(v, {2, 3}));
  obs.observe("x", Tensor::from_f32(v, {1, 2, 3}));
  obs.observe("x", Tensor::from_f32(std::vector<float>(4, 1.0f), {2, 2}));  // wrong K: ignored
  obs.observe("other", Tensor::from_f32(v, {2, 3}));
  const GptqActivation& a = obs.activations().at("x");
  EXPECT_EQ(a.rows, 4u);
  const std::vector<double> expect = {2 * 2, 2 * 2, 2 * -3, 2 * 2, 2 * 4, 0, 2 * -3, 0, 2 * 9};
  ASSERT_EQ(a.h.size(), expect.size());
  for (size_t i = 0; i < expect.size(); ++i) EXPECT_DOUBLE_EQ(a.h[i], expect[i]) << i;
  EXPECT_EQ(obs.activations().count("other"), 0u);
}

// The quantity GPTQ minimises, tr(dW^T H dW), on the calibration data and on held-out rows.
TEST(Gptq, LowerOutputErrorThanRoundToNearestOnCorrelatedInputs) {
  const int64_t k = 256, n = 96;
  const Graph g = layer(k, n);
  const auto calib = std::make_shared<GptqCalibration>(
      calibrate(g, {correlated_input(256, k, 100), correlated_input(256, k, 101)}));
  for (int block : {32, 128}) {
    Graph rtn = g, gptq = g;
    run_pass(rtn, options(block));
    W4A16Options o = options(block, W4Method::Gptq);
    o.gptq = calib;
    const PassReport report = run_pass(gptq, o);
    EXPECT_EQ(report.stats["method"], "gptq");
    EXPECT_EQ(report.stats["quantized"], 1);
    ASSERT_EQ(report.stats["gptq"].size(), 1u);
    const auto& row = report.stats["gptq"][0];
    EXPECT_EQ(row["name"], "w");
    EXPECT_EQ(row["rows"], 512);
    const double proxy_rtn = row["output_error_rtn"].get<double>();
    const double proxy_gptq = row["output_error_gptq"].get<double>();
    EXPECT_LT(proxy_gptq, 0.8 * proxy_rtn) << row.dump();

    // The proxy is the mean squared output error over the calibration rows...
    const Tensor xc = correlated_input(256, k, 100);
    const Tensor ref_c = hidden(g, xc, n);
    const double measured_rtn = sq_error(ref_c, hidden(rtn, xc, n));
    EXPECT_NEAR(proxy_rtn, 2.0 * measured_rtn / 512.0, 0.2 * proxy_rtn);  // half the rows
    // ...and held-out rows show the same gain.
    const Tensor x = correlated_input(512, k, 999);
    const Tensor ref = hidden(g, x, n);
    const double e_rtn = sq_error(ref, hidden(rtn, x, n));
    const double e_gptq = sq_error(ref, hidden(gptq, x, n));
    std::printf(
        "block %d: calibration proxy rtn %.4g gptq %.4g; held-out rtn %.4g gptq %.4g "
        "(ratio %.3f)\n",
        block, proxy_rtn, proxy_gptq, e_rtn, e_gptq, e_gptq / e_rtn);
    EXPECT_LT(e_gptq, 0.85 * e_rtn);
  }
}

// With H diagonal nothing propagates: GPTQ is round-to-nearest with the same scales, bit for
// bit, for either scale rule (the format and the scale rule are the RTN ones).
TEST(Gptq, DiagonalHessianGivesRoundToNearest) {
  const int64_t k = 80, n = 24, bs = 32;  // a partial last block
  const std::vector<float> w = random_weight({k, n}, 5).to_f32();
  std::vector<double> h(static_cast<size_t>(k * k), 0.0);
  for (int64_t i = 0; i < k; ++i) h[static_cast<size_t>(i * k + i)] = 1.0 + 0.1 * (i % 7);
  for (Int4Scale rule : {Int4Scale::Amax, Int4Scale::Mse}) {
    GptqOptions o;
    o.block_size = static_cast<int>(bs);
    o.scale = rule;
    std::vector<int8_t> q(w.size());
    std::vector<uint16_t> s(static_cast<size_t>(int4_block_count(k, bs) * n));
    gptq_quantize(w, k, n, h, o, q, s);
    std::vector<uint16_t> rs(s.size());
    std::vector<uint8_t> packed(static_cast<size_t>(int4_packed_bytes(k * n)));
    quantize_int4_blocked(w, k, n, bs, rs, packed, Device::Cpu, rule);
    std::vector<int8_t> rq(w.size());
    unpack_int4(packed, rq);
    EXPECT_EQ(s, rs) << int4_scale_name(rule);
    EXPECT_EQ(q, rq) << int4_scale_name(rule);
  }
}

// A channel that is always zero (H_kk = 0) gets a zero weight row and does not break the
// factorisation; the other rows still beat RTN.
TEST(Gptq, DeadInputsGetZeroRows) {
  const int64_t k = 64, n = 32;
  const Graph g = layer(k, n);
  const auto calib =
      std::make_shared<GptqCalibration>(calibrate(g, {correlated_input(512, k, 100, 5)}));
  Graph gptq = g;
  W4A16Options o = options(32, W4Method::Gptq);
  o.gptq = calib;
  const PassReport report = run_pass(gptq, o);
  const auto& row = report.stats["gptq"][0];
  EXPECT_EQ(row["dead_inputs"], 1);
  EXPECT_LT(row["output_error_gptq"].get<double>(), row["output_error_rtn"].get<double>());
  const Tensor* q = gptq.find_initializer("w_int4");
  ASSERT_NE(q, nullptr);
  std::vector<int8_t> v(static_cast<size_t>(k * n));
  unpack_int4(q->data<uint8_t>(), v);
  for (int64_t c = 0; c < n; ++c) EXPECT_EQ(v[static_cast<size_t>(5 * n + c)], 0) << c;
  int64_t nonzero = 0;
  for (int64_t c = 0; c < n; ++c) nonzero += v[static_cast<size_t>(6 * n + c)] != 0 ? 1 : 0;
  EXPECT_GT(nonzero, 0);
}

// Gemm with transB (weight stored [N, K]) goes through the same path, transposed.
TEST(Gptq, GemmTransBWeight) {
  const int64_t k = 64, n = 48;
  Graph g = layer(k, n);
  std::vector<float> w = g.find_initializer("w")->to_f32(), wt(w.size());
  for (int64_t r = 0; r < k; ++r)
    for (int64_t c = 0; c < n; ++c)
      wt[static_cast<size_t>(c * k + r)] = w[static_cast<size_t>(r * n + c)];
  g.set_initializer("w", Tensor::from_f32(wt, {n, k}));
  g.nodes[0].op_type = "Gemm";
  g.nodes[0].set_attr(Attribute::make_int("transB", 1));
  const auto calib =
      std::make_shared<GptqCalibration>(calibrate(g, {correlated_input(512, k, 100)}));
  Graph rtn = g, gptq = g;
  run_pass(rtn, options(32));
  W4A16Options o = options(32, W4Method::Gptq);
  o.gptq = calib;
  const PassReport report = run_pass(gptq, o);
  ASSERT_EQ(report.stats["gptq"].size(), 1u);
  const Tensor x = correlated_input(256, k, 999);
  const Tensor ref = hidden(g, x, n);
  EXPECT_LT(sq_error(ref, hidden(gptq, x, n)), 0.9 * sq_error(ref, hidden(rtn, x, n)));
}

// Lazy batches only regroup the same updates: batch sizes 1 (every update applied at once, the
// algorithm as written in the paper), 7 and 128 agree, also with blocks longer than a batch
// (256) and a K that is a multiple of neither (300).
TEST(Gptq, LazyBatchesMatchImmediateUpdates) {
  const int64_t k = 300, n = 40;
  const Graph g = layer(k, n);
  const GptqCalibration c = calibrate(g, {correlated_input(400, k, 100)});
  const std::vector<double>& h = c.activations.begin()->second.h;
  const std::vector<float> w = random_weight({k, n}, 3).to_f32();
  for (int bs : {32, 256}) {
    auto run = [&](int64_t lazy) {
      GptqOptions o;
      o.block_size = bs;
      o.lazy_batch = lazy;
      std::vector<int8_t> q(w.size());
      std::vector<uint16_t> s(static_cast<size_t>(int4_block_count(k, bs) * n));
      gptq_quantize(w, k, n, h, o, q, s);
      return std::make_pair(q, s);
    };
    const auto one = run(1);
    for (int64_t lazy : {7, 128}) {
      const auto other = run(lazy);
      int64_t same = 0;
      for (size_t i = 0; i < one.first.size(); ++i) same += one.first[i] == other.first[i] ? 1 : 0;
      // Sums in another order can move a value across a rounding boundary, rarely.
      EXPECT_GE(static_cast<double>(same), 0.999 * static_cast<double>(one.first.size()))
          << "block " << bs << " lazy " << lazy;
      EXPECT_EQ(one.second.front(), other.second.front()) << "block " << bs << " lazy " << lazy;
    }
  }
}

TEST(Gptq, SameGraphForAnyThreadCount) {
  const int64_t k = 192, n = 80;
  auto convert = [&](int threads) {
    set_cpu_threads(threads);
    Graph g = layer(k, n);
    W4A16Options o = options(64, W4Method::Gptq);
    o.gptq = std::make_shared<GptqCalibration>(
        calibrate(g, {correlated_input(300, k, 100), correlated_input(200, k, 101)}));
    run_pass(g, o);
    return g;
  };
  const int saved = cpu_threads();
  const Graph one = convert(1), three = convert(3);
  set_cpu_threads(saved);
  ASSERT_EQ(one.initializers().size(), three.initializers().size());
  for (size_t i = 0; i < one.initializers().size(); ++i) {
    EXPECT_EQ(one.initializers()[i].first, three.initializers()[i].first);
    EXPECT_TRUE(one.initializers()[i].second.equals(three.initializers()[i].second))
        << one.initializers()[i].first;
  }
}

TEST(Gptq, PassWithoutCalibrationFails) {
  Graph g = layer(64, 32);
  try {
    run_pass(g, options(32, W4Method::Gptq));
    FAIL() << "expected a usage error";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::Usage);
    EXPECT_NE(std::string(e.what()).find("--calib"), std::string::npos) << e.what();
  }
  EXPECT_EQ(parse_w4_method("gptq"), W4Method::Gptq);
  EXPECT_EQ(w4_method_name(W4Method::Gptq), "gptq");
  EXPECT_EQ(default_int4_scale(W4Method::Gptq), Int4Scale::Mse);
}

}  // namespace
}  // namespace qforge::test::w4a16
