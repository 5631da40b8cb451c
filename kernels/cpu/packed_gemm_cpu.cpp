#include "kernels/packed_gemm.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <numeric>
#include <vector>

#include "ir/error.h"
#include "kernels/cpu/task_pool.h"

namespace qforge {

namespace {

constexpr int64_t kPanel = PackedMatrix::kPanel;
// Rows of A one kernel call multiplies with one panel: 6 rows x 2 vectors of 8 accumulators, two
// vectors of B and one broadcast fill 15 of the 16 AVX2 registers.
constexpr int64_t kRows = 6;
// A task's rows, and its columns in panels; the tasks are what threads share. Any split gives
// the same bits (see the header), so these only size the work.
constexpr int64_t kTaskRows = 192;
constexpr int64_t kQuad = 4;
constexpr int64_t kTaskQuads = 2;
// Depth of one pass: a task's block of packed A (kTaskRows x kDepth floats) is read from L2 once
// per panel while the panel's kDepth x 16 block stays in L1.
constexpr int64_t kDepth = 512;
// The AVX-512 kernel's pass: four panels' 128 x 64 block (32 KiB) stays in L1.
constexpr int64_t kDepthWide = 128;
// Products of fewer multiply-adds than this run on the calling thread (as in gemm_cpu.cpp).
constexpr double kSerialBelowMacs = 2.0 * (1 << 20);

std::atomic<bool> avx2_only{false};  // packed_gemm_use_avx2_only

// True where the AVX-512 kernel runs: the CPU has AVX-512F (and the OS saves its registers,
// which __builtin_cpu_supports checks) and no test asked for the AVX2 kernel.
bool avx512_in_use() {
  static const bool cpu = __builtin_cpu_supports("avx512f");
  return cpu && !avx2_only.load(std::memory_order_relaxed);
}

// A's rows in groups of at most kRows, as even as they split (32 rows: 6, 6, 5, 5, 5, 5), so no
// group is a sliver. Group g starts at row g * base + min(g, extra).
struct RowGroups {
  int64_t count, base, extra;
  explicit RowGroups(int64_t m)
      : count((m + kRows - 1) / kRows), base(m / count), extra(m % count) {}
  int64_t row0(int64_t g) const { return g * base + std::min(g, extra); }
  int64_t rows(int64_t g) const { return base + (g < extra ? 1 : 0); }
};

// A [m, k] in its row groups, each interleaved: group g's element (r, kk) at
// (g * k + kk) * kRows + r. Packed once per call and read by every task.
void pack_a(const float* a, int64_t lda, int64_t k, const RowGroups& groups, int64_t g0,
            int64_t g1, float* out) {
  for (int64_t g = g0; g < g1; ++g) {
    float* dst = out + g * k * kRows;
    const int64_t r0 = groups.row0(g);
    for (int64_t r = 0; r < groups.rows(g); ++r) {
      const float* src = a + (r0 + r) * lda;
      for (int64_t kk = 0; kk < k; ++kk) dst[kk * kRows + r] = src[kk];
    }
  }
}

// C[R, 16] (only `cols` columns stored) = (first ? start : C) + A[R, depth] @ panel[depth, 16],
// start being row r's start[r] (0 where `start` is null), stored as max(v, 0) where `relu` (0
// for NaN, as Relu's x > 0 ? x : 0).
// `a` is a group packed by pack_a; every element is one FMA chain in k order.
template <int R>
__attribute__((target("avx2,fma"), always_inline)) inline void kernel(
    int64_t depth, const float* a, const float* b, float* c, int64_t ldc, int64_t cols,
    bool first, const float* start, bool relu) {
  __m256 lo[R], hi[R];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    if (first) {
      lo[r] = start != nullptr ? _mm256_set1_ps(start[r]) : _mm256_setzero_ps();
      hi[r] = lo[r];
    } else if (cols == kPanel) {
      lo[r] = _mm256_loadu_ps(c + r * ldc);
      hi[r] = _mm256_loadu_ps(c + r * ldc + 8);
    } else {
      alignas(32) float t[kPanel] = {};
      std::memcpy(t, c + r * ldc, static_cast<size_t>(cols) * sizeof(float));
      lo[r] = _mm256_load_ps(t);
      hi[r] = _mm256_load_ps(t + 8);
    }
  }
#pragma GCC unroll 4
  for (int64_t k = 0; k < depth; ++k) {
    const __m256 b0 = _mm256_loadu_ps(b + k * kPanel);
    const __m256 b1 = _mm256_loadu_ps(b + k * kPanel + 8);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m256 x = _mm256_broadcast_ss(a + k * kRows + r);
      lo[r] = _mm256_fmadd_ps(x, b0, lo[r]);
      hi[r] = _mm256_fmadd_ps(x, b1, hi[r]);
    }
  }
  if (relu) {
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      // max_ps(v, 0) returns its second operand unless v > 0: 0 for NaN and -0.
      lo[r] = _mm256_max_ps(lo[r], _mm256_setzero_ps());
      hi[r] = _mm256_max_ps(hi[r], _mm256_setzero_ps());
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    if (cols == kPanel) {
      _mm256_storeu_ps(c + r * ldc, lo[r]);
      _mm256_storeu_ps(c + r * ldc + 8, hi[r]);
    } else {
      alignas(32) float t[kPanel];
      _mm256_store_ps(t, lo[r]);
      _mm256_store_ps(t + 8, hi[r]);
      std::memcpy(c + r * ldc, t, static_cast<size_t>(cols) * sizeof(float));
    }
  }
}

