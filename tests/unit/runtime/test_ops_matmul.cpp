// MatMul and Gemm: hand-computed small cases and naive references on random data that spans
// several gemm tiles; constant weights, which the executor packs, against the FMA chain that
// kernels/packed_gemm.h promises.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>

#include "kernels/packed_gemm.h"
#include "runtime/op_utils.h"
#include "tests/unit/runtime/runtime_test_util.h"

using namespace qforge;
using namespace qforge::rt_test;

namespace {

// Naive batched matmul of row-major a [b, m, k] and b [b, k, n] (double accumulation).
std::vector<float> naive_matmul(const std::vector<float>& a, const std::vector<float>& b,
                                int64_t batch, int64_t m, int64_t k, int64_t n, bool b_shared) {
  std::vector<float> c(static_cast<size_t>(batch * m * n));
  for (int64_t z = 0; z < batch; ++z) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p) {
          s += static_cast<double>(a[static_cast<size_t>((z * m + i) * k + p)]) *
               b[static_cast<size_t>(((b_shared ? 0 : z) * k + p) * n + j)];
        }
        c[static_cast<size_t>((z * m + i) * n + j)] = static_cast<float>(s);
      }
    }
  }
  return c;
}

}  // namespace

TEST(MatMul, TwoByTwo) {
  const Tensor y =
      run1({"MatMul", {f32({2, 3}, {1, 2, 3, 4, 5, 6}), f32({3, 2}, {7, 8, 9, 10, 11, 12})}});
  EXPECT_EQ(y.shape(), (Shape{2, 2}));
  EXPECT_EQ(values<float>(y), (std::vector<float>{58, 64, 139, 154}));
}

TEST(MatMul, VectorOperandsDropTheirUnitDim) {
  const Tensor m = f32({2, 2}, {1, 2, 3, 4});
  Tensor y = run1({"MatMul", {f32({2}, {1, 1}), m}});
  EXPECT_EQ(y.shape(), (Shape{2}));
  EXPECT_EQ(values<float>(y), (std::vector<float>{4, 6}));
  y = run1({"MatMul", {m, f32({2}, {1, 1})}});
  EXPECT_EQ(y.shape(), (Shape{2}));
  EXPECT_EQ(values<float>(y), (std::vector<float>{3, 7}));
  y = run1({"MatMul", {f32({2}, {1, 2}), f32({2}, {3, 4})}});
  EXPECT_EQ(y.shape(), (Shape{}));
  EXPECT_EQ(values<float>(y), (std::vector<float>{11}));
}

TEST(MatMul, BroadcastsBatchDims) {
  // a [2,1,2,2] x b [3,2,2] -> [2,3,2,2]
  const Tensor a = random_f32({2, 1, 2, 2}, 11), b = random_f32({3, 2, 2}, 12);
  const Tensor y = run1({"MatMul", {a, b}});
  ASSERT_EQ(y.shape(), (Shape{2, 3, 2, 2}));
  const auto av = values<float>(a), bv = values<float>(b), yv = values<float>(y);
  for (int64_t i = 0; i < 2; ++i) {
    for (int64_t j = 0; j < 3; ++j) {
      const std::vector<float> am(av.begin() + i * 4, av.begin() + i * 4 + 4);
      const std::vector<float> bm(bv.begin() + j * 4, bv.begin() + j * 4 + 4);
      const auto want = naive_matmul(am, bm, 1, 2, 2, 2, true);
      for (size_t e = 0; e < 4; ++e)
        EXPECT_NEAR(yv[static_cast<size_t>((i * 3 + j) * 4) + e], want[e], 1e-6f);
    }
  }
  EXPECT_EQ(
      catch_error([] {
        run1({"MatMul", {f32({2, 3}, std::vector<float>(6)), f32({2, 3}, std::vector<float>(6))}});
      }).message,
      "op 'MatMul' (node 'n'): shapes [2, 3] and [2, 3] cannot be multiplied (inner dims 3 and 2)");
}

