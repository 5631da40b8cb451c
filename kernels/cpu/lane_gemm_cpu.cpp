// gemm_f32_lanes (kernels/packed_gemm.h): a convolution's product with its output channels as the
// vector lanes. Per call, 32 rows of A (two vectors a k step) times up to 14 grid positions of
// one output row: each position's element of B is broadcast and multiplied into both vectors, so
// a k step is 2 loads of A, 14 broadcasts and 28 fused multiply-adds, none of them wasted on a
// padding column. The sums are then turned (16 x 16 transposes) into rows of C and stored, each
// row's positions one run. Measured against the panel kernel on ResNet-50's 3 x 3 layers
// (bench/RESULTS.md): 64 channels on 56 x 56, 256 on 14 x 14 and 512 on 7 x 7.
// Where the CPU has AVX2 and FMA but not AVX-512 (or a test turned it off), the same product
// runs 16 rows (two vectors of 8 lanes) times up to 6 positions a call: 12 sums, two vectors of
// A and a broadcast in 15 of the 16 registers, the sums turned into rows by 8 x 8 transposes.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#include "ir/error.h"
#include "kernels/cpu/avx2_transpose.h"
#include "kernels/cpu/task_pool.h"
#include "kernels/packed_gemm.h"

namespace qforge {

namespace {

constexpr int64_t kLanes = 16;

std::atomic<bool> lanes_on{true};  // lane_gemm_use
// Positions a call computes: 2 x 14 sums, 2 vectors of A and a broadcast take 31 of the 32
// registers.
constexpr int kMaxTile = 14;
// Rows of C a call computes: two blocks of 16 lanes.
constexpr int64_t kPair = 2 * kLanes;
// The AVX2 kernel's: 8 lanes a vector, one block of 16 rows (two vectors) a call, 2 x 6 sums.
constexpr int64_t kLanes8 = 8;
constexpr int kMaxTile8 = 6;
// Depth of one pass over k: the pair's block of A (32 rows x 160: 20 KiB) stays in L1 while a
// band's tiles run through it. A product's passes are equally deep. Where the CPU lacks
// AVX-512F, the AVX2 kernel's block (16 rows) takes passes of up to kLaneDepthAvx2 (40 KiB):
// ResNet-50 b1 on an AMD EPYC 108 -> 105 ms. The bits do not depend on it.
constexpr int64_t kLaneDepth = 160;
constexpr int64_t kLaneDepthAvx2 = 640;
int64_t lane_depth() {
  static const int64_t depth =
      __builtin_cpu_supports("avx512f") ? kLaneDepth : kLaneDepthAvx2;
  return depth;
}
// Tiles a task's band of output rows holds: their sums between passes (32 x 14 floats each, 56
// KiB in all) stay in L2.
constexpr int64_t kBandTiles = 32;

// A prefetch into L2 (a hint: never faults, so it may run past A's end), where the next pass
// finds it without taking the L1 from this pass's block. A macro: GCC 12 drops a prefetch made
// in an inline function when a function with a target attribute inlines it.
#define QF_PREFETCH_LANE(p) _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T1)

// One call: rows [m0, m0 + rows) of C (rows <= 32) at tile positions [0, NJ) of B's columns.
struct LaneCall {
  const float* a;              // block m0 / 16 at the pass's first k; the next block a_stride on
  int64_t a_stride;            // k * 16
  const float* b;              // B's row 0 at the tile's first column (row kk: + row_offset[kk])
  const int64_t* row_offset;   // the pass's first
  int64_t depth;
  float* sums;                 // the tile's sums between passes: 2 x NJ vectors
  bool first, last;
  bool ahead;                  // ask for the next pass's rows of A (depth further) as it runs
  const float* start;          // row_start + m0, or null (0)
  int rows;
  float* c;                    // C's row m0 at the tile's first position
  int64_t ldc;
  const float* z;              // the addend at C's row m0 and the tile's first position, or null
  bool relu;
  // The AVX2 kernel's tiles may run on into the next output row: positions from `split` on read
  // B `gap` columns further (past the grid's padding); C's positions are consecutive either way.
  int split = 0;
  int64_t gap = 0;
};

// r[j] = lane j of each of r's 16 vectors: column j of the 16 x 16 block whose rows they are.
// (The maskz forms with every lane on: GCC 12 takes the plain forms' undefined source for a
// read.)
__attribute__((target("avx512f"), always_inline)) inline void transpose16(__m512 (&r)[16]) {
  constexpr __mmask16 kAll = 0xFFFF;
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_maskz_unpacklo_ps(kAll, r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_maskz_unpackhi_ps(kAll, r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i + 0] = _mm512_maskz_shuffle_ps(kAll, t[4 * i + 0], t[4 * i + 2], 0x44);
    r[4 * i + 1] = _mm512_maskz_shuffle_ps(kAll, t[4 * i + 0], t[4 * i + 2], 0xEE);
    r[4 * i + 2] = _mm512_maskz_shuffle_ps(kAll, t[4 * i + 1], t[4 * i + 3], 0x44);
    r[4 * i + 3] = _mm512_maskz_shuffle_ps(kAll, t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 4; ++j) {
      t[8 * i + j] = _mm512_maskz_shuffle_f32x4(kAll, r[8 * i + j], r[8 * i + 4 + j], 0x88);
      t[8 * i + 4 + j] = _mm512_maskz_shuffle_f32x4(kAll, r[8 * i + j], r[8 * i + 4 + j], 0xDD);
    }
  }
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_maskz_shuffle_f32x4(kAll, t[j], t[j + 8], 0x88);
    r[j + 8] = _mm512_maskz_shuffle_f32x4(kAll, t[j], t[j + 8], 0xDD);
  }
}

__attribute__((target("avx512f"), always_inline)) inline __mmask16 first_lanes(int64_t n) {
  return static_cast<__mmask16>(n >= kLanes ? 0xFFFFu : (1u << std::max<int64_t>(n, 0)) - 1u);
}

// The sums of one call: from `start` (first pass) or the tile's sums, through the pass's k,
// then into the tile's sums or (last pass) plus the addend, through the Relu, into C. Every
// element is one FMA chain in k order. H blocks of 16 rows: 2, or 1 where the call has at most
// 16 rows (a convolution of 16 output channels, or a product's last 16 rows), which then does
// half the multiply-adds (the sample CNN's first layer: 22.8-30.1 -> 15.9-19.0 us at one thread).
template <int NJ, int H>
__attribute__((target("avx512f"))) void lane_kernel(const LaneCall& call) {
  static_assert(H == 1 || H == 2);
  __m512 acc[H][NJ];
#pragma GCC unroll 2
  for (int h = 0; h < H; ++h) {
    __m512 v = _mm512_setzero_ps();
    if (call.first && call.start != nullptr) {
      v = _mm512_maskz_loadu_ps(first_lanes(call.rows - h * kLanes), call.start + h * kLanes);
    }
#pragma GCC unroll 14
    for (int j = 0; j < NJ; ++j) {
      acc[h][j] = call.first ? v : _mm512_loadu_ps(call.sums + (h * NJ + j) * kLanes);
    }
  }
  const float* a0 = call.a;
  const float* a1 = call.a + call.a_stride;
#pragma GCC unroll 2
  for (int64_t k = 0; k < call.depth; ++k) {
    const float* row = call.b + call.row_offset[k];
    const __m512 w0 = _mm512_load_ps(a0 + k * kLanes);
    const __m512 w1 = H == 2 ? _mm512_load_ps(a1 + k * kLanes) : w0;
    if (call.ahead) {
      QF_PREFETCH_LANE(a0 + (k + call.depth) * kLanes);
      if constexpr (H == 2) QF_PREFETCH_LANE(a1 + (k + call.depth) * kLanes);
    }
#pragma GCC unroll 14
    for (int j = 0; j < NJ; ++j) {
      const __m512 x = _mm512_set1_ps(row[j]);
      acc[0][j] = _mm512_fmadd_ps(w0, x, acc[0][j]);
      if constexpr (H == 2) acc[H - 1][j] = _mm512_fmadd_ps(w1, x, acc[H - 1][j]);
    }
  }
  if (!call.last) {
#pragma GCC unroll 2
    for (int h = 0; h < H; ++h) {
#pragma GCC unroll 14
      for (int j = 0; j < NJ; ++j) _mm512_storeu_ps(call.sums + (h * NJ + j) * kLanes, acc[h][j]);
    }
    return;
  }
  const auto mask = static_cast<__mmask16>((1u << NJ) - 1u);
#pragma GCC unroll 2
  for (int h = 0; h < H; ++h) {
    const int rows = std::min<int>(call.rows - h * static_cast<int>(kLanes), kLanes);
    if (rows <= 0) break;
    __m512 r[16];
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) r[j] = j < NJ ? acc[h][j] : _mm512_setzero_ps();
    transpose16(r);
    for (int l = 0; l < rows; ++l) {
      const int64_t row = (h * kLanes + l) * call.ldc;
      __m512 v = r[l];
      if (call.z != nullptr) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, call.z + row));
      // max(v, 0) returns its second operand unless v > 0: 0 for NaN and -0, as Relu's x > 0 ? x
      // : 0 and the panel kernel's.
      if (call.relu) v = _mm512_maskz_max_ps(0xFFFF, v, _mm512_setzero_ps());
      _mm512_mask_storeu_ps(call.c + row, mask, v);
    }
  }
}

