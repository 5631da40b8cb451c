// kernels/gemm.h: the one matrix-product family, against a naive reference; and
// kernels/packed_gemm.h, the products of a weight packed once, against the FMA chain.
#include "kernels/gemm.h"
#include "kernels/packed_gemm.h"
#include "tests/unit/kernels/grid_product_reference.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <random>
#include <vector>

namespace qforge {
namespace {

std::vector<float> random_floats(size_t n, uint32_t seed) {
  return test_util::normal_floats(n, seed);
}

// C = alpha op(A) op(B) + beta C, in double, straight from the definition.
template <typename T>
std::vector<double> naive(const GemmShape& s, const T* a, const T* b, const T* c) {
  std::vector<double> out(static_cast<size_t>(s.m * s.n));
  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t j = 0; j < s.n; ++j) {
      double acc = 0.0;
      for (int64_t p = 0; p < s.k; ++p) {
        const double av = s.trans_a ? a[p * s.lda + i] : a[i * s.lda + p];
        const double bv = s.trans_b ? b[j * s.ldb + p] : b[p * s.ldb + j];
        acc += av * bv;
      }
      const double prev = s.beta == 0.0f ? 0.0 : static_cast<double>(c[i * s.ldc + j]);
      out[static_cast<size_t>(i * s.n + j)] = s.alpha * acc + s.beta * prev;
    }
  }
  return out;
}

struct Case {
  bool ta, tb;
  int64_t m, n, k;
  float alpha, beta;
};

class GemmF32 : public ::testing::TestWithParam<Case> {};

TEST_P(GemmF32, MatchesTheReferenceAndIgnoresTheThreadCount) {
  const Case p = GetParam();
  GemmShape s{.trans_a = p.ta, .trans_b = p.tb, .m = p.m, .n = p.n, .k = p.k,
              .lda = p.ta ? p.m : p.k, .ldb = p.tb ? p.k : p.n, .ldc = p.n,
              .alpha = p.alpha, .beta = p.beta};
  const auto a = random_floats(static_cast<size_t>(p.m * p.k), 1);
  const auto b = random_floats(static_cast<size_t>(p.k * p.n), 2);
  const auto c0 = random_floats(static_cast<size_t>(p.m * p.n), 3);
  const auto want = naive(s, a.data(), b.data(), c0.data());
  std::vector<float> one = c0, four = c0, host = c0;
  gemm_f32(1, s, a.data(), b.data(), one.data());
  gemm_f32(4, s, a.data(), b.data(), four.data());
  gemm_f32_host(Device::Cpu, s, a.data(), b.data(), host.data());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_NEAR(one[i], want[i], 1e-4 * (1.0 + std::abs(want[i])))
        << "element " << i << " ta=" << p.ta << " tb=" << p.tb << " m=" << p.m << " n=" << p.n
        << " k=" << p.k << " alpha=" << p.alpha << " beta=" << p.beta;
    ASSERT_EQ(one[i], four[i]) << "element " << i << ": 1 and 4 threads differ";
    ASSERT_EQ(one[i], host[i]) << "element " << i << ": the host dispatch on CPU differs";
  }
}

// Shapes below, at and past the fixed tiles (256 x 256), transposes, beta, and k = 0 (C is
// defined even though BLAS may skip it).
INSTANTIATE_TEST_SUITE_P(Shapes, GemmF32,
                         ::testing::Values(Case{false, false, 3, 5, 7, 1.0f, 0.0f},
                                           Case{false, false, 130, 600, 33, 1.0f, 0.0f},
                                           Case{true, false, 97, 300, 16, 0.5f, 1.0f},
                                           Case{false, true, 200, 257, 40, -1.0f, 0.25f},
                                           Case{true, true, 65, 513, 9, 2.0f, 0.0f},
                                           Case{false, false, 70, 300, 0, 1.0f, 0.5f},
                                           Case{false, false, 600, 300, 33, 1.0f, 0.0f},
                                           Case{true, true, 520, 70, 16, 0.5f, 0.5f}));