TEST(MatMul, LargeProductsMatchNaiveAcrossTiles) {
  // M, N past the tile edges (64 x 256), shared B folded into M, and per-batch B.
  const Tensor a = random_f32({3, 70, 130}, 21), b = random_f32({130, 300}, 22);
  Tensor y = run1({"MatMul", {a, b}});
  ASSERT_EQ(y.shape(), (Shape{3, 70, 300}));
  auto want = naive_matmul(values<float>(a), values<float>(b), 3, 70, 130, 300, true);
  auto got = values<float>(y);
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-4f) << i;
  const Tensor b3 = random_f32({3, 130, 300}, 23);
  y = run1({"MatMul", {a, b3}});
  want = naive_matmul(values<float>(a), values<float>(b3), 3, 70, 130, 300, false);
  got = values<float>(y);
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-4f) << i;
}

TEST(Gemm, TransposesAlphaBetaAndBroadcastC) {
  const Tensor a = f32({3, 2}, {1, 4, 2, 5, 3, 6});     // A^T of [[1,2,3],[4,5,6]]
  const Tensor b = f32({2, 3}, {7, 9, 11, 8, 10, 12});  // B^T of [[7,8],[9,10],[11,12]]
  const std::vector<Attribute> t = {attr_int("transA", 1), attr_int("transB", 1)};
  EXPECT_EQ(values<float>(run1({"Gemm", {a, b}, t})), (std::vector<float>{58, 64, 139, 154}));
  // C as [N], scaled by beta, plus alpha.
  std::vector<Attribute> ab = t;
  ab.push_back(attr_float("alpha", 2));
  ab.push_back(attr_float("beta", 0.5f));
  EXPECT_EQ(values<float>(run1({"Gemm", {a, b, f32({2}, {2, 4})}, ab})),
            (std::vector<float>{117, 130, 279, 310}));
  // C as [M,1] and as a scalar.
  EXPECT_EQ(values<float>(run1({"Gemm", {a, b, f32({2, 1}, {1, 2})}, t})),
            (std::vector<float>{59, 65, 141, 156}));
  EXPECT_EQ(values<float>(run1({"Gemm", {a, b, f32({}, {1})}, t})),
            (std::vector<float>{59, 65, 140, 155}));
  const auto e = catch_error([&] { run1({"Gemm", {a, b, f32({3}, {1, 2, 3})}, t}); });
  EXPECT_EQ(e.message, "op 'Gemm' (node 'n'): C [3] does not broadcast to [M, N] = [2, 2]");
}

TEST(Gemm, NoTransposeMatchesNaive) {
  const Tensor a = random_f32({100, 40}, 31), b = random_f32({40, 270}, 32);
  const Tensor y = run1({"Gemm", {a, b}});
  const auto want = naive_matmul(values<float>(a), values<float>(b), 1, 100, 40, 270, true);
  const auto got = values<float>(y);
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-4f) << i;
}

