// kernels/packed_gemm.h, gemm_f32_lanes: the product with A's rows as the vector lanes, against
// the FMA chain and against the panel product on the same operands, bit for bit.
#include "kernels/packed_gemm.h"
#include "tests/unit/kernels/grid_product_reference.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace qforge {
namespace {

using test_util::grid_product;
using test_util::normal_floats;

// The kernel widths to run: the widest this CPU has, then the AVX2 one (the same where the CPU
// lacks AVX-512). Leaves the widest on when it goes.
struct EachKernel {
  ~EachKernel() { packed_gemm_use_avx2_only(false); }
  static constexpr bool kAvx2Only[] = {false, true};
};

struct LaneCase {
  int64_t m, k;
  ColumnGrid grid;
  int64_t images;
};

std::ostream& operator<<(std::ostream& os, const LaneCase& c) {
  return os << "m=" << c.m << " k=" << c.k << " grid " << c.grid.rows_kept << "/" << c.grid.rows
            << " rows of " << c.grid.row_kept << "/" << c.grid.row_len << ", " << c.images
            << " images";
}

// Rows of every width a tile takes (1-14 and splits of wider rows: 15 as 8 + 7, 29 as 10 + 10 +
// 9, 56 as four of 14; on the AVX2 kernel 1-6, 7 as 4 + 3 and so on), tiles across the rows of
// grids without padding between them, rows of C not a multiple
// of 8, 16 or 32 (the call's unused lanes), depths
// of 0, one pass, two and three passes (161, 333 where the CPU has AVX-512; 1300 where it does
// not), a grid's dropped rows and columns and several
// images: every stored element is the FMA chain from its row's start, plus the addend, through
// the Relu; the rest of C is left as it was; the panel product's bytes; 1-3 threads.
TEST(LaneGemm, StoredElementsAreTheFmaChainsOfThePanelProduct) {
  if (!lane_gemm_supported()) GTEST_SKIP() << "this CPU lacks AVX2/FMA, the lane product's";
  const auto grid = [](int64_t row_len, int64_t row_kept, int64_t rows, int64_t rows_kept) {
    return ColumnGrid{.row_len = row_len, .row_kept = row_kept, .rows = rows,
                      .rows_kept = rows_kept, .image_stride = 0};
  };
  const std::vector<LaneCase> cases = {
      {7, 20, grid(37, 37, 1, 1), 1},   {32, 9, grid(16, 14, 15, 14), 1},
      {45, 161, grid(9, 7, 8, 7), 2},   {70, 333, grid(30, 29, 4, 3), 1},
      {16, 0, grid(5, 3, 4, 2), 2},     {33, 140, grid(58, 56, 3, 2), 1},
      {5, 17, grid(17, 15, 3, 3), 3},   {64, 64, grid(12, 1, 2, 2), 2},
      {48, 30, grid(13, 13, 1, 1), 4},
      // grids that keep whole rows (a 1x1 convolution's planes): tiles across rows where the
      // AVX-512 kernel runs (7 x 7 as 13 + 12 + 12 + 12; rows of 1 and 3, tiles over many)
      {40, 170, grid(7, 7, 7, 7), 2},   {33, 9, grid(1, 1, 20, 20), 1},
      {16, 50, grid(3, 3, 5, 5), 3},
      // three passes of the AVX2 kernel where the CPU lacks AVX-512 (of up to 640)
      {20, 1300, grid(9, 7, 3, 2), 2},
  };
  uint32_t seed = 70;
  for (LaneCase c : cases) {
    const ColumnGrid& g = c.grid;
    c.grid.image_stride = g.rows_kept * g.row_kept + 3;  // a gap between images in C
    const int64_t ldc = c.images * c.grid.image_stride + 5;
    const int64_t n =
        (c.images - 1) * g.rows * g.row_len + (g.rows_kept - 1) * g.row_len + g.row_kept;
    std::vector<int64_t> offsets(static_cast<size_t>(c.k));
    for (int64_t kk = 0; kk < c.k; ++kk) offsets[static_cast<size_t>(kk)] = (kk * 7919) % 97 * 3;
    auto data = normal_floats(static_cast<size_t>(97 * 3 + (n + 15) / 16 * 16), seed++);
    if (!data.empty()) data[5] = std::numeric_limits<float>::quiet_NaN();  // through to C
    const auto a = normal_floats(static_cast<size_t>(c.m * c.k), seed++);
    const auto start = normal_floats(static_cast<size_t>(c.m), seed++);
    const PackedRows lanes(a.data(), c.m, c.k, c.k, RowLayout::Lanes);
    const PackedRows groups(a.data(), c.m, c.k, c.k);
    const InPlaceColumns b{.data = data.data(), .row_offset = offsets, .n = n};
    const auto addend = normal_floats(static_cast<size_t>(c.m * ldc), seed++);
    for (const int ends : {0, 1, 2}) {  // as it is, through the Relu, plus the addend then Relu
      const bool relu = ends > 0, add = ends == 2;
      const std::vector<float> before = normal_floats(static_cast<size_t>(c.m * ldc), seed++);
      const std::vector<float> want =
          grid_product(before, ldc, a, c.m, c.k, data, offsets, n, c.grid, start,
                       add ? addend.data() : nullptr, relu);
      std::vector<float> panels = before;
      gemm_f32_prepacked(1, groups, b, c.grid, panels.data(), ldc, start.data(), relu,
                         add ? addend.data() : nullptr);
      const EachKernel kernels;
      for (const bool avx2 : EachKernel::kAvx2Only) {
        packed_gemm_use_avx2_only(avx2);
        for (const int threads : {1, 2, 3}) {
          std::vector<float> got = before;
          gemm_f32_lanes(threads, lanes, b, c.grid, got.data(), ldc, start.data(), relu,
                         add ? addend.data() : nullptr);
          for (size_t at = 0; at < want.size(); ++at) {
            ASSERT_EQ(std::bit_cast<uint32_t>(got[at]), std::bit_cast<uint32_t>(want[at]))
                << c << " element " << at << " relu=" << relu << " addend=" << add
                << " threads=" << threads << " avx2=" << avx2 << ": " << got[at] << " against "
                << want[at];
            ASSERT_EQ(std::bit_cast<uint32_t>(got[at]), std::bit_cast<uint32_t>(panels[at]))
                << c << " element " << at << ": the panel product's differs";
          }
        }
      }
    }
  }
}

// Images apart in B by a stride of their own (a 1x1 convolution's input planes: cin planes an
// image), each image's columns read from there: the bits of the same images laid out one plane
// apart.
TEST(LaneGemm, ImagesApartInBReadFromTheirOwnStart) {
  if (!lane_gemm_supported()) GTEST_SKIP() << "this CPU lacks AVX2/FMA, the lane product's";
  const int64_t m = 20, k = 6, images = 3, plane = 5 * 7, spread = k * plane + 9;
  const ColumnGrid grid{.row_len = 7, .row_kept = 7, .rows = 5, .rows_kept = 5,
                        .image_stride = m * plane};
  std::vector<int64_t> offsets(static_cast<size_t>(k));
  for (int64_t kk = 0; kk < k; ++kk) offsets[static_cast<size_t>(kk)] = kk * plane;
  const auto spread_b = normal_floats(static_cast<size_t>(images * spread), 8);
  // The same images packed one plane apart, channel kk's at kk * images * plane.
  std::vector<int64_t> packed_offsets(static_cast<size_t>(k));
  std::vector<float> packed_b(static_cast<size_t>(k * images * plane));
  for (int64_t kk = 0; kk < k; ++kk) {
    packed_offsets[static_cast<size_t>(kk)] = kk * images * plane;
    for (int64_t i = 0; i < images; ++i) {
      for (int64_t j = 0; j < plane; ++j) {
        packed_b[static_cast<size_t>((kk * images + i) * plane + j)] =
            spread_b[static_cast<size_t>(i * spread + kk * plane + j)];
      }
    }
  }
  const auto a = normal_floats(static_cast<size_t>(m * k), 9);
  const PackedRows lanes(a.data(), m, k, k, RowLayout::Lanes);
  const InPlaceColumns spread_cols{.data = spread_b.data(), .row_offset = offsets,
                                   .n = images * plane};
  const InPlaceColumns packed_cols{.data = packed_b.data(), .row_offset = packed_offsets,
                                   .n = images * plane};
  std::vector<float> want(static_cast<size_t>(images * m * plane), -1.0f), got = want;
  gemm_f32_lanes(2, lanes, packed_cols, grid, want.data(), plane);
  gemm_f32_lanes(2, lanes, spread_cols, grid, got.data(), plane, nullptr, false, nullptr,
                 spread);
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i])) << "element " << i;
    ASSERT_NE(got[i], -1.0f) << "element " << i << " was not stored";
  }
}