TEST(GemmF64, MatchesTheReference) {
  GemmShape s{.trans_a = true, .m = 37, .n = 11, .k = 23, .lda = 37, .ldb = 11, .ldc = 11,
              .alpha = -1.0f, .beta = 1.0f};
  std::vector<double> a(static_cast<size_t>(s.m * s.k)), b(static_cast<size_t>(s.k * s.n)),
      c(static_cast<size_t>(s.m * s.n));
  std::mt19937 rng(7);
  std::normal_distribution<double> dist(0.0, 1.0);
  for (auto* v : {&a, &b, &c})
    for (double& x : *v) x = dist(rng);
  const auto want = naive(s, a.data(), b.data(), c.data());
  gemm_f64(s, a.data(), b.data(), c.data());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(c[i], want[i], 1e-12) << "element " << i;
}

TEST(GemmHost, CudaAgreesWithTheCpuWhereADeviceAnswers) {
  if (!gemm_cuda_built() || !cuda_available()) {
    GTEST_SKIP() << "no CUDA device with cuBLAS in this build or on this machine";
  }
  GemmShape s{.m = 64, .n = 96, .k = 128, .lda = 128, .ldb = 96, .ldc = 96};
  const auto a = random_floats(static_cast<size_t>(s.m * s.k), 4);
  const auto b = random_floats(static_cast<size_t>(s.k * s.n), 5);
  std::vector<float> cpu(static_cast<size_t>(s.m * s.n)), gpu(cpu.size());
  gemm_f32_host(Device::Cpu, s, a.data(), b.data(), cpu.data());
  gemm_f32_host(Device::Cuda, s, a.data(), b.data(), gpu.data());
  for (size_t i = 0; i < cpu.size(); ++i) ASSERT_NEAR(gpu[i], cpu[i], 1e-4) << "element " << i;
}

// kernels/packed_gemm.h: every element of C is one fused multiply-add chain in k order, bit for
// bit, whatever the shape, the transpose, the thread count or the split into tasks.
struct PackedCase {
  int64_t m, k, n;
  bool trans;
};

void PrintTo(const PackedCase& c, std::ostream* os) {
  *os << "m=" << c.m << " k=" << c.k << " n=" << c.n << (c.trans ? " transposed" : "");
}

class PackedGemm : public ::testing::TestWithParam<PackedCase> {
 protected:
  void SetUp() override {
    if (!packed_gemm_supported()) GTEST_SKIP() << "this CPU lacks AVX2/FMA, the packed kernel's";
  }
  void TearDown() override { packed_gemm_use_avx2_only(false); }
};

// The kernels a test runs each case through: the widest this CPU has and the AVX2 one (the same
// kernel twice where the CPU lacks AVX-512). Both must give the FMA chain's bits.
constexpr bool kAvx2Only[] = {false, true};

