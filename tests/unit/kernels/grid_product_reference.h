#pragma once
// What the packed products' tests (test_gemm.cpp, test_lane_gemm.cpp) check C against: each
// element the grid stores as one FMA chain in k order from its row's start, plus the addend,
// through the Relu, written straight from the definition.
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "kernels/packed_gemm.h"

namespace qforge::test_util {

inline std::vector<float> normal_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// C (`before` as it was) after C = start + A [m, k] @ B through `grid`, B's element (kk, j) at
// data[offsets[kk] + j] for j < n; then + addend (laid out as C, or null), then the Relu.
inline std::vector<float> grid_product(std::vector<float> c, int64_t ldc,
                                       std::span<const float> a, int64_t m, int64_t k,
                                       std::span<const float> data,
                                       std::span<const int64_t> offsets, int64_t n,
                                       const ColumnGrid& g, std::span<const float> start,
                                       const float* addend, bool relu) {
  for (int64_t j = 0; j < n; ++j) {
    const int64_t image = j / (g.rows * g.row_len), y = j / g.row_len % g.rows,
                  x = j % g.row_len;
    if (y >= g.rows_kept || x >= g.row_kept) continue;
    for (int64_t i = 0; i < m; ++i) {
      float acc = start[static_cast<size_t>(i)];
      for (int64_t kk = 0; kk < k; ++kk) {
        acc = std::fma(a[static_cast<size_t>(i * k + kk)],
                       data[static_cast<size_t>(offsets[static_cast<size_t>(kk)] + j)], acc);
      }
      const auto at = static_cast<size_t>(i * ldc + image * g.image_stride + y * g.row_kept + x);
      if (addend != nullptr) acc += addend[at];
      c[at] = relu && !(acc > 0) ? 0.0f : acc;
    }
  }
  return c;
}

}  // namespace qforge::test_util