// Constant weights (initializers), which the executor packs once (kernels/packed_gemm.h).
namespace {

// y = op(a, w [, c]) with w an initializer; `w_is_input` also lists w as a graph input, so a
// feed may replace it.
Graph weight_graph(const std::string& op, const Tensor& w, const Tensor& c,
                   std::vector<Attribute> attrs, bool w_is_input = false) {
  Graph g;
  g.set_opset("", 21);
  g.inputs.push_back({.name = "a", .dtype = DType::F32});
  if (w_is_input) g.inputs.push_back({.name = "w", .dtype = w.dtype()});
  g.set_initializer("w", w);
  Node n;
  n.name = "n";
  n.op_type = op;
  n.attributes = std::move(attrs);
  n.inputs = {"a", "w"};
  if (!c.empty()) {
    g.set_initializer("c", c);
    n.inputs.push_back("c");
  }
  n.outputs = {"y"};
  g.nodes.push_back(std::move(n));
  g.outputs.push_back({.name = "y"});
  return g;
}

Tensor run_weight_graph(const Graph& g, const Tensor& a, int threads, bool pack,
                        const std::vector<std::pair<std::string, Tensor>>& more = {}) {
  const Executor ex(g, {.device = Device::Cpu, .threads = threads, .pack_weights = pack});
  std::vector<std::pair<std::string, Tensor>> feeds = {{"a", a}};
  feeds.insert(feeds.end(), more.begin(), more.end());
  return ex.run(feeds).at(0);
}

// Row i of y: the FMA chain over k in order from `start`, op(W)[kk, j] = w(kk, j).
template <typename W>
std::vector<float> fma_chain(const std::vector<float>& a, int64_t m, int64_t k, int64_t n, W w,
                             const std::vector<float>& start) {
  std::vector<float> y(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float acc = start.empty() ? 0.0f : start[static_cast<size_t>(j)];
      for (int64_t kk = 0; kk < k; ++kk) {
        acc = std::fma(a[static_cast<size_t>(i * k + kk)], w(kk, j), acc);
      }
      y[static_cast<size_t>(i * n + j)] = acc;
    }
  }
  return y;
}

}  // namespace

TEST(MatMul, ConstantWeightRunsPackedAtAnyThreadCountAndBatch) {
  if (!packed_gemm_supported()) GTEST_SKIP() << "this CPU lacks AVX2/FMA, the packed kernel's";
  const int64_t k = 600, n = 70;
  const Tensor w = random_f32({k, n}, 41);
  const auto wv = values<float>(w);
  const Graph g = weight_graph("MatMul", w, Tensor(), {});
  const Tensor a = random_f32({2, 5, k}, 42);
  const auto av = values<float>(a);
  const auto w_at = [&](int64_t kk, int64_t j) { return wv[static_cast<size_t>(kk * n + j)]; };
  const auto want = fma_chain(av, 10, k, n, w_at, {});
  expect_same_bits(values<float>(run_weight_graph(g, a, 1, true)), want, "1 thread");
  expect_same_bits(values<float>(run_weight_graph(g, a, 3, true)), want, "3 threads");
  // One sample alone gives its rows of the batch, bit for bit.
  const Tensor one = f32({1, 5, k}, std::vector<float>(av.begin(), av.begin() + 5 * k));
  expect_same_bits(values<float>(run_weight_graph(g, one, 2, true)),
                   std::vector<float>(want.begin(), want.begin() + 5 * n), "first sample alone");
  // Unpacked, the same product within rounding.
  const auto plain = values<float>(run_weight_graph(g, a, 1, false));
  for (size_t i = 0; i < plain.size(); ++i) ASSERT_NEAR(plain[i], want[i], 1e-4f) << i;
}

TEST(MatMul, ProductsOfTwoComputedOperandsAreFmaChainsAtAnyThreadCount) {
  if (!packed_gemm_supported()) GTEST_SKIP() << "this CPU lacks AVX2/FMA, the packed kernel's";
  // Three products, as attention's heads: fewer than 4 threads share them, 4 share each one.
  const int64_t batch = 3, m = 13, k = 70, n = 35;
  const Tensor a = random_f32({batch, m, k}, 45), b = random_f32({batch, k, n}, 46);
  const auto av = values<float>(a), bv = values<float>(b);
  std::vector<float> want;
  for (int64_t z = 0; z < batch; ++z) {
    const std::vector<float> az(av.begin() + z * m * k, av.begin() + (z + 1) * m * k);
    const auto b_at = [&](int64_t kk, int64_t j) {
      return bv[static_cast<size_t>((z * k + kk) * n + j)];
    };
    const auto c = fma_chain(az, m, k, n, b_at, {});
    want.insert(want.end(), c.begin(), c.end());
  }
  for (int threads : {1, 2, 4}) {
    expect_same_bits(values<float>(run_node({"MatMul", {a, b}}, threads).at(0)), want,
                     std::to_string(threads) + " threads");
  }
}