// The first N (0-3) floats at p into the low lanes, zeros above: loads of exactly those floats.
template <int N>
__attribute__((target("avx2"), always_inline)) inline __m128 load_few(const float* p) {
  if constexpr (N == 0) {
    return _mm_setzero_ps();
  } else if constexpr (N == 1) {
    return _mm_load_ss(p);
  } else {
    const __m128 two = _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(p)));
    if constexpr (N == 2) return two;
    return _mm_movelh_ps(two, _mm_load_ss(p + 2));
  }
}

// The first N (1-6) floats at p as a vector's low lanes, zeros above; and the low N lanes of v
// stored at p. Plain loads and stores of exactly those floats: AVX2's masked stores run
// microcoded on some CPUs (AMD's Zen), a store of a tile's row costing more than its k steps.
template <int N>
__attribute__((target("avx2"), always_inline)) inline __m256 load_first(const float* p) {
  if constexpr (N >= 4) {
    return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(p)), load_few<N - 4>(p + 4),
                                1);
  } else {
    return _mm256_insertf128_ps(_mm256_castps128_ps256(load_few<N>(p)), _mm_setzero_ps(), 1);
  }
}
template <int N>
__attribute__((target("avx2"), always_inline)) inline void store_first(float* p, __m256 v) {
  __m128 part = _mm256_castps256_ps128(v);
  if constexpr (N >= 4) {
    _mm_storeu_ps(p, part);
    part = _mm256_extractf128_ps(v, 1);
    p += 4;
  }
  constexpr int kRest = N >= 4 ? N - 4 : N;
  if constexpr (kRest >= 2) {
    _mm_storel_pi(reinterpret_cast<__m64*>(p), part);
    part = _mm_movehl_ps(part, part);
    p += 2;
  }
  if constexpr (kRest % 2 == 1) _mm_store_ss(p, part);
}

