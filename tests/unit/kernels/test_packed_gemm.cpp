// kernels/packed_gemm.h: every element of C is one fused multiply-add chain in k order, bit for
// bit, whatever the shape, the transpose, the thread count or the split into tasks.
#include "kernels/packed_gemm.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <random>
#include <vector>

namespace qforge {
namespace {

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

struct Case {
  int64_t m, k, n;
  bool trans;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << "m=" << c.m << " k=" << c.k << " n=" << c.n << (c.trans ? " transposed" : "");
}

class PackedGemm : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (!packed_gemm_supported()) GTEST_SKIP() << "this CPU lacks AVX2/FMA, the packed kernel's";
  }
};

TEST_P(PackedGemm, EveryElementIsOneFmaChainInKOrderAtAnyThreadCount) {
  const Case p = GetParam();
  const auto a = random_floats(static_cast<size_t>(p.m * p.k), 1);
  const auto b = random_floats(static_cast<size_t>(p.k * p.n), 2);
  const auto c0 = random_floats(static_cast<size_t>(p.m * p.n), 3);
  // op(B)[kk, j]: B stored [n, k] when transposed.
  const auto bv = [&](int64_t kk, int64_t j) {
    return p.trans ? b[static_cast<size_t>(j * p.k + kk)] : b[static_cast<size_t>(kk * p.n + j)];
  };
  const PackedMatrix packed(b.data(), p.k, p.n, p.trans ? p.k : p.n, p.trans);
  ASSERT_EQ(packed.k(), p.k);
  ASSERT_EQ(packed.n(), p.n);
  for (const bool accumulate : {false, true}) {
    std::vector<float> want(c0.size());
    for (int64_t i = 0; i < p.m; ++i) {
      for (int64_t j = 0; j < p.n; ++j) {
        const size_t at = static_cast<size_t>(i * p.n + j);
        float acc = accumulate ? c0[at] : 0.0f;
        for (int64_t kk = 0; kk < p.k; ++kk) {
          acc = std::fma(a[static_cast<size_t>(i * p.k + kk)], bv(kk, j), acc);
        }
        want[at] = acc;
      }
    }
    for (const int threads : {1, 2, 3}) {
      std::vector<float> got = c0;
      gemm_f32_packed(threads, p.m, a.data(), p.k, packed, got.data(), p.n, accumulate);
      for (size_t at = 0; at < want.size(); ++at) {
        ASSERT_EQ(std::bit_cast<uint32_t>(got[at]), std::bit_cast<uint32_t>(want[at]))
            << "element " << at << " of m=" << p.m << " k=" << p.k << " n=" << p.n
            << " trans=" << p.trans << " accumulate=" << accumulate << " threads=" << threads
            << ": " << got[at] << " against " << want[at];
      }
    }
  }
}

// One row and one column; rows in uneven groups of 6; depths across the 512-deep passes; rows
// across the 192-row tasks; columns short of, at and past 16-column panels and 8-panel groups.
INSTANTIATE_TEST_SUITE_P(Shapes, PackedGemm,
                         ::testing::Values(Case{1, 1, 1, false}, Case{5, 3, 17, false},
                                           Case{32, 384, 40, true}, Case{13, 1100, 33, false},
                                           Case{200, 70, 300, true}, Case{7, 16, 129, false},
                                           Case{400, 520, 48, false}));

TEST(PackedGemmEdges, DepthZeroGivesZerosOrLeavesCAsItWas) {
  if (!packed_gemm_supported()) GTEST_SKIP() << "this CPU lacks AVX2/FMA, the packed kernel's";
  const PackedMatrix packed(nullptr, 0, 20, 20, false);
  const std::vector<float> a(3, 1.0f);
  std::vector<float> c(60, 7.0f);
  gemm_f32_packed(2, 3, a.data(), 0, packed, c.data(), 20, true);
  EXPECT_EQ(c, std::vector<float>(60, 7.0f));
  gemm_f32_packed(2, 3, a.data(), 0, packed, c.data(), 20, false);
  EXPECT_EQ(c, std::vector<float>(60, 0.0f));
}

TEST(PackedGemmEdges, StridedAAndCLeaveTheGapsAlone) {
  if (!packed_gemm_supported()) GTEST_SKIP() << "this CPU lacks AVX2/FMA, the packed kernel's";
  const int64_t m = 9, k = 20, n = 19, lda = 23, ldc = 31;
  const auto a = random_floats(static_cast<size_t>(m * lda), 4);
  const auto b = random_floats(static_cast<size_t>(k * n), 5);
  const PackedMatrix packed(b.data(), k, n, n, false);
  std::vector<float> c(static_cast<size_t>(m * ldc), -3.0f);
  gemm_f32_packed(1, m, a.data(), lda, packed, c.data(), ldc, false);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < ldc; ++j) {
      const float got = c[static_cast<size_t>(i * ldc + j)];
      if (j >= n) {
        ASSERT_EQ(got, -3.0f) << "row " << i << " column " << j << " is past n";
        continue;
      }
      double want = 0.0;
      for (int64_t kk = 0; kk < k; ++kk) {
        want += double(a[static_cast<size_t>(i * lda + kk)]) * b[static_cast<size_t>(kk * n + j)];
      }
      ASSERT_NEAR(got, want, 1e-4 * (1.0 + std::abs(want))) << "row " << i << " column " << j;
    }
  }
}

}  // namespace
}  // namespace qforge