TEST_P(PackedGemm, EveryElementIsOneFmaChainInKOrderAtAnyThreadCount) {
  const PackedCase p = GetParam();
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
  // Each column's start (a MatMul's bias): taken where the sums do not accumulate onto C.
  const auto col_start = random_floats(static_cast<size_t>(p.n), 4);
  // And each column's value added to the finished sums (a bias after the sums, as ONNX Add).
  const auto col_add = random_floats(static_cast<size_t>(p.n), 5);
  // From 0, onto C, from col_start, from 0 then col_add, onto C then col_add.
  for (const int mode : {0, 1, 2, 3, 4}) {
    const bool accumulate = mode == 1 || mode == 4;
    const bool adds = mode >= 3;
    std::vector<float> want(c0.size());
    for (int64_t i = 0; i < p.m; ++i) {
      for (int64_t j = 0; j < p.n; ++j) {
        const size_t at = static_cast<size_t>(i * p.n + j);
        float acc = accumulate ? c0[at] : mode == 2 ? col_start[static_cast<size_t>(j)] : 0.0f;
        for (int64_t kk = 0; kk < p.k; ++kk) {
          acc = std::fma(a[static_cast<size_t>(i * p.k + kk)], bv(kk, j), acc);
        }
        want[at] = adds ? acc + col_add[static_cast<size_t>(j)] : acc;
      }
    }
    for (const bool avx2 : kAvx2Only) {
      packed_gemm_use_avx2_only(avx2);
      for (const int threads : {1, 2, 3}) {
        std::vector<float> got = c0;
        gemm_f32_packed(threads, p.m, a.data(), p.k, packed, got.data(), p.n, accumulate,
                        mode == 2 ? col_start.data() : nullptr,
                        adds ? col_add.data() : nullptr);
        for (size_t at = 0; at < want.size(); ++at) {
          ASSERT_EQ(std::bit_cast<uint32_t>(got[at]), std::bit_cast<uint32_t>(want[at]))
              << "element " << at << " of m=" << p.m << " k=" << p.k << " n=" << p.n
              << " trans=" << p.trans << " mode=" << mode << " threads=" << threads
              << " avx512=" << packed_gemm_avx512() << ": " << got[at] << " against "
              << want[at];
        }
      }
    }
  }
}

// One row and one column; rows in uneven groups of 6; depths across the passes (160 deep where
// the CPU has AVX-512, 1024 where it does not: 1100 takes two); rows across the 192-row tasks; columns short of, at and past 16-column panels, the
// AVX-512 kernel's groups of 4, 2 and 1 panels, and 8-panel tasks.
INSTANTIATE_TEST_SUITE_P(Shapes, PackedGemm,
                         ::testing::Values(PackedCase{1, 1, 1, false},
                                           PackedCase{5, 3, 17, false},
                                           PackedCase{32, 384, 40, true},
                                           PackedCase{13, 1100, 33, false},
                                           PackedCase{200, 70, 300, true},
                                           PackedCase{7, 16, 129, false},
                                           PackedCase{400, 520, 48, false},
                                           PackedCase{9, 130, 112, false},
                                           PackedCase{6, 257, 64, true},
                                           // few multiply-adds over a large B (1 MiB and
                                           // more): shared between threads all the same
                                           PackedCase{1, 1100, 300, true}));