// The addend may be C itself (an op writing its output over an input nothing reads afterwards):
// with several passes over k (9 where the CPU has AVX-512, 3 where it does not), every element
// is what a separate addend gives.
TEST(LaneGemm, AnAddendThatIsCItselfGivesTheSeparateAddendsBits) {
  if (!lane_gemm_supported()) GTEST_SKIP() << "this CPU lacks AVX2/FMA, the lane product's";
  const int64_t m = 40, k = 1400, row_len = 31, rows = 9;
  const ColumnGrid grid{.row_len = row_len, .row_kept = 29, .rows = rows, .rows_kept = 8,
                        .image_stride = 8 * 29};
  const int64_t n = 7 * row_len + 29, ldc = 8 * 29;
  std::vector<int64_t> offsets(static_cast<size_t>(k));
  for (int64_t kk = 0; kk < k; ++kk) offsets[static_cast<size_t>(kk)] = kk % 50 * 7;
  const auto data = normal_floats(static_cast<size_t>(350 + n + 16), 3);
  const auto a = normal_floats(static_cast<size_t>(m * k), 4);
  const auto bias = normal_floats(static_cast<size_t>(m), 5);
  const PackedRows lanes(a.data(), m, k, k, RowLayout::Lanes);
  const InPlaceColumns b{.data = data.data(), .row_offset = offsets, .n = n};
  const auto z = normal_floats(static_cast<size_t>(m * ldc), 6);
  const EachKernel kernels;
  for (const bool avx2 : EachKernel::kAvx2Only) {
    packed_gemm_use_avx2_only(avx2);
    for (const int threads : {1, 2}) {
      std::vector<float> separate(z.size(), 0.0f);
      gemm_f32_lanes(threads, lanes, b, grid, separate.data(), ldc, bias.data(), true, z.data());
      std::vector<float> over = z;
      gemm_f32_lanes(threads, lanes, b, grid, over.data(), ldc, bias.data(), true, over.data());
      for (size_t i = 0; i < z.size(); ++i) {
        ASSERT_EQ(std::bit_cast<uint32_t>(over[i]), std::bit_cast<uint32_t>(separate[i]))
            << "element " << i << " threads=" << threads << " avx2=" << avx2;
      }
    }
  }
}

// A packed as lanes is refused by the panel product, and the other way round.
TEST(LaneGemm, EachProductRefusesTheOtherLayout) {
  if (!lane_gemm_supported()) GTEST_SKIP() << "this CPU lacks AVX2/FMA, the lane product's";
  const std::vector<float> a(6, 1.0f), data(64, 1.0f);
  const std::vector<int64_t> offsets = {0, 16, 32};
  const InPlaceColumns b{.data = data.data(), .row_offset = offsets, .n = 4};
  const ColumnGrid grid{.row_len = 4, .row_kept = 4, .rows = 1, .rows_kept = 1, .image_stride = 0};
  std::vector<float> c(8);
  EXPECT_ANY_THROW(gemm_f32_prepacked(1, PackedRows(a.data(), 2, 3, 3, RowLayout::Lanes), b,
                                      grid, c.data(), 4));
  EXPECT_ANY_THROW(gemm_f32_lanes(1, PackedRows(a.data(), 2, 3, 3), b, grid, c.data(), 4));
}

}  // namespace
}  // namespace qforge