// The AVX-512 kernel: P (1, 2 or 4) adjacent panels, one 16-float vector per row and panel, so six
// rows of four panels keep 24 sums in flight. Columns past `cols` are masked off C, so a short
// last panel needs no staging copy. Every element is the same FMA chain in k order as kernel<R>'s.
template <int R, int P>
__attribute__((target("avx512f"), always_inline)) inline void kernel512(
    int64_t depth, const float* a, const float* b, int64_t panel_stride, float* c, int64_t ldc,
    const int64_t* cols, bool first, const float* start, bool relu) {
  __m512 acc[R][P];
  __mmask16 mask[P];
#pragma GCC unroll 4
  for (int p = 0; p < P; ++p) mask[p] = static_cast<__mmask16>((1u << cols[p]) - 1u);
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      if (first) {
        acc[r][p] = start != nullptr ? _mm512_set1_ps(start[r]) : _mm512_setzero_ps();
      } else {
        acc[r][p] = _mm512_maskz_loadu_ps(mask[p], c + r * ldc + p * kPanel);
      }
    }
  }
#pragma GCC unroll 4
  for (int64_t k = 0; k < depth; ++k) {
    __m512 bv[P];
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) bv[p] = _mm512_loadu_ps(b + p * panel_stride + k * kPanel);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m512 x = _mm512_set1_ps(a[k * kRows + r]);
#pragma GCC unroll 4
      for (int p = 0; p < P; ++p) acc[r][p] = _mm512_fmadd_ps(x, bv[p], acc[r][p]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      // max_ps(v, 0) returns its second operand unless v > 0: 0 for NaN and -0. (The maskz
      // form with every lane on: GCC 12 takes _mm512_max_ps's undefined source for a read.)
      const __m512 v =
          relu ? _mm512_maskz_max_ps(0xFFFF, acc[r][p], _mm512_setzero_ps()) : acc[r][p];
      _mm512_mask_storeu_ps(c + r * ldc + p * kPanel, mask[p], v);
    }
  }
}