// The AVX2 kernel: one block of 16 rows (A's two vectors of 8 a k step), up to 6 positions.
// The same FMA chains as lane_kernel's, the same sums between passes (2 x NJ vectors, here of
// 8), the same stores through 8 x 8 transposes.
template <int NJ>
__attribute__((target("avx2,fma"))) void lane_kernel_avx2(const LaneCall& call) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  __m256 acc0[NJ], acc1[NJ];  // rows 0-7 and 8-15 of the block
  __m256 v0 = _mm256_setzero_ps(), v1 = _mm256_setzero_ps();
  if (call.first && call.start != nullptr) {
    v0 = _mm256_maskload_ps(call.start, _mm256_cmpgt_epi32(_mm256_set1_epi32(call.rows), lane));
    v1 = _mm256_maskload_ps(call.start + kLanes8,
                            _mm256_cmpgt_epi32(_mm256_set1_epi32(call.rows - 8), lane));
  }
#pragma GCC unroll 6
  for (int j = 0; j < NJ; ++j) {
    acc0[j] = call.first ? v0 : _mm256_loadu_ps(call.sums + j * kLanes8);
    acc1[j] = call.first ? v1 : _mm256_loadu_ps(call.sums + (NJ + j) * kLanes8);
  }
  const float* a = call.a;
  const int64_t depth = call.depth;
  int64_t at[NJ];  // each position's column from the tile's first
