// search_budget() on a chain of Mul nodes whose constants stand for each layer's rounding: the
// ranking by sensitivity, the fewest layers kept, a three-rung ladder, an unreachable budget,
// and galloping + halving finding what linear greedy finds.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "ir/error.h"
#include "quant/budget/budget_search.h"

using namespace qforge;

namespace {

// y = x * c_0 * c_1 * ... over [N, 4] f32; layer i on rung r multiplies by 1 + err[r][i].
struct Chain {
  std::vector<std::vector<double>> err;  // [rung][layer]

  size_t layers() const { return err.front().size(); }

  Graph build(const std::vector<int>& rung_of) const {
    Graph g;
    g.inputs.push_back(
        {"x", DType::F32, std::vector<Dim>{Dim{std::nullopt, "N"}, Dim{4, ""}}, ""});
    g.outputs.push_back({"y", DType::F32, std::nullopt, ""});
    std::string prev = "x";
    for (size_t i = 0; i < layers(); ++i) {
      const std::string c = "c" + std::to_string(i);
      const float v = static_cast<float>(1.0 + err[static_cast<size_t>(rung_of[i])][i]);
      g.set_initializer(c, Tensor::from_f32(std::vector<float>{v}, {1}));
      const std::string out = i + 1 == layers() ? "y" : "v" + std::to_string(i);
      g.nodes.push_back(Node{"m" + std::to_string(i), "Mul", "", {prev, c}, {out}, {}, ""});
      prev = out;
    }
    g.set_opset("", 17);
    return g;
  }

  BudgetProblem problem(std::vector<std::string> rungs) const {
    BudgetProblem p;
    for (size_t i = 0; i < layers(); ++i) p.layers.push_back("m" + std::to_string(i));
    p.rungs = std::move(rungs);
    p.build = [this](const std::vector<int>& r) { return build(r); };
    return p;
  }
};

std::vector<EvalBatch> batches() {
  std::vector<float> x;
  for (int i = 0; i < 8 * 4; ++i) x.push_back(std::sin(0.37f * static_cast<float>(i)) + 0.1f);
  EvalBatch b;
  b.inputs.emplace_back("x", Tensor::from_f32(x, {8, 4}));
  return {b};
}

BudgetResult search(const Chain& chain, const BudgetTarget& target,
                    std::vector<std::string> rungs = {"low", "float"}) {
  // The float model: every constant 1.
  Chain ones{{std::vector<double>(chain.layers(), 0.0)}};
  const BudgetEvaluator evaluator(ones.build(std::vector<int>(chain.layers(), 0)), batches(), "",
                                  1, false);
  return search_budget(chain.problem(std::move(rungs)), evaluator, target);
}

}  // namespace

TEST(BudgetSearch, KeepsTheMostSensitiveFirstAndNoMore) {
  // Errors 0.001, 0.1, 0.01, 0.03: ranking m1, m3, m2, m0. SQNR >= 30 dB needs a relative
  // error below 0.0316: m1 kept leaves 0.041 (27.7 dB), m1 and m3 0.011 (39 dB).
  const Chain chain{{{0.001, 0.1, 0.01, 0.03}, {0, 0, 0, 0}}};
  BudgetTarget target;
  target.min_sqnr_db = 30.0;
  const BudgetResult r = search(chain, target);
  ASSERT_TRUE(r.reachable);
  EXPECT_EQ(r.ranking, (std::vector<std::string>{"m1", "m3", "m2", "m0"}));
  EXPECT_EQ(r.rung_of, (std::vector<int>{0, 1, 0, 1}));
  EXPECT_GE(r.metric.sqnr_db, 30.0);
  ASSERT_EQ(r.sensitivity.size(), 4u);
  EXPECT_GT(r.sensitivity[0].sqnr_db, r.sensitivity[1].sqnr_db);
  // top, bottom, 4 alone, then kept 1 (misses) and 2 (meets).
  ASSERT_EQ(r.trials.size(), 8u);
  EXPECT_EQ(r.trials[0].what, "top");
  EXPECT_FALSE(r.trials[1].meets);
  EXPECT_FALSE(r.trials[6].meets);
  EXPECT_TRUE(r.trials[7].meets);
  EXPECT_EQ(r.trials[7].kept, 2);
}

TEST(BudgetSearch, BottomMeetingStopsAtOnce) {
  const Chain chain{{{0.001, 0.002}, {0, 0}}};
  BudgetTarget target;
  target.min_cosine = 0.5;
  const BudgetResult r = search(chain, target);
  ASSERT_TRUE(r.reachable);
  EXPECT_EQ(r.rung_of, (std::vector<int>{0, 0}));
  EXPECT_EQ(r.trials.size(), 2u);
  EXPECT_TRUE(r.ranking.empty());
}

TEST(BudgetSearch, UnreachableWhenTheTopMisses) {
  // The top rung itself is off by 1e-3 per layer (as fp16 activations are): 60 dB at best.
  const Chain chain{{{0.1, 0.1}, {1e-3, 1e-3}}};
  BudgetTarget target;
  target.min_sqnr_db = 80.0;
  const BudgetResult r = search(chain, target);
  EXPECT_FALSE(r.reachable);
  ASSERT_EQ(r.trials.size(), 1u);  // nothing tried after the top
  EXPECT_LT(r.metric.sqnr_db, 80.0);
}