template <int P>
__attribute__((target("avx512f"))) void kernel512_rows(int64_t rows, int64_t depth,
                                                       const float* a, const float* b,
                                                       int64_t panel_stride, float* c,
                                                       int64_t ldc, const int64_t* cols,
                                                       bool first, const float* start, bool relu) {
  switch (rows) {
    case 6: return kernel512<6, P>(depth, a, b, panel_stride, c, ldc, cols, first, start, relu);
    case 5: return kernel512<5, P>(depth, a, b, panel_stride, c, ldc, cols, first, start, relu);
    case 4: return kernel512<4, P>(depth, a, b, panel_stride, c, ldc, cols, first, start, relu);
    case 3: return kernel512<3, P>(depth, a, b, panel_stride, c, ldc, cols, first, start, relu);
    case 2: return kernel512<2, P>(depth, a, b, panel_stride, c, ldc, cols, first, start, relu);
    case 1: return kernel512<1, P>(depth, a, b, panel_stride, c, ldc, cols, first, start, relu);
    default: fail_internal("packed gemm: a row group of " + std::to_string(rows) + " rows");
  }
}

__attribute__((target("avx2,fma"))) void kernel_rows(int64_t rows, int64_t depth, const float* a,
                                                     const float* b, float* c, int64_t ldc,
                                                     int64_t cols, bool first, const float* start,
                                                     bool relu) {
  switch (rows) {
    case 6: return kernel<6>(depth, a, b, c, ldc, cols, first, start, relu);
    case 5: return kernel<5>(depth, a, b, c, ldc, cols, first, start, relu);
    case 4: return kernel<4>(depth, a, b, c, ldc, cols, first, start, relu);
    case 3: return kernel<3>(depth, a, b, c, ldc, cols, first, start, relu);
    case 2: return kernel<2>(depth, a, b, c, ldc, cols, first, start, relu);
    case 1: return kernel<1>(depth, a, b, c, ldc, cols, first, start, relu);
    default: fail_internal("packed gemm: a row group of " + std::to_string(rows) + " rows");
  }
}

// What the sums start from and what is stored: C's old values (`accumulate`), or each row's
// `row_start` value (null: 0); `relu` applies to the final sums.
struct Ends {
  bool accumulate = false;
  const float* row_start = nullptr;
  bool relu = false;
};

// One task: row groups [g0, g1) of C, panels [p0, p1), from A packed by pack_a.
void run_task(const RowGroups& groups, int64_t g0, int64_t g1, int64_t p0, int64_t p1,
              const float* packed_a, const PackedMatrix& b, float* c, int64_t ldc,
              const Ends& ends) {
  const int64_t k = b.k();
  const bool wide = avx512_in_use();
  const int64_t pass = wide ? kDepthWide : kDepth;
  for (int64_t k0 = 0; k0 < k; k0 += pass) {
    const int64_t depth = std::min(pass, k - k0);
    const bool first = k0 == 0 && !ends.accumulate;
    const bool last = ends.relu && k0 + depth == k;
    for (int64_t p = p0; wide && p < p1;) {  // panels in fours, then a pair, then one
      const int64_t np = p1 - p >= 4 ? 4 : p1 - p >= 2 ? 2 : 1;
      int64_t cols[4];
      for (int64_t q = 0; q < 4; ++q) cols[q] = std::min(kPanel, b.n() - (p + q) * kPanel);
      const float* panel = b.panel(p) + k0 * kPanel;
      for (int64_t g = g0; g < g1; ++g) {
        const float* pa = packed_a + (g * k + k0) * kRows;
        float* pc = c + groups.row0(g) * ldc + p * kPanel;
        const float* start = ends.row_start != nullptr ? ends.row_start + groups.row0(g) : nullptr;
        if (np == 4) {
          kernel512_rows<4>(groups.rows(g), depth, pa, panel, k * kPanel, pc, ldc, cols, first,
                            start, last);
        } else if (np == 2) {
          kernel512_rows<2>(groups.rows(g), depth, pa, panel, k * kPanel, pc, ldc, cols, first,
                            start, last);
        } else {
          kernel512_rows<1>(groups.rows(g), depth, pa, panel, 0, pc, ldc, cols, first, start,
                            last);
        }
      }
      p += np;
    }
    for (int64_t p = p0; !wide && p < p1; ++p) {
      const float* panel = b.panel(p) + k0 * kPanel;
      const int64_t cols = std::min(kPanel, b.n() - p * kPanel);
      for (int64_t g = g0; g < g1; ++g) {
        kernel_rows(groups.rows(g), depth, packed_a + (g * k + k0) * kRows, panel,
                    c + groups.row0(g) * ldc + p * kPanel, ldc, cols, first,
                    ends.row_start != nullptr ? ends.row_start + groups.row0(g) : nullptr, last);
      }
    }
  }
}

}  // namespace