// A packed once (PackedRows, a convolution's weights), B's panels written by the caller: each
// row's sums start at its row_start value and finish through the Relu where asked, bit for bit
// the FMA chain, at any thread count; depth 0 gives the starts (through the Relu).
TEST_P(PackedGemm, PrepackedRowsStartAtTheirValuesAndFinishThroughTheRelu) {
  const PackedCase p = GetParam();
  const auto a = random_floats(static_cast<size_t>(p.m * p.k), 11);
  const auto b = random_floats(static_cast<size_t>(p.k * p.n), 12);
  const auto start = random_floats(static_cast<size_t>(p.m), 13);
  const PackedRows rows(a.data(), p.m, p.k, p.k);
  ASSERT_EQ(rows.m(), p.m);
  ASSERT_EQ(rows.k(), p.k);
  PackedMatrix cols(p.k, p.n);  // written panel by panel, as a convolution does
  for (int64_t kk = 0; kk < p.k; ++kk) {
    for (int64_t j = 0; j < p.n; ++j) {
      cols.mutable_panel(j / PackedMatrix::kPanel)[kk * PackedMatrix::kPanel +
                                                   j % PackedMatrix::kPanel] =
          b[static_cast<size_t>(kk * p.n + j)];
    }
  }
  const auto addend = random_floats(static_cast<size_t>(p.m * p.n), 14);
  for (const bool with_start : {false, true}) {
    for (const bool relu : {false, true}) {
      // Without and with an addend (a residual connection's, laid out as C).
      for (const bool add : {false, true}) {
        std::vector<float> want(static_cast<size_t>(p.m * p.n));
        for (int64_t i = 0; i < p.m; ++i) {
          for (int64_t j = 0; j < p.n; ++j) {
            float acc = with_start ? start[static_cast<size_t>(i)] : 0.0f;
            for (int64_t kk = 0; kk < p.k; ++kk) {
              acc = std::fma(a[static_cast<size_t>(i * p.k + kk)],
                             b[static_cast<size_t>(kk * p.n + j)], acc);
            }
            if (add) acc += addend[static_cast<size_t>(i * p.n + j)];
            want[static_cast<size_t>(i * p.n + j)] = relu && !(acc > 0) ? 0.0f : acc;
          }
        }
        for (const bool avx2 : kAvx2Only) {
          packed_gemm_use_avx2_only(avx2);
          for (const int threads : {1, 2, 3}) {
            std::vector<float> got(want.size(), -9.0f);
            gemm_f32_prepacked(threads, rows, cols, got.data(), p.n,
                               with_start ? start.data() : nullptr, relu,
                               add ? addend.data() : nullptr);
            for (size_t at = 0; at < want.size(); ++at) {
              ASSERT_EQ(std::bit_cast<uint32_t>(got[at]), std::bit_cast<uint32_t>(want[at]))
                  << "element " << at << " start=" << with_start << " relu=" << relu
                  << " addend=" << add << " threads=" << threads
                  << " avx512=" << packed_gemm_avx512() << ": " << got[at] << " against "
                  << want[at];
            }
          }
        }
        packed_gemm_use_avx2_only(false);
      }
    }
  }
}

TEST(PackedGemmEdges, DepthZeroGivesZerosOrLeavesCAsItWas) {
  if (!packed_gemm_supported()) GTEST_SKIP() << "this CPU lacks AVX2/FMA, the packed kernel's";
  const PackedMatrix packed(nullptr, 0, 20, 20, false);
  const std::vector<float> a(3, 1.0f);
  std::vector<float> c(60, 7.0f);
  gemm_f32_packed(2, 3, a.data(), 0, packed, c.data(), 20, true);
  EXPECT_EQ(c, std::vector<float>(60, 7.0f));
  gemm_f32_packed(2, 3, a.data(), 0, packed, c.data(), 20, false);
  EXPECT_EQ(c, std::vector<float>(60, 0.0f));
  std::vector<float> bias(20);
  for (size_t j = 0; j < bias.size(); ++j) bias[j] = static_cast<float>(j) - 4.5f;
  gemm_f32_packed(2, 3, a.data(), 0, packed, c.data(), 20, false, bias.data());
  for (size_t i = 0; i < c.size(); ++i) ASSERT_EQ(c[i], bias[i % 20]) << i;
  gemm_f32_packed(2, 3, a.data(), 0, packed, c.data(), 20, false, nullptr, bias.data());
  for (size_t i = 0; i < c.size(); ++i) ASSERT_EQ(c[i], bias[i % 20]) << i;
  gemm_f32_packed(2, 3, a.data(), 0, packed, c.data(), 20, true, nullptr, bias.data());
  for (size_t i = 0; i < c.size(); ++i) ASSERT_EQ(c[i], 2 * bias[i % 20]) << i;
  // Prepacked rows of depth 0: each row its start, through the Relu.
  const PackedRows rows(a.data(), 3, 0, 0);
  const std::vector<float> start = {2.5f, -1.0f, 0.0f};
  gemm_f32_prepacked(2, rows, packed, c.data(), 20, start.data(), false);
  for (size_t i = 0; i < c.size(); ++i) ASSERT_EQ(c[i], start[i / 20]) << i;
  gemm_f32_prepacked(2, rows, packed, c.data(), 20, start.data(), true);
  for (size_t i = 0; i < c.size(); ++i) ASSERT_EQ(c[i], std::max(start[i / 20], 0.0f)) << i;
}