#pragma GCC unroll 6
  for (int j = 0; j < NJ; ++j) at[j] = j < call.split ? j : j + call.gap;
#pragma GCC unroll 2
  for (int64_t k = 0; k < depth; ++k) {
    const float* row = call.b + call.row_offset[k];
    const __m256 w0 = _mm256_load_ps(a + k * kLanes);
    const __m256 w1 = _mm256_load_ps(a + k * kLanes + kLanes8);
    if (call.ahead) QF_PREFETCH_LANE(a + (k + depth) * kLanes);
#pragma GCC unroll 6
    for (int j = 0; j < NJ; ++j) {
      const __m256 x = _mm256_broadcast_ss(row + at[j]);
      acc0[j] = _mm256_fmadd_ps(w0, x, acc0[j]);
      acc1[j] = _mm256_fmadd_ps(w1, x, acc1[j]);
    }
  }
  if (!call.last) {
#pragma GCC unroll 6
    for (int j = 0; j < NJ; ++j) {
      _mm256_storeu_ps(call.sums + j * kLanes8, acc0[j]);
      _mm256_storeu_ps(call.sums + (NJ + j) * kLanes8, acc1[j]);
    }
    return;
  }
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
    const int rows = std::min<int>(call.rows - h * static_cast<int>(kLanes8), kLanes8);
    if (rows <= 0) break;
    __m256 r[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      r[j] = j < NJ ? (h == 0 ? acc0[j] : acc1[j]) : _mm256_setzero_ps();
    }
    transpose8(r);
    for (int l = 0; l < rows; ++l) {
      const int64_t row = (h * kLanes8 + l) * call.ldc;
      __m256 v = r[l];
      if (call.z != nullptr) v = _mm256_add_ps(v, load_first<NJ>(call.z + row));
      // max(v, 0) returns its second operand unless v > 0, as the AVX-512 kernel's.
      if (call.relu) v = _mm256_max_ps(v, _mm256_setzero_ps());
      store_first<NJ>(call.c + row, v);
    }
  }
}

#define QF_LANE_CASE(n)                                                          \
  case n:                                                                        \
    return call.rows > kLanes ? lane_kernel<n, 2>(call) : lane_kernel<n, 1>(call);
#define QF_LANE_CASE8(n) \
  case n:                \
    return lane_kernel_avx2<n>(call);

// The kernel for a tile of `nj` positions: AVX-512's (up to 14) where `wide`, else AVX2's (up to
// 6).
void lane_kernel_for(bool wide, int nj, const LaneCall& call) {
  if (!wide) {
    switch (nj) {
      QF_LANE_CASE8(1) QF_LANE_CASE8(2) QF_LANE_CASE8(3) QF_LANE_CASE8(4) QF_LANE_CASE8(5)
      QF_LANE_CASE8(6)
      default: fail_internal("lane gemm: an AVX2 tile of " + std::to_string(nj) + " positions");
    }
  }
  switch (nj) {
    QF_LANE_CASE(1) QF_LANE_CASE(2) QF_LANE_CASE(3) QF_LANE_CASE(4) QF_LANE_CASE(5)
    QF_LANE_CASE(6) QF_LANE_CASE(7) QF_LANE_CASE(8) QF_LANE_CASE(9) QF_LANE_CASE(10)
    QF_LANE_CASE(11) QF_LANE_CASE(12) QF_LANE_CASE(13) QF_LANE_CASE(14)
    default: fail_internal("lane gemm: a tile of " + std::to_string(nj) + " positions");
  }
}

#undef QF_LANE_CASE8
#undef QF_LANE_CASE