PackedMatrix::PackedMatrix(const float* b, int64_t k, int64_t n, int64_t ldb, bool trans)
    : k_(k), n_(n) {
  if (k < 0 || n < 0) fail_internal("packed matrix of negative shape");
  // Zero-initialised: the last panel's columns past n stay 0.
  data_ = std::make_unique<float[]>(static_cast<size_t>(panels() * k * kPanel));
  if (k == 0) return;
  for (int64_t p = 0; p < panels(); ++p) {
    float* out = data_.get() + p * k * kPanel;
    const int64_t cols = std::min(kPanel, n - p * kPanel);
    if (!trans) {  // each of the panel's k rows is `cols` consecutive floats of a row of B
      for (int64_t kk = 0; kk < k; ++kk) {
        std::memcpy(out + kk * kPanel, b + kk * ldb + p * kPanel,
                    static_cast<size_t>(cols) * sizeof(float));
      }
      continue;
    }
    for (int64_t j = 0; j < cols; ++j) {  // column j of the panel is row p * 16 + j of B
      const float* src = b + (p * kPanel + j) * ldb;
      for (int64_t kk = 0; kk < k; ++kk) out[kk * kPanel + j] = src[kk];
    }
  }
}

PackedMatrix::PackedMatrix(int64_t k, int64_t n) : k_(k), n_(n) {
  if (k < 0 || n < 0) fail_internal("packed matrix of negative shape");
  data_ = std::make_unique_for_overwrite<float[]>(static_cast<size_t>(panels() * k * kPanel));
  const int64_t cols = n - (panels() - 1) * kPanel;
  if (panels() == 0 || cols == kPanel) return;
  float* last = mutable_panel(panels() - 1);
  for (int64_t kk = 0; kk < k; ++kk) {
    std::fill(last + kk * kPanel + cols, last + (kk + 1) * kPanel, 0.0f);
  }
}

PackedRows::PackedRows(const float* a, int64_t m, int64_t k, int64_t lda) : m_(m), k_(k) {
  if (m < 0 || k < 0) fail_internal("packed rows of negative shape");
  const RowGroups groups(std::max<int64_t>(m, 1));
  data_ = std::make_unique<float[]>(static_cast<size_t>(groups.count * k * kRows));
  if (m > 0) pack_a(a, lda, k, groups, 0, groups.count, data_.get());
}

bool packed_gemm_supported() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}

bool packed_gemm_avx512() { return packed_gemm_supported() && avx512_in_use(); }

void packed_gemm_use_avx2_only(bool on) { avx2_only.store(on); }