// Where the CPU has AVX-512F the products run on the wide kernel, and the test switch gives
// the AVX2 one back (so the cases above run both).
TEST(PackedGemmEdges, TheWideKernelRunsWhereTheCpuHasAvx512) {
  if (!packed_gemm_supported()) GTEST_SKIP() << "this CPU lacks AVX2/FMA, the packed kernel's";
  if (!__builtin_cpu_supports("avx512f")) GTEST_SKIP() << "this CPU lacks AVX-512F";
  EXPECT_TRUE(packed_gemm_avx512());
  packed_gemm_use_avx2_only(true);
  EXPECT_FALSE(packed_gemm_avx512());
  packed_gemm_use_avx2_only(false);
  EXPECT_TRUE(packed_gemm_avx512());
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

// B read in place through row offsets, C's columns stored through a grid: each stored element
// is the FMA chain from its row's start over B's column, bit for bit, at 1-3 threads on both
// kernels; the grid's other columns and everything past them are left as they were. Grids:
// The columns stored through a grid, B read in place or packed (a chunk of images side by side
// in packed columns), with and without an addend laid out as C: plain (every column stored),
// rows of 5 kept of 7 (panels crossing several rows), several
// images with rows and whole image rows dropped, one row of 40 kept of 43 (a 1-D window), and
// images far apart (a whole panel of columns stored nowhere).
TEST(PackedGemmInPlace, StoredColumnsAreTheFmaChainsTheGridKeeps) {
  if (!packed_gemm_supported()) GTEST_SKIP() << "this CPU lacks AVX2/FMA, the packed kernel's";
  struct Case {
    int64_t m, k;
    ColumnGrid grid;
    int64_t images;
  };
  const std::vector<Case> cases = {
      {7, 20, {.row_len = 37, .row_kept = 37, .rows = 1, .rows_kept = 1, .image_stride = 0}, 1},
      {13, 140, {.row_len = 7, .row_kept = 5, .rows = 7, .rows_kept = 5, .image_stride = 0}, 1},
      {9, 33, {.row_len = 6, .row_kept = 4, .rows = 5, .rows_kept = 4, .image_stride = 0}, 3},
      {200, 9, {.row_len = 43, .row_kept = 40, .rows = 1, .rows_kept = 1, .image_stride = 0}, 4},
      {5, 11, {.row_len = 4, .row_kept = 2, .rows = 10, .rows_kept = 2, .image_stride = 0}, 2},
      // two passes where the CPU lacks AVX-512 (of up to 1024), seven where it has it
      {11, 1100, {.row_len = 9, .row_kept = 7, .rows = 3, .rows_kept = 2, .image_stride = 0}, 2},
  };
  uint32_t seed = 40;
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    Case c = cases[ci];
    const ColumnGrid& g = c.grid;
    const int64_t kept = g.rows_kept * g.row_kept;  // stored columns per image
    c.grid.image_stride = kept + 3;                 // a gap between images in C
    const int64_t ldc = c.images * c.grid.image_stride + 5;
    // The columns up to the last kept position of the last image.
    const int64_t n = (c.images - 1) * g.rows * g.row_len + (g.rows_kept - 1) * g.row_len +
                      g.row_kept;
    // Rows of B at scattered offsets of one buffer, readable to the last panel's end.
    std::vector<int64_t> offsets(static_cast<size_t>(c.k));
    for (int64_t kk = 0; kk < c.k; ++kk) offsets[static_cast<size_t>(kk)] = (kk * 7919) % 97 * 3;
    const auto data = random_floats(static_cast<size_t>(97 * 3 + (n + 15) / 16 * 16), seed++);
    const auto a = random_floats(static_cast<size_t>(c.m * c.k), seed++);
    const auto start = random_floats(static_cast<size_t>(c.m), seed++);
    const PackedRows rows(a.data(), c.m, c.k, c.k);
    const InPlaceColumns b{.data = data.data(), .row_offset = offsets, .n = n};
    PackedMatrix packed(c.k, n);  // the same columns, packed
    for (int64_t kk = 0; kk < c.k; ++kk) {
      for (int64_t j = 0; j < n; ++j) {
        packed.mutable_panel(j / PackedMatrix::kPanel)[kk * PackedMatrix::kPanel +
                                                       j % PackedMatrix::kPanel] =
            data[static_cast<size_t>(offsets[static_cast<size_t>(kk)] + j)];
      }
    }
    const auto addend = random_floats(static_cast<size_t>(c.m * ldc), seed++);
    for (const int ends : {0, 1, 2}) {  // as it is, through the Relu, plus the addend then Relu
      const bool relu = ends > 0, add = ends == 2;
      const std::vector<float> before = random_floats(static_cast<size_t>(c.m * ldc), seed++);
      const std::vector<float> want =
          test_util::grid_product(before, ldc, a, c.m, c.k, data, offsets, n, c.grid, start,
                                  add ? addend.data() : nullptr, relu);
      for (const bool avx2 : kAvx2Only) {
        packed_gemm_use_avx2_only(avx2);
        for (const int threads : {1, 2, 3}) {
          for (const bool in_place : {true, false}) {
            std::vector<float> got = before;
            const float* z = add ? addend.data() : nullptr;
            if (in_place) {
              gemm_f32_prepacked(threads, rows, b, c.grid, got.data(), ldc, start.data(), relu, z);
            } else {
              gemm_f32_prepacked(threads, rows, packed, c.grid, got.data(), ldc, start.data(),
                                 relu, z);
            }
            for (size_t at = 0; at < want.size(); ++at) {
              ASSERT_EQ(std::bit_cast<uint32_t>(got[at]), std::bit_cast<uint32_t>(want[at]))
                  << "case " << ci << " element " << at << " relu=" << relu << " addend=" << add
                  << " in place=" << in_place << " threads=" << threads
                  << " avx512=" << packed_gemm_avx512() << ": " << got[at] << " against "
                  << want[at];
            }
          }
        }
      }
      packed_gemm_use_avx2_only(false);
    }
  }
}