// A run of positions (a kept row of the grid, or a stretch of rows: below) split into
// tiles of at most `most` positions, as even as they split (28 in 14s: 14 and 14; 15: 8 and 7),
// so no tile is a sliver. Also splits an image's rows into stretches.
struct RowTiles {
  int64_t count, base, extra;
  RowTiles(int64_t len, int64_t most)
      : count((len + most - 1) / most), base(len / count), extra(len % count) {}
  int64_t x0(int64_t t) const { return t * base + std::min(t, extra); }
  int width(int64_t t) const { return static_cast<int>(base + (t < extra ? 1 : 0)); }
};

}  // namespace

bool lane_gemm_supported() { return packed_gemm_supported() && lanes_on.load(); }

void lane_gemm_use(bool on) { lanes_on.store(on); }

void gemm_f32_lanes(int threads, const PackedRows& a, const InPlaceColumns& b,
                    const ColumnGrid& grid, float* c, int64_t ldc, const float* row_start,
                    bool relu, const float* addend, int64_t b_image_stride) {
  if (!lane_gemm_supported()) fail_internal("lane gemm called where it does not run");
  if (a.layout() != RowLayout::Lanes) fail_internal("lane gemm: A not packed as lanes");
  const int64_t k = a.k(), m = a.m();
  if (static_cast<int64_t>(b.row_offset.size()) != k) {
    fail_internal("lane gemm: A and B differ in depth");
  }
  if (b.n < 0 || grid.row_len < 1 || grid.rows < 1 || grid.row_kept > grid.row_len ||
      grid.rows_kept > grid.rows) {
    fail_internal("lane gemm: a column grid that does not fit its columns");
  }
  if (m == 0 || b.n == 0 || grid.row_kept == 0 || grid.rows_kept == 0) return;
  // The kept rows of the grid's images that B's columns reach: image i's row y is grid row
  // i * rows + y, its positions columns (i * rows + y) * row_len + x.
  const int64_t plane = grid.rows * grid.row_len;
  const int64_t images = (b.n + plane - 1) / plane;
  if ((images - 1) * plane + (grid.rows_kept - 1) * grid.row_len + grid.row_kept > b.n) {
    fail_internal("lane gemm: the grid's last kept row lies past B's columns");
  }
  const int64_t b_images = b_image_stride != 0 ? b_image_stride : plane;
  // AVX-512: 32 rows x up to 14 positions of one output row a call, or of a stretch of rows
  // where the grid keeps whole rows (a 1x1 convolution's planes: its positions one run in B and
  // in C; a 7 x 7 plane's 49 as 4 tiles of 12-13, not 7 of 7: ResNet-50's 512 -> 2048 layers
  // there 4.61-4.75 -> 4.40-4.60 ms at one thread, its 1024 -> 256 on 14 x 14 5.51-5.53 ->
  // 5.22-5.43). AVX2: 16 rows x up to 6 positions of a stretch of output rows (a 7 x 7
  // plane's 49 positions as 9 tiles, not 7 x 2; a tile crossing into the next row reads B past
  // the grid's padding). Stretches of at most kBandTiles tiles' positions, their rows as even
  // as whole rows split.
  const bool wide = packed_gemm_avx512();
  const int64_t unit = wide ? kPair : kLanes;
  // The AVX-512 kernel reads a tile's positions as one run: across rows only where there is no
  // padding between them.
  const bool one_run = grid.row_len == grid.row_kept;
  const int64_t most_tile = wide ? kMaxTile : std::min<int64_t>(kMaxTile8, grid.row_kept);
  const int64_t stretch_rows =
      wide ? (one_run ? std::max<int64_t>(1, kBandTiles * kMaxTile / grid.row_kept) : 1)
           : std::max<int64_t>(1, kBandTiles * kMaxTile8 / grid.row_kept);
  const RowTiles stretches(grid.rows_kept, stretch_rows);
  const int64_t out_rows = images * stretches.count;
  // The tiles of the first (longest) stretch.
  const int64_t widest = RowTiles(stretches.width(0) * grid.row_kept, most_tile).count;
  // Bands of at most kBandTiles tiles, as even as whole stretches allow (28 rows of two
  // tiles: two bands of 14, not 16 and 12), so that threads sharing them finish together.
  const int64_t most = std::max<int64_t>(1, kBandTiles / widest);
  const int64_t bands = (out_rows + most - 1) / most;
  const int64_t band = (out_rows + bands - 1) / bands;
  const int64_t units = (m + unit - 1) / unit;
  // Passes of at most lane_depth(), equally deep; one (of depth 0) where k is 0, which stores
  // the starts.
  const int64_t pass_count = std::max<int64_t>(1, (k + lane_depth() - 1) / lane_depth());
  const int64_t step = (k + pass_count - 1) / pass_count;
  const bool passes = pass_count > 1;
  // The sums between passes, one set per thread (slot), reused by its tasks.
  std::vector<std::vector<float>> sums(static_cast<size_t>(std::max(threads, 1)));
  const int64_t task_floats = band * widest * 2 * kMaxTile * kLanes;
  // A product of fewer multiply-adds than kSerialBelowMacs (task_pool.h) runs on the calling
  // thread, as the panel product's do (the sample CNN's first layer, 0.3 M: 25.6-29.7 us on two
  // threads, 15.9-19.0 on one).
  const double macs = static_cast<double>(m) * static_cast<double>(k) *
                      static_cast<double>(images * grid.rows_kept * grid.row_kept);
  if (macs < kSerialBelowMacs) threads = 1;
  run_tasks(threads, bands * units, [&](int64_t t, int slot) {
    const int64_t u = t % units, r0 = t / units * band, r1 = std::min(out_rows, r0 + band);
    const int64_t m0 = u * unit;
    std::vector<float>& own = sums[static_cast<size_t>(slot)];
    if (passes && own.size() < static_cast<size_t>(task_floats)) {
      own.resize(static_cast<size_t>(task_floats));
    }
    LaneCall call{.a = nullptr,
                  .a_stride = k * kLanes,
                  .b = nullptr,
                  .row_offset = nullptr,
                  .depth = 0,
                  .sums = nullptr,
                  .first = false,
                  .last = false,
                  .ahead = false,
                  .start = row_start != nullptr ? row_start + m0 : nullptr,
                  .rows = static_cast<int>(std::min(unit, m - m0)),
                  .c = nullptr,
                  .ldc = ldc,
                  .z = nullptr,
                  .relu = relu};
    for (int64_t p = 0; p < pass_count; ++p) {
      const int64_t k0 = p * step;
      call.a = a.data() + (m0 / kLanes * k + k0) * kLanes;
      call.row_offset = b.row_offset.data() + k0;
      call.depth = std::min(step, k - k0);
      call.first = p == 0;
      call.last = p == pass_count - 1;
      int64_t tile = 0;
      for (int64_t r = r0; r < r1; ++r) {
        // Stretch r: its image, first row and positions.
        const int64_t image = r / stretches.count, at = r % stretches.count;
        const int64_t y0 = stretches.x0(at);
        const RowTiles tiles(stretches.width(at) * grid.row_kept, most_tile);
        for (int64_t ti = 0; ti < tiles.count; ++ti, ++tile) {
          // The tile's first position: row y, column x (on AVX2 a tile spans at most two rows:
          // it is no wider than a row; on AVX-512 any number where the grid keeps whole rows).
          const int64_t y = y0 + tiles.x0(ti) / grid.row_kept, x = tiles.x0(ti) % grid.row_kept;
          const int64_t column = image * b_images + y * grid.row_len + x;
          const int64_t stored = image * grid.image_stride + y * grid.row_kept + x;
          call.b = b.data + column;
          call.c = c + m0 * ldc + stored;
          call.z = addend != nullptr ? addend + m0 * ldc + stored : nullptr;
          call.split = static_cast<int>(grid.row_kept - x);
          call.gap = grid.row_len - grid.row_kept;
          call.sums = passes ? own.data() + tile * 2 * kMaxTile * kLanes : nullptr;
          // The pass's first tile asks for the next pass's block (the last pass's: the next
          // unit's first), which the other tiles then find in cache.
          call.ahead = tile == 0;
          lane_kernel_for(wide, tiles.width(ti), call);
        }
      }
    }
  });
}

}  // namespace qforge