namespace {

// C[m, n] = packed A @ B (+ C): the row groups' tasks shared among `threads`. `pack(t)` lays out
// row task t's groups of A (nothing where A came packed) before any product reads them.
template <typename Pack>
void run_products(int threads, int64_t m, const RowGroups& groups, const Pack& pack,
                  const float* pa, const PackedMatrix& b, float* c_out, int64_t ldc,
                  const Ends& ends, bool pack_in_parallel) {
  // Row groups in tasks of at most kTaskRows rows, panels in groups of kTaskQuads fours (the
  // AVX-512 kernel's width; the last four maybe short), as many groups as make the task count a
  // multiple of the threads where the panels allow. Small tasks let a worker that wakes late
  // still find some to take (task_pool.h).
  constexpr int64_t kTaskGroups = kTaskRows / kRows;
  const int64_t row_tasks = (groups.count + kTaskGroups - 1) / kTaskGroups;
  const int64_t panels = b.panels();
  const int64_t quads = (panels + kQuad - 1) / kQuad;
  int64_t col_tasks = (quads + kTaskQuads - 1) / kTaskQuads;
  if (threads > 1) {
    const int64_t step = threads / std::gcd(static_cast<int64_t>(threads), row_tasks);
    col_tasks = std::min(quads, (col_tasks + step - 1) / step * step);
  }
  const auto panel0 = [&](int64_t c) { return std::min(panels, c * quads / col_tasks * kQuad); };
  const int64_t total = row_tasks * col_tasks;
  const auto pack_rows = [&](int64_t t) {
    pack(t * groups.count / row_tasks, (t + 1) * groups.count / row_tasks);
  };
  const auto task = [&](int64_t t) {
    const int64_t r = t / col_tasks, c = t % col_tasks;
    run_task(groups, r * groups.count / row_tasks, (r + 1) * groups.count / row_tasks,
             panel0(c), panel0(c + 1), pa, b, c_out, ldc, ends);
  };
  const double macs = double(m) * double(b.n()) * double(b.k());
  if (macs < kSerialBelowMacs) threads = 1;
  // Packing A on the workers too costs one more wake-up and wait: worth it only when every
  // thread has rows to pack.
  run_tasks(pack_in_parallel && row_tasks >= threads ? threads : 1, row_tasks,
            [&](int64_t t, int) { pack_rows(t); });
  run_tasks(threads, total, [&](int64_t t, int) { task(t); });
}

// B without depth: C is what the sums start from (`ends`), through the Relu where asked. True
// when that was all to do.
bool empty_product(int64_t m, const PackedMatrix& b, float* c, int64_t ldc, const Ends& ends) {
  if (m <= 0 || b.n() == 0) return true;
  if (b.k() != 0) return false;
  for (int64_t i = 0; i < m; ++i) {
    float* row = c + i * ldc;
    for (int64_t j = 0; j < b.n(); ++j) {
      const float v = ends.accumulate ? row[j] : ends.row_start ? ends.row_start[i] : 0.0f;
      row[j] = !ends.relu || v > 0 ? v : 0.0f;
    }
  }
  return true;
}

}  // namespace

void gemm_f32_packed(int threads, int64_t m, const float* a, int64_t lda, const PackedMatrix& b,
                     float* c_out, int64_t ldc, bool accumulate) {
  if (!packed_gemm_supported()) fail_internal("packed gemm called on a CPU without AVX2/FMA");
  const Ends ends{.accumulate = accumulate};
  if (empty_product(m, b, c_out, ldc, ends)) return;
  const RowGroups groups(m);
  thread_local std::vector<float> packed_a;  // the calling thread's, reused by later calls
  packed_a.resize(static_cast<size_t>(groups.count * b.k() * kRows));
  float* pa = packed_a.data();
  const auto pack = [&](int64_t g0, int64_t g1) { pack_a(a, lda, b.k(), groups, g0, g1, pa); };
  run_products(threads, m, groups, pack, pa, b, c_out, ldc, ends, true);
}

void gemm_f32_prepacked(int threads, const PackedRows& a, const PackedMatrix& b, float* c_out,
                        int64_t ldc, const float* row_start, bool relu) {
  if (!packed_gemm_supported()) fail_internal("packed gemm called on a CPU without AVX2/FMA");
  if (a.k() != b.k()) fail_internal("prepacked gemm: A and B differ in depth");
  const Ends ends{.row_start = row_start, .relu = relu};
  if (empty_product(a.m(), b, c_out, ldc, ends)) return;
  const auto packed = [](int64_t, int64_t) {};
  run_products(threads, a.m(), RowGroups(a.m()), packed, a.data(), b, c_out, ldc, ends, false);
}

}  // namespace qforge
