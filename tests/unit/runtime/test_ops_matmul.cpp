// MatMul and Gemm: hand-computed small cases and naive references on random data that spans
// several gemm tiles.
#include <gtest/gtest.h>

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