// Depth 0 in place: each stored element is its row's start; the grid's other columns stay.
TEST(PackedGemmInPlace, DepthZeroStoresTheStartsWhereTheGridKeeps) {
  if (!packed_gemm_supported()) GTEST_SKIP() << "this CPU lacks AVX2/FMA, the packed kernel's";
  const std::vector<float> a(2, 1.0f);
  const PackedRows rows(a.data(), 2, 0, 0);
  const InPlaceColumns b{.data = nullptr, .row_offset = {}, .n = 5};
  const ColumnGrid grid{.row_len = 3, .row_kept = 2, .rows = 2, .rows_kept = 2, .image_stride = 0};
  std::vector<float> c(8, -1.0f);
  const std::vector<float> start = {4.0f, -2.0f};
  gemm_f32_prepacked(1, rows, b, grid, c.data(), 4, start.data(), true);
  EXPECT_EQ(c, (std::vector<float>{4.0f, 4.0f, 4.0f, 4.0f, 0.0f, 0.0f, 0.0f, 0.0f}));
  // Plus an addend laid out as C, then the Relu.
  const std::vector<float> z = {1.0f, -5.0f, 0.5f, 2.0f, 3.0f, 1.0f, 2.5f, -1.0f};
  gemm_f32_prepacked(1, rows, b, grid, c.data(), 4, start.data(), true, z.data());
  EXPECT_EQ(c, (std::vector<float>{5.0f, 0.0f, 4.5f, 6.0f, 1.0f, 0.0f, 0.5f, 0.0f}));
}

}  // namespace
}  // namespace qforge