TEST(MatMul, HalfConstantWeightIsPackedAsItsFloatValues) {
  if (!packed_gemm_supported()) GTEST_SKIP() << "this CPU lacks AVX2/FMA, the packed kernel's";
  const int64_t k = 40, n = 24;
  const Tensor w16 = ops::from_f32(random_f32({k, n}, 43), DType::F16);
  const auto wv = values<float>(ops::to_f32(w16));
  Graph g = weight_graph("MatMul", w16, Tensor(), {});
  g.inputs[0].dtype = DType::F16;
  const Tensor a16 = ops::from_f32(random_f32({3, k}, 44), DType::F16);
  const Executor ex(g, {.device = Device::Cpu, .threads = 2, .half_compute = HalfCompute::PerOp});
  const Tensor y = ops::to_f32(ex.run({{"a", a16}}).at(0));
  const auto w_at = [&](int64_t kk, int64_t j) { return wv[static_cast<size_t>(kk * n + j)]; };
  const auto want = fma_chain(values<float>(ops::to_f32(a16)), 3, k, n, w_at, {});
  expect_same_bits(values<float>(y), values<float>(ops::to_f32(ops::from_f32(f32({3, n}, want),
                                                                            DType::F16))),
                   "f16 product");
}

TEST(Gemm, ConstantTransposedWeightWithBiasStartsEachChainAtBetaC) {
  if (!packed_gemm_supported()) GTEST_SKIP() << "this CPU lacks AVX2/FMA, the packed kernel's";
  const int64_t m = 9, k = 530, n = 33;
  const Tensor w = random_f32({n, k}, 45);  // transB: W stored [N, K]
  const Tensor c = random_f32({n}, 46);
  const auto wv = values<float>(w), cv = values<float>(c);
  const Graph g = weight_graph("Gemm", w, c, {attr_int("transB", 1), attr_float("beta", 0.5f)});
  const Tensor a = random_f32({m, k}, 47);
  std::vector<float> start(cv.size());
  for (size_t j = 0; j < cv.size(); ++j) start[j] = 0.5f * cv[j];
  const auto w_at = [&](int64_t kk, int64_t j) { return wv[static_cast<size_t>(j * k + kk)]; };
  const auto want = fma_chain(values<float>(a), m, k, n, w_at, start);
  expect_same_bits(values<float>(run_weight_graph(g, a, 1, true)), want, "1 thread");
  expect_same_bits(values<float>(run_weight_graph(g, a, 2, true)), want, "2 threads");
  const auto plain = values<float>(run_weight_graph(g, a, 1, false));
  for (size_t i = 0; i < plain.size(); ++i) ASSERT_NEAR(plain[i], want[i], 1e-4f) << i;
  // alpha != 1 is not packed, and still right.
  const Graph scaled = weight_graph("Gemm", w, c, {attr_int("transB", 1), attr_float("alpha", 2)});
  const auto y2 = values<float>(run_weight_graph(scaled, a, 2, true));
  for (size_t i = 0; i < y2.size(); ++i) {
    ASSERT_NEAR(y2[i], 2.0f * (want[i] - start[i % n]) + cv[i % n], 2e-4f) << i;
  }
}

TEST(MatMul, AnInitializerThatIsAlsoAGraphInputFollowsItsFeed) {
  const Tensor w = random_f32({8, 4}, 48), fed = random_f32({8, 4}, 49);
  const Graph g = weight_graph("MatMul", w, Tensor(), {}, /*w_is_input=*/true);
  const Tensor a = random_f32({3, 8}, 50);
  const auto av = values<float>(a);
  const auto got = values<float>(run_weight_graph(g, a, 1, true, {{"w", fed}}));
  expect_near_all(got, naive_matmul(av, values<float>(fed), 1, 3, 8, 4, true), 1e-5f);
  const auto defaulted = values<float>(run_weight_graph(g, a, 1, true));
  expect_near_all(defaulted, naive_matmul(av, values<float>(w), 1, 3, 8, 4, true), 1e-5f);
}
