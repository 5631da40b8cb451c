#include "kernels/gemm.h"

#include <cblas.h>

#include <algorithm>
#include <mutex>

#include "ir/error.h"
#include "kernels/cpu/task_pool.h"

namespace qforge {

namespace {

// Tile edges: large enough that OpenBLAS runs near full speed, small enough that a layer gives
// several tiles to share among threads. Fixed numbers: the split must not follow the threads.
// Each call packs its own parts of A and B, so every row tile packs B's columns again: with
// 256 rows that costs about 6% of the product's time (64 rows cost a quarter: a 512-token
// decoder layer ran 18% slower).
constexpr int64_t kTileM = 256;
constexpr int64_t kTileN = 256;

// The edge of `extent` split into ceil(extent / most) tiles of about equal size (a multiple of
// 16, the kernels' register width), so that a product of 257-512 rows or columns gives two tiles
// to two threads (MiniLM's 384-wide projections ran on one thread) and no tile is a sliver.
int64_t balanced_tile(int64_t extent, int64_t most) {
  const int64_t tiles = (extent + most - 1) / most;
  if (tiles <= 1) return extent;
  const int64_t even = (extent + tiles - 1) / tiles;
  return std::min(most, (even + 15) / 16 * 16);
}

void single_threaded_blas() {
  // OpenBLAS would otherwise split each call over its own threads, with a reduction order that
  // may follow the thread count; the tiles are our parallelism.
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

blasint to_blas(int64_t v) {
  if (v < 0 || v > static_cast<int64_t>(INT32_MAX)) {
    fail_unsupported("matrix dimension " + std::to_string(v) + " exceeds the BLAS int range");
  }
  return static_cast<blasint>(v);
}

}  // namespace

void gemm_f32_batched(int threads, const GemmShape& s, std::span<const float* const> a,
                      std::span<const float* const> b, std::span<float* const> c) {
  if (a.size() != c.size() || b.size() != c.size()) fail_internal("gemm: batch sizes differ");
  if (s.m == 0 || s.n == 0 || c.empty()) return;
  single_threaded_blas();
  const int64_t tile_m = balanced_tile(s.m, kTileM);
  const int64_t tile_n = balanced_tile(s.n, kTileN);
  const int64_t tiles_m = (s.m + tile_m - 1) / tile_m;
  const int64_t tiles_n = (s.n + tile_n - 1) / tile_n;
  const int64_t per_matrix = tiles_m * tiles_n;
  const int64_t total = per_matrix * static_cast<int64_t>(c.size());
  const blasint k = to_blas(s.k), lda = to_blas(s.lda), ldb = to_blas(s.ldb), ldc = to_blas(s.ldc);
  const auto ta = s.trans_a ? CblasTrans : CblasNoTrans;
  const auto tb = s.trans_b ? CblasTrans : CblasNoTrans;
  const auto tile = [&](int64_t t) {
      const auto i = static_cast<size_t>(t / per_matrix);
      const int64_t r = t % per_matrix;
      const int64_t i0 = (r / tiles_n) * tile_m;
      const int64_t j0 = (r % tiles_n) * tile_n;
      const int64_t mt = std::min(tile_m, s.m - i0);
      const int64_t nt = std::min(tile_n, s.n - j0);
      const float* pa = s.trans_a ? a[i] + i0 : a[i] + i0 * s.lda;
      const float* pb = s.trans_b ? b[i] + j0 * s.ldb : b[i] + j0;
      float* pc = c[i] + i0 * s.ldc + j0;
      if (s.k == 0 || s.alpha == 0.0f) {  // BLAS may skip C entirely; define it here
        for (int64_t y = 0; y < mt; ++y) {
          for (int64_t x = 0; x < nt; ++x) {
            float& v = pc[y * s.ldc + x];
            v = s.beta == 0.0f ? 0.0f : s.beta * v;
          }
        }
        return;
      }
      cblas_sgemm(CblasRowMajor, ta, tb, static_cast<blasint>(mt), static_cast<blasint>(nt), k,
                  s.alpha, pa, lda, pb, ldb, s.beta, pc, ldc);
  };
  // A product this small takes less time than waking another thread (a futex call): it runs
  // here, tile by tile as in parallel, so the bits are the same.
  const double macs = double(s.m) * double(s.n) * double(s.k) * double(c.size());
  run_tasks(macs < kSerialBelowMacs ? 1 : threads, total, [&](int64_t t, int) { tile(t); });
}

void gemm_f64(const GemmShape& s, const double* a, const double* b, double* c) {
  if (s.m == 0 || s.n == 0) return;
  single_threaded_blas();
  cblas_dgemm(CblasRowMajor, s.trans_a ? CblasTrans : CblasNoTrans,
              s.trans_b ? CblasTrans : CblasNoTrans, to_blas(s.m), to_blas(s.n), to_blas(s.k),
              static_cast<double>(s.alpha), a, to_blas(s.lda), b, to_blas(s.ldb),
              static_cast<double>(s.beta), c, to_blas(s.ldc));
}

}  // namespace qforge