TEST(BudgetSearch, ThreeRungsTryTheMiddleRungForEveryLayerFirst) {
  // Rung 1 halves nothing useful for m0: 0.2 -> 0.15; only float fixes it.
  const Chain chain{{{0.2, 0.01, 0.01}, {0.15, 0.0001, 0.0001}, {0, 0, 0}}};
  BudgetTarget target;
  target.min_sqnr_db = 30.0;
  const BudgetResult r = search(chain, target, {"int4", "int8", "float"});
  ASSERT_TRUE(r.reachable);
  EXPECT_EQ(r.ranking.front(), "m0");
  EXPECT_EQ(r.rung_of[0], 2);  // float
  EXPECT_GE(r.metric.sqnr_db, 30.0);
  // It went through all three on int8 before moving m0 to float.
  bool all_int8 = false;
  for (const BudgetTrial& t : r.trials) all_int8 |= t.rung_of == std::vector<int>{1, 1, 1};
  EXPECT_TRUE(all_int8);
}

TEST(BudgetSearch, GallopingFindsTheFewestLinearGreedyFinds) {
  // 12 layers of decreasing error: each target needs a known number of them kept.
  std::vector<double> low;
  for (int i = 0; i < 12; ++i) low.push_back(0.02 * std::pow(0.8, i));
  const Chain chain{{low, std::vector<double>(12, 0.0)}};
  for (double db : {20.0, 25.0, 30.0, 35.0, 40.0}) {
    BudgetTarget target;
    target.min_sqnr_db = db;
    const BudgetResult r = search(chain, target);
    ASSERT_TRUE(r.reachable);
    // Linear greedy: the first k (most sensitive = largest error) that meet the target.
    size_t fewest = 12;
    for (size_t k = 0; k <= 12; ++k) {
      std::vector<int> state(12, 0);
      for (size_t j = 0; j < k; ++j) state[j] = 1;
      Chain ones{{std::vector<double>(12, 0.0)}};
      const BudgetEvaluator ev(ones.build(std::vector<int>(12, 0)), batches(), "", 1, false);
      if (ev.evaluate(chain.build(state)).meets(target)) {
        fewest = k;
        break;
      }
    }
    int kept = 0;
    for (int v : r.rung_of) kept += v > 0;
    EXPECT_EQ(static_cast<size_t>(kept), fewest) << db << " dB";
  }
}

TEST(BudgetSearch, MaxDropNeedsLabels) {
  Chain ones{{{0.0}}};
  EXPECT_THROW(BudgetEvaluator(ones.build({0}), batches(), "", 1, /*needs_labels=*/true), Error);
}

namespace {

// y = x + d over x [2, 3, 2] with an unused attention_mask input; d [3, 2] a constant.
Graph add_graph(const std::vector<float>& d) {
  Graph g;
  const std::vector<Dim> bs{Dim{std::nullopt, "batch"}, Dim{std::nullopt, "seq"}};
  std::vector<Dim> xs = bs;
  xs.push_back(Dim{2, ""});
  g.inputs.push_back({"x", DType::F32, xs, ""});
  g.inputs.push_back({"attention_mask", DType::I64, bs, ""});
  g.outputs.push_back({"y", DType::F32, std::nullopt, ""});
  g.set_initializer("d", Tensor::from_f32(d, {3, 2}));
  g.nodes.push_back(Node{"add", "Add", "", {"x", "d"}, {"y"}, {}, ""});
  g.set_opset("", 17);
  return g;
}

double cosine_of(const std::vector<double>& a, const std::vector<double>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ab += a[i] * b[i];
    aa += a[i] * a[i];
    bb += b[i] * b[i];
  }
  return ab / std::sqrt(aa * bb);
}

}  // namespace

TEST(BudgetEvaluator, MeanPoolComparesEachSamplesEmbeddingOverRealTokens) {
  // Sample 0: tokens 0 and 1 real; sample 1: token 0 real. The trial's error at the padded
  // positions (t = 2 everywhere, t = 1 in sample 1) is huge and must not count.
  const std::vector<float> x{1, 2, 3, -1, 9, 9, 2, 1, 9, 9, 9, 9};
  Tensor xt = Tensor::from_f32(x, {2, 3, 2});
  Tensor mask(DType::I64, {2, 3});
  auto mv = mask.mutable_data<int64_t>();
  const int64_t m[] = {1, 1, 0, 1, 0, 0};
  std::copy(std::begin(m), std::end(m), mv.begin());
  EvalBatch b;
  b.inputs = {{"x", xt}, {"attention_mask", mask}};
  const std::vector<float> zero(6, 0.0f), d{0.5f, 0.0f, 0.0f, 0.25f, 100.0f, -100.0f};
  const BudgetEvaluator pooled(add_graph(zero), {b}, "attention_mask", 1, false, BudgetPool::Mean);
  const BudgetEvaluator tokens(add_graph(zero), {b}, "attention_mask", 1, false);
  const BudgetMetric mp = pooled.evaluate(add_graph(d));
  const BudgetMetric mt = tokens.evaluate(add_graph(d));
  // Sample 0: mean of (1,2) and (3,-1) = (2, 0.5); with d: mean of (1.5,2) and (3,-0.75).
  // Sample 1: (2, 1) against (2.5, 1).
  const double c0 = cosine_of({2.0, 0.5}, {2.25, 0.625});
  const double c1 = cosine_of({2.0, 1.0}, {2.5, 1.0});
  EXPECT_NEAR(mp.cosine, (c0 + c1) / 2, 1e-12);
  // Token by token: the three real rows together.
  const double ct = cosine_of({1, 2, 3, -1, 2, 1}, {1.5, 2, 3, -0.75, 2.5, 1});
  EXPECT_NEAR(mt.cosine, ct, 1e-12);
  EXPECT_GT(std::abs(mp.cosine - mt.cosine), 1e-4);
  // The float model against itself: exact either way.
  EXPECT_EQ(pooled.evaluate(add_graph(zero)).cosine, 1.0);
}
