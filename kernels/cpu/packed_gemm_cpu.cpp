#include "kernels/packed_gemm.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <numeric>
#include <vector>

#include "ir/error.h"
#include "kernels/cpu/avx2_transpose.h"
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
// Depth of one pass over k, and of A's blocks: at most kDepth where the CPU has AVX-512F, so
// that the AVX-512 kernel's four panels' block (128 x 64: 32 KiB; 160 x 64: 40 KiB) stays in
// L1 through a pass. A product's passes are equally deep (pass_depth): a depth of 144 (a 3 x 3
// window over 16 channels) in one pass rather than 128 and then 16, whose round trip of C cost
// as much as its multiply-adds.
constexpr int64_t kDepth = 160;
// Where the CPU lacks AVX-512F, the AVX2 kernel (one panel, 64 bytes of B a k step) takes
// passes of up to kDepthAvx2: on an AMD EPYC (Zen 3) the 512 x 2048 x 5632 product ran 83.7 ->
// 90.2 GFLOP/s (ONNX Runtime's 90.8), 32 x 384 x 1536 66.5 -> 75, ResNet-50 b1 117 -> 108 ms
// (deeper still, 2048, lost 12% on products of depth 1536). Fixed by the CPU, not by
// packed_gemm_use_avx2_only: A is packed in passes of this depth once (PackedRows) and read in
// them later. The bits do not depend on it (each element one FMA chain in k order).
constexpr int64_t kDepthAvx2 = 1024;
inline int64_t max_depth() {
  static const int64_t depth = __builtin_cpu_supports("avx512f") ? kDepth : kDepthAvx2;
  return depth;
}
// The depth of each pass of a product of depth k (the last one maybe shallower): k split into
// as few passes of at most max_depth() as it takes, as evenly as whole rows allow.
inline int64_t pass_depth(int64_t k) {
  const int64_t passes = std::max<int64_t>(1, (k + max_depth() - 1) / max_depth());
  return (k + passes - 1) / passes;
}
// How far ahead of its k the kernel asks for A, in k steps (6 floats each): one prefetch per
// cache line, a pass's depth ahead, so the next call's block (the next group's, which
// pack_a lays out right after) is on its way too. A weight read once per product (ResNet-50's
// 7 x 7 layers: 9 MiB each) otherwise arrives at the pace of the CPU's own prefetchers: those
// layers ran at half their speed in a chain of them.
constexpr int64_t kPrefetchSteps = 128;
// Products of fewer multiply-adds than kSerialBelowMacs (task_pool.h) run on the calling thread,
// unless B is at least kSharedFromBBytes: a product of a few rows over a large weight (ResNet-50's
// last Gemm, 1 x 2048 x 1000; an LLM layer at one token) is a read of B at memory speed, which
// two threads do in about half the time.
constexpr double kSharedFromBBytes = 1.0 * (1 << 20);

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

// Where a pass's block of row group g starts in A packed by pack_a: the pass's blocks of every
// group one after another (depth = min(pass_depth(k), k - k0) deep each), then the next pass's.
inline int64_t a_block(const RowGroups& groups, int64_t g, int64_t k0, int64_t depth) {
  return (k0 * groups.count + g * depth) * kRows;
}

// A [m, k] in its row groups, each interleaved: group g's element (r, k0 + kk) of pass k0 at
// a_block(groups, g, k0, depth) + kk * kRows + r. Pass by pass, so that a pass reads A in one
// run (a weight read once per product, as the 7 x 7 layers of ResNet-50 read theirs, streams
// from memory instead of a few KiB from every group's far-apart rows). Packed once per call
// and read by every task.
// One group's block of a pass, 8 k at a time: its rows' 8 floats (zeros past `rows`) turned
// into 8 columns of kRows, each stored 8 wide over the start of the next one (which its own
// store then overwrites); the block's last column under a mask. Returns the k it reached.
__attribute__((target("avx2"))) int64_t pack_block_avx2(const float* src, int64_t lda,
                                                        int64_t rows, int64_t depth, float* dst) {
  const __m256i last = _mm256_setr_epi32(-1, -1, -1, -1, -1, -1, 0, 0);
  int64_t kk = 0;
  for (; kk + 8 <= depth; kk += 8) {
    __m256 v[8];
    for (int64_t r = 0; r < 8; ++r) {
      v[r] = r < rows ? _mm256_loadu_ps(src + r * lda + kk) : _mm256_setzero_ps();
    }
    transpose8(v);
    for (int64_t j = 0; j < 7; ++j) _mm256_storeu_ps(dst + (kk + j) * kRows, v[j]);
    if (kk + 8 < depth) {
      _mm256_storeu_ps(dst + (kk + 7) * kRows, v[7]);
    } else {
      _mm256_maskstore_ps(dst + (kk + 7) * kRows, last, v[7]);
    }
  }
  return kk;
}

// A [m, k] in its row groups, each interleaved: group g's element (r, k0 + kk) of pass k0 at
// a_block(groups, g, k0, depth) + kk * kRows + r. Pass by pass, so that a pass reads A in one
// run (a weight read once per product, as the 7 x 7 layers of ResNet-50 read theirs, streams
// from memory instead of a few KiB from every group's far-apart rows). Packed once per call
// and read by every task.
void pack_a(const float* a, int64_t lda, int64_t k, const RowGroups& groups, int64_t g0,
            int64_t g1, float* out) {
  static_assert(kRows == 6, "pack_block_avx2 stores columns of 6");
  const bool avx2 = packed_gemm_supported();
  for (int64_t g = g0; g < g1; ++g) {
    const int64_t r0 = groups.row0(g), rows = groups.rows(g);
    const int64_t step = pass_depth(k);
    for (int64_t k0 = 0; k0 < k; k0 += step) {
      const int64_t depth = std::min(step, k - k0);
      float* dst = out + a_block(groups, g, k0, depth);
      const float* src = a + r0 * lda + k0;
      const int64_t done = avx2 ? pack_block_avx2(src, lda, rows, depth, dst) : 0;
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t kk = done; kk < depth; ++kk) dst[kk * kRows + r] = src[r * lda + kk];
      }
    }
  }
}

// Where C's columns are stored: the lanes [first, first + count) of a panel go to a row of C at
// row + offset + lane. A panel's lanes are one run in a plain product; a convolution's grid of
// padded positions (packed_gemm.h, ColumnGrid) gives one run per output row a panel touches and
// none for the padding columns.
struct Seg {
  int64_t offset;
  int32_t first, count;
};

// Row r of C plus `offset` floats, as an address (a segment's offset may point before the row:
// only the lanes it names are read or written).
inline float* at(float* c, int64_t ldc, int r, int64_t offset) {
  return reinterpret_cast<float*>(reinterpret_cast<uintptr_t>(c) +
                                  static_cast<uintptr_t>(r * ldc + offset) * sizeof(float));
}
inline const float* at(const float* c, int64_t ldc, int r, int64_t offset) {
  return at(const_cast<float*>(c), ldc, r, offset);
}

// `p` moved by `bytes` (the addend's place for C's element; the two need not be one array).
inline float* shifted(float* p, intptr_t bytes) {
  return reinterpret_cast<float*>(reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(bytes));
}

// A lambda inside a kernel compiled for a target ISA is a function of its own: it needs the
// target too (GCC does not pass it on), and is inlined.
#define QF_AVX2_LAMBDA __attribute__((target("avx2,fma"), always_inline))
#define QF_AVX512_LAMBDA __attribute__((target("avx512f"), always_inline))

// B as the kernels read it. Packed: panel q's row kk at panel + q * stride + kk * 16. In place:
// row kk at data + row_offset[kk] + column, panel q 16 columns further (stride 16).
enum class BMode { Packed, InPlace };

// One kernel call's operands besides the rows of A and C.
struct Call {
  int64_t depth;
  const float* b;  // packed: the first panel's row k0; in place: data + the first column
  int64_t panel_stride;
  const int64_t* row_offset;  // in place: row_offset + k0
  const Seg* segs;            // the call's panels' segments
  const int32_t* seg_begin;   // panel q's are segs[seg_begin[q]] .. segs[seg_begin[q + 1]]
  bool first;
  const float* start;
  // First pass only (set where `first` is): every row's sums start at the values laid out as
  // one row of C here (a MatMul's bias, one per column), instead of at start[r].
  const float* col_start = nullptr;
  // Last pass: the values laid out as one row of C here added to every row's finished sums,
  // each sum rounded once more (a MatMul's bias added after its sums, as ONNX Add does).
  const float* col_add = nullptr;
  // Last pass only: the finished sums plus the element `addend_shift` bytes after C's (a
  // tensor laid out as C), then through the Relu where `relu`.
  bool add;
  intptr_t addend_shift;
  bool relu;
  // The next call's C (the next row group's, same panels; null: none), whose lines this call
  // asks for as it starts: on the first pass C's (stored or read), on the last pass with `add`
  // the addend's too. A product's C of many rows (ResNet-50's 1x1 layers: 256 rows of 3,136
  // floats a plane) is otherwise written a few lines per row at a time, more streams than the
  // CPU's prefetchers follow, each store waiting for its line from memory.
  float* next_c = nullptr;
  int next_rows = 0;
  bool next_ahead_c = false;
};

// A prefetch (a hint: never faults, so it may run past A's end). A macro: GCC 12 drops a
// prefetch made in an inline function when a function with a target attribute inlines it.
#define QF_PREFETCH_A(p) _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0)

// Products whose C is at least this many bytes ask for the next call's lines ahead.
constexpr double kAheadBytes = 2.0 * (1 << 20);
// The most lines a call asks for ahead: 6 rows x 4 panels x both ends, for C and its addend.
constexpr int kAheadMax = 96;

// The lines of the next call's C (and addend) into `out`, their count returned: for each row of
// the next group and each of the call's `panels` panels, the lines of its first and last lane
// (the ends of its segments; a panel of padding columns only: any address, a hint); C's first,
// then the addend's.
inline int ahead_lines(const Call& call, int64_t ldc, int panels, const float** out) {
  if (call.next_c == nullptr) return 0;
  int64_t lo[kQuad] = {}, hi[kQuad] = {};
  for (int p = 0; p < panels; ++p) {
    const int32_t s0 = call.seg_begin[p], s1 = call.seg_begin[p + 1];
    if (s1 == s0) continue;
    lo[p] = call.segs[s0].offset + call.segs[s0].first;
    hi[p] = call.segs[s1 - 1].offset + call.segs[s1 - 1].first + call.segs[s1 - 1].count - 1;
  }
  int n = 0;
  for (const bool addend : {false, true}) {
    if (addend ? !call.add : !call.next_ahead_c) continue;
    const intptr_t shift = addend ? call.addend_shift : 0;
    for (int r = 0; r < call.next_rows; ++r) {
      for (int p = 0; p < panels; ++p) {
        out[n++] = shifted(at(call.next_c, ldc, r, lo[p]), shift);
        out[n++] = shifted(at(call.next_c, ldc, r, hi[p]), shift);
      }
    }
  }
  return n;
}

// One of those lines asked for, into L2 (T1), where the CPU's own prefetchers put what they
// fetch, leaving the L1's fill buffers to the kernel's loads of A and B.
#define QF_PREFETCH_AHEAD(p) _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T1)

// C[R, 16] = (first ? start : C) + A[R, depth] @ B[depth, 16], stored through the panel's
// segments; start being row r's start[r] (0 where `start` is null), stored as max(v, 0) where
// `relu` (0 for NaN, as Relu's x > 0 ? x : 0).
// `a` is a group packed by pack_a; every element is one FMA chain in k order.
template <int R, BMode M>
__attribute__((target("avx2,fma"), always_inline)) inline void kernel(const float* a, float* c,
                                                                      int64_t ldc,
                                                                      const Call& call) {
  const Seg* segs = call.segs + call.seg_begin[0];  // the panel's
  const int nsegs = call.seg_begin[1] - call.seg_begin[0];
  const float* start = call.start;
  __m256 lo[R], hi[R];
  const bool whole = nsegs == 1 && segs[0].first == 0 && segs[0].count == kPanel;
  const float* ahead[kAheadMax];
  const int ahead_count = ahead_lines(call, ldc, 1, ahead);
  for (int i = 0; i < ahead_count; ++i) QF_PREFETCH_AHEAD(ahead[i]);
  // Row r's 16 lanes of a matrix laid out as C (`base` C or its addend), 0 where no segment
  // names a lane.
  // (`stride` 0: the same row for every r.)
  const auto load = [&](const float* base, int64_t stride, int r, __m256& l,
                        __m256& h) QF_AVX2_LAMBDA {
    if (whole) {
      l = _mm256_loadu_ps(at(base, stride, r, segs[0].offset));
      h = _mm256_loadu_ps(at(base, stride, r, segs[0].offset) + 8);
      return;
    }
    alignas(32) float t[kPanel] = {};
    for (int s = 0; s < nsegs; ++s) {
      std::memcpy(t + segs[s].first, at(base, stride, r, segs[s].offset) + segs[s].first,
                  static_cast<size_t>(segs[s].count) * sizeof(float));
    }
    l = _mm256_load_ps(t);
    h = _mm256_load_ps(t + 8);
  };
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    // Loaded into values of their own, not through references to the sums: GCC then keeps
    // the sums in registers (it spilled four of the twelve, a store and a load per k step).
    __m256 l, h;
    if (call.col_start != nullptr) {
      load(call.col_start, 0, r, l, h);
    } else if (call.first) {
      l = start != nullptr ? _mm256_set1_ps(start[r]) : _mm256_setzero_ps();
      h = l;
    } else {
      load(c, ldc, r, l, h);
    }
    lo[r] = l;
    hi[r] = h;
  }
  // One k step: B's row k (two vectors) times each row's element k of A into its sums. A macro,
  // not a lambda: a lambda that takes the sums by reference left GCC spilling them.
#define QF_AVX2_K_STEP(kk)                                                                    \
  do {                                                                                        \
    const float* row =                                                                        \
        M == BMode::Packed ? call.b + (kk) * kPanel : call.b + call.row_offset[kk];           \
    const __m256 b0 = _mm256_loadu_ps(row);                                                   \
    const __m256 b1 = _mm256_loadu_ps(row + 8);                                               \
    _Pragma("GCC unroll 6") for (int r = 0; r < R; ++r) {                                     \
      const __m256 x = _mm256_broadcast_ss(a + (kk) * kRows + r);                             \
      lo[r] = _mm256_fmadd_ps(x, b0, lo[r]);                                                  \
      hi[r] = _mm256_fmadd_ps(x, b1, hi[r]);                                                  \
    }                                                                                         \
  } while (false)
  // Two k steps an iteration (the loop's own instructions were a third of what it issued), A
  // asked for once per line.
  const int64_t depth = call.depth;
  int64_t k = 0;
  for (; k + 2 <= depth; k += 2) {
    QF_PREFETCH_A(a + (k + kPrefetchSteps) * kRows);
    QF_AVX2_K_STEP(k);
    QF_AVX2_K_STEP(k + 1);
  }
  if (k < depth) QF_AVX2_K_STEP(k);
#undef QF_AVX2_K_STEP
  if (call.col_add != nullptr) {
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      __m256 l, h;
      load(call.col_add, 0, r, l, h);
      lo[r] = _mm256_add_ps(lo[r], l);
      hi[r] = _mm256_add_ps(hi[r], h);
    }
  }
  if (call.add) {
    float* addend = shifted(c, call.addend_shift);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      __m256 l, h;
      load(addend, ldc, r, l, h);
      lo[r] = _mm256_add_ps(lo[r], l);
      hi[r] = _mm256_add_ps(hi[r], h);
    }
  }
  if (call.relu) {
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      // max_ps(v, 0) returns its second operand unless v > 0: 0 for NaN and -0.
      lo[r] = _mm256_max_ps(lo[r], _mm256_setzero_ps());
      hi[r] = _mm256_max_ps(hi[r], _mm256_setzero_ps());
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    if (whole) {
      _mm256_storeu_ps(at(c, ldc, r, segs[0].offset), lo[r]);
      _mm256_storeu_ps(at(c, ldc, r, segs[0].offset) + 8, hi[r]);
    } else {
      alignas(32) float t[kPanel];
      _mm256_store_ps(t, lo[r]);
      _mm256_store_ps(t + 8, hi[r]);
      for (int s = 0; s < nsegs; ++s) {
        std::memcpy(at(c, ldc, r, segs[s].offset) + segs[s].first, t + segs[s].first,
                    static_cast<size_t>(segs[s].count) * sizeof(float));
      }
    }
  }
}

__attribute__((target("avx512f"), always_inline)) inline __mmask16 seg_mask(const Seg& s) {
  return static_cast<__mmask16>(((1u << s.count) - 1u) << s.first);
}

// The AVX-512 kernel: P (1, 2 or 4) adjacent panels, one 16-float vector per row and panel, so six
// rows of four panels keep 24 sums in flight. C is read and written through each panel's
// segments under masks, so a short last panel or a grid's padding columns need no staging copy.
// Every element is the same FMA chain in k order as kernel<R>'s.
template <int R, int P, BMode M>
__attribute__((target("avx512f"), always_inline)) inline void kernel512(const float* a, float* c,
                                                                        int64_t ldc,
                                                                        const Call& call) {
  const Seg* segs = call.segs;
  const int32_t* seg_begin = call.seg_begin;
  const float* start = call.start;
  __m512 acc[R][P];
  __mmask16 one_mask[P];
  int64_t one_offset[P];
  bool one[P];  // the panel's lanes are one segment (always so in a plain product)
#pragma GCC unroll 4
  for (int p = 0; p < P; ++p) {
    // A panel may have no segment (a grid's padding columns only).
    one[p] = seg_begin[p + 1] - seg_begin[p] == 1;
    one_mask[p] = one[p] ? seg_mask(segs[seg_begin[p]]) : 0;
    one_offset[p] = one[p] ? segs[seg_begin[p]].offset : 0;
  }
  const float* ahead[kAheadMax];
  const int ahead_count = ahead_lines(call, ldc, P, ahead);
  for (int i = 0; i < ahead_count; ++i) QF_PREFETCH_AHEAD(ahead[i]);
  // Panel p's R rows of a matrix laid out as C (`base`: C or its addend), 0 where no segment
  // names a lane: each segment's mask and offset made once for all R rows (a grid's panels
  // straddle rows of the plane: two or three segments each).
  // (`stride` 0: the same row for every r.)
  const auto load = [&](const float* base, int64_t stride, int p,
                        __m512 (&v)[R]) QF_AVX512_LAMBDA {
    if (one[p]) {
#pragma GCC unroll 6
      for (int r = 0; r < R; ++r) {
        v[r] = _mm512_maskz_loadu_ps(one_mask[p], at(base, stride, r, one_offset[p]));
      }
      return;
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) v[r] = _mm512_setzero_ps();
    for (int32_t s = seg_begin[p]; s < seg_begin[p + 1]; ++s) {
      const __mmask16 mask = seg_mask(segs[s]);
      const int64_t offset = segs[s].offset;
#pragma GCC unroll 6
      for (int r = 0; r < R; ++r) {
        v[r] = _mm512_mask_loadu_ps(v[r], mask, at(base, stride, r, offset));
      }
    }
  };
#pragma GCC unroll 4
  for (int p = 0; p < P; ++p) {
    __m512 v[R];
    if (call.col_start != nullptr) {
      load(call.col_start, 0, p, v);
    } else if (call.first) {
#pragma GCC unroll 6
      for (int r = 0; r < R; ++r) {
        v[r] = start != nullptr ? _mm512_set1_ps(start[r]) : _mm512_setzero_ps();
      }
    } else {
      load(c, ldc, p, v);
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) acc[r][p] = v[r];
  }
#pragma GCC unroll 4
  for (int64_t k = 0; k < call.depth; ++k) {
    if (k % 2 == 0) QF_PREFETCH_A(a + (k + kPrefetchSteps) * kRows);
    __m512 bv[P];
    const float* row = M == BMode::Packed ? call.b + k * kPanel : call.b + call.row_offset[k];
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) bv[p] = _mm512_loadu_ps(row + p * call.panel_stride);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m512 x = _mm512_set1_ps(a[k * kRows + r]);
#pragma GCC unroll 4
      for (int p = 0; p < P; ++p) acc[r][p] = _mm512_fmadd_ps(x, bv[p], acc[r][p]);
    }
  }
  if (call.col_add != nullptr) {
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      __m512 v[R];
      load(call.col_add, 0, p, v);
#pragma GCC unroll 6
      for (int r = 0; r < R; ++r) acc[r][p] = _mm512_add_ps(acc[r][p], v[r]);
    }
  }
  if (call.add) {
    float* addend = shifted(c, call.addend_shift);
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      __m512 v[R];
      load(addend, ldc, p, v);
#pragma GCC unroll 6
      for (int r = 0; r < R; ++r) acc[r][p] = _mm512_add_ps(acc[r][p], v[r]);
    }
  }
  if (call.relu) {
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
      for (int p = 0; p < P; ++p) {
        // max_ps(v, 0) returns its second operand unless v > 0: 0 for NaN and -0. (The maskz
        // form with every lane on: GCC 12 takes _mm512_max_ps's undefined source for a read.)
        acc[r][p] = _mm512_maskz_max_ps(0xFFFF, acc[r][p], _mm512_setzero_ps());
      }
    }
  }
#pragma GCC unroll 4
  for (int p = 0; p < P; ++p) {
    if (one[p]) {
#pragma GCC unroll 6
      for (int r = 0; r < R; ++r) {
        _mm512_mask_storeu_ps(at(c, ldc, r, one_offset[p]), one_mask[p], acc[r][p]);
      }
      continue;
    }
    for (int32_t s = seg_begin[p]; s < seg_begin[p + 1]; ++s) {
      const __mmask16 mask = seg_mask(segs[s]);
      const int64_t offset = segs[s].offset;
#pragma GCC unroll 6
      for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(at(c, ldc, r, offset), mask, acc[r][p]);
    }
  }
}


template <int P, BMode M>
__attribute__((target("avx512f"))) void kernel512_rows(int64_t rows, const float* a, float* c,
                                                       int64_t ldc, const Call& call) {
  switch (rows) {
    case 6: return kernel512<6, P, M>(a, c, ldc, call);
    case 5: return kernel512<5, P, M>(a, c, ldc, call);
    case 4: return kernel512<4, P, M>(a, c, ldc, call);
    case 3: return kernel512<3, P, M>(a, c, ldc, call);
    case 2: return kernel512<2, P, M>(a, c, ldc, call);
    case 1: return kernel512<1, P, M>(a, c, ldc, call);
    default: fail_internal("packed gemm: a row group of " + std::to_string(rows) + " rows");
  }
}

template <BMode M>
__attribute__((target("avx2,fma"))) void kernel_rows(int64_t rows, const float* a, float* c,
                                                     int64_t ldc, const Call& call) {
  switch (rows) {
    case 6: return kernel<6, M>(a, c, ldc, call);
    case 5: return kernel<5, M>(a, c, ldc, call);
    case 4: return kernel<4, M>(a, c, ldc, call);
    case 3: return kernel<3, M>(a, c, ldc, call);
    case 2: return kernel<2, M>(a, c, ldc, call);
    case 1: return kernel<1, M>(a, c, ldc, call);
    default: fail_internal("packed gemm: a row group of " + std::to_string(rows) + " rows");
  }
}

// What the sums start from and what is stored: C's old values (`accumulate`), or each row's
// `row_start` value (null: 0); `relu` applies to the final sums.
struct Ends {
  bool accumulate = false;
  const float* row_start = nullptr;
  const float* col_start = nullptr;  // one value per column, for every row (not with row_start)
  const float* col_add = nullptr;    // one value per column, added to every row's finished sums
  const float* addend = nullptr;     // laid out as C: added to the finished sums before the Relu
  bool relu = false;
};

// Segments of up to four panels made on the spot: a plain product's, one per panel.
struct PlainSegs {
  Seg segs[4];
  int32_t begin[5] = {0, 1, 2, 3, 4};
};

// B [k, n] for a product: packed panels, or rows read in place (packed_gemm.h, InPlaceColumns),
// with where each panel's columns are stored in C.
struct BSource {
  BMode mode;
  const float* data;  // packed: panel 0; in place: column 0 of the row at offset 0
  int64_t k, n;
  const int64_t* row_offset;  // in place
  // Through a grid (always so in place): the panels' segments, panel p's from
  // segs[seg_begin[p]]. A plain product's (seg_begin empty) are its columns where they are,
  // made by segments().
  std::vector<Seg> segs;
  std::vector<int32_t> seg_begin;

  int64_t panels() const { return (n + kPanel - 1) / kPanel; }
  // Panel p's row k0: where a call's B starts.
  const float* rows_at(int64_t p, int64_t k0) const {
    return mode == BMode::Packed ? data + (p * k + k0) * kPanel : data + p * kPanel;
  }
  // Panels [p, p + np)'s segments into `call` (np <= 4; a plain product's made in `plain`).
  void segments(int64_t p, int64_t np, PlainSegs& plain, Call& call) const {
    if (!seg_begin.empty()) {  // through a grid
      call.segs = segs.data();
      call.seg_begin = seg_begin.data() + p;
      return;
    }
    for (int64_t q = 0; q < np; ++q) {
      const int64_t col = (p + q) * kPanel;
      plain.segs[q] = {.offset = col, .first = 0,
                       .count = static_cast<int32_t>(std::min(kPanel, n - col))};
    }
    call.segs = plain.segs;
    call.seg_begin = plain.begin;
  }
};

// The kernel for `np` panels (1, 2 or 4 on AVX-512, 1 on AVX2) reading B as `M` says.
template <BMode M>
void kernel_panels(bool wide, int64_t np, int64_t rows, const float* a, float* c, int64_t ldc,
                   const Call& call) {
  if (!wide) return kernel_rows<M>(rows, a, c, ldc, call);
  if (np == 4) return kernel512_rows<4, M>(rows, a, c, ldc, call);
  if (np == 2) return kernel512_rows<2, M>(rows, a, c, ldc, call);
  kernel512_rows<1, M>(rows, a, c, ldc, call);
}

// One task: row groups [g0, g1) of C, panels [p0, p1), from A packed by pack_a.
void run_task(const RowGroups& groups, int64_t g0, int64_t g1, int64_t p0, int64_t p1,
              const float* packed_a, const BSource& b, float* c, int64_t ldc, const Ends& ends) {
  const int64_t k = b.k;
  const bool wide = avx512_in_use();
  const bool in_place = b.mode == BMode::InPlace;
  // Lines asked for ahead only where C is larger than the L2: a smaller C stays in cache
  // between calls, and listing its lines costs more than it saves.
  const bool ahead = static_cast<double>(groups.count * kRows) * static_cast<double>(b.n) *
                         sizeof(float) >= kAheadBytes;
  const int64_t step = pass_depth(k);
  for (int64_t k0 = 0; k0 < k; k0 += step) {
    const int64_t depth = std::min(step, k - k0);
    Call call{.depth = depth,
              .b = nullptr,
              .panel_stride = in_place ? kPanel : k * kPanel,
              .row_offset = in_place ? b.row_offset + k0 : nullptr,
              .segs = nullptr,
              .seg_begin = nullptr,
              .first = k0 == 0 && !ends.accumulate,
              .start = nullptr,
              .col_start = k0 == 0 && !ends.accumulate ? ends.col_start : nullptr,
              .col_add = k0 + depth == k ? ends.col_add : nullptr,
              .add = ends.addend != nullptr && k0 + depth == k,
              .addend_shift = ends.addend == nullptr
                                  ? 0
                                  : static_cast<intptr_t>(
                                        reinterpret_cast<uintptr_t>(ends.addend) -
                                        reinterpret_cast<uintptr_t>(c)),
              .relu = ends.relu && k0 + depth == k,
              .next_ahead_c = k0 == 0};
    PlainSegs plain;
    // Panels in fours, then a pair, then one (AVX-512); one at a time (AVX2).
    const auto width = [&](int64_t p) -> int64_t {
      return !wide ? 1 : p1 - p >= 4 ? 4 : p1 - p >= 2 ? 2 : 1;
    };
    for (int64_t p = p0; p < p1;) {
      const int64_t np = width(p);
      call.b = b.rows_at(p, k0);
      b.segments(p, np, plain, call);
      // In place, B's rows lie a plane apart (a 1x1 convolution's input channels): more streams
      // than the CPU's prefetchers follow, so the first group of each panel waited for every
      // row from memory. The next panels' rows are asked for into L2 a slice per group while
      // this panel's groups run (ResNet-50 b8's 1x1 layers on 56 x 56 and 28 x 28 planes, one
      // thread, on an Intel Xeon: 4-9% faster each; bench/RESULTS.md, twentieth pass).
      const int64_t following = p + np;
      const float* next_b = in_place && following < p1 ? b.rows_at(following, k0) : nullptr;
      const int64_t next_bytes = width(following) * kPanel * static_cast<int64_t>(sizeof(float));
      const int64_t groups_here = std::max<int64_t>(1, g1 - g0);
      const int64_t slice = (depth + groups_here - 1) / groups_here;
      for (int64_t g = g0; g < g1; ++g) {
        if (next_b != nullptr) {
          const int64_t r1 = std::min(depth, (g - g0 + 1) * slice);
          for (int64_t r = (g - g0) * slice; r < r1; ++r) {
            const char* row = reinterpret_cast<const char*>(next_b + b.row_offset[k0 + r]);
            for (int64_t line = 0; line < next_bytes; line += 64) QF_PREFETCH_AHEAD(row + line);
          }
        }
        const float* pa = packed_a + a_block(groups, g, k0, depth);
        float* pc = c + groups.row0(g) * ldc;
        const bool next = ahead && g + 1 < g1 && (k0 == 0 || call.add);
        call.next_c = next ? c + groups.row0(g + 1) * ldc : nullptr;
        call.next_rows = next ? static_cast<int>(groups.rows(g + 1)) : 0;
        call.start = ends.row_start != nullptr ? ends.row_start + groups.row0(g) : nullptr;
        const int64_t rows = groups.rows(g);
        if (in_place) {
          kernel_panels<BMode::InPlace>(wide, np, rows, pa, pc, ldc, call);
        } else {
          kernel_panels<BMode::Packed>(wide, np, rows, pa, pc, ldc, call);
        }
      }
      p += np;
    }
  }
}

// A panel's columns from `cols` on set to 0 in each of its k rows (a last panel past n).
void zero_past_columns(float* panel, int64_t k, int64_t cols) {
  if (cols >= kPanel) return;
  for (int64_t kk = 0; kk < k; ++kk) {
    std::fill(panel + kk * kPanel + cols, panel + (kk + 1) * kPanel, 0.0f);
  }
}

}  // namespace

PackedMatrix::PackedMatrix(const float* b, int64_t k, int64_t n, int64_t ldb, bool trans)
    : k_(k), n_(n) {
  if (k < 0 || n < 0) fail_internal("packed matrix of negative shape");
  // Every element written below: the panels' columns from B, the last panel's past n as 0 (a
  // product packs attention's operands on every call, where zeroing all of them first cost a
  // second pass over memory).
  data_ = std::make_unique_for_overwrite<float[]>(static_cast<size_t>(panels() * k * kPanel));
  if (k == 0) return;
  for (int64_t p = 0; p < panels(); ++p) {
    float* out = mutable_panel(p);
    const int64_t cols = std::min(kPanel, n - p * kPanel);
    zero_past_columns(out, k, cols);
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
  if (panels() == 0) return;
  zero_past_columns(mutable_panel(panels() - 1), k, n - (panels() - 1) * kPanel);
}

PackedRows::PackedRows(const float* a, int64_t m, int64_t k, int64_t lda, RowLayout layout)
    : m_(m), k_(k), layout_(layout) {
  if (m < 0 || k < 0) fail_internal("packed rows of negative shape");
  if (layout == RowLayout::Lanes) {
    // Blocks of 16 rows in whole pairs, zero past m; 16 floats more to align the start.
    const int64_t blocks = (m + 31) / 32 * 2;
    data_ = std::make_unique<float[]>(static_cast<size_t>(blocks * k * kPanel + kPanel));
    align_ = static_cast<int64_t>((-(reinterpret_cast<uintptr_t>(data_.get()) / 4)) % 16);
    float* out = data_.get() + align_;
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t kk = 0; kk < k; ++kk) {
        out[((r / kPanel) * k + kk) * kPanel + r % kPanel] = a[r * lda + kk];
      }
    }
    return;
  }
  const RowGroups groups(std::max<int64_t>(m, 1));
  data_ = std::make_unique<float[]>(static_cast<size_t>(groups.count * k * kRows));
  if (m > 0) pack_a(a, lda, k, groups, 0, groups.count, data_.get());
}

const PackedRows& PackedRows::as_lanes(const float* a, int64_t lda) const {
  if (layout_ == RowLayout::Lanes) return *this;
  std::call_once(lanes_once_, [&] {
    lanes_ = std::make_unique<const PackedRows>(a, m_, k_, lda, RowLayout::Lanes);
  });
  return *lanes_;
}

bool packed_gemm_supported() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}

bool packed_gemm_avx512() { return packed_gemm_supported() && avx512_in_use(); }

void packed_gemm_use_avx2_only(bool on) { avx2_only.store(on); }

namespace {

BSource packed_source(const PackedMatrix& b) {
  return {.mode = BMode::Packed, .data = b.panel(0), .k = b.k(), .n = b.n(),
          .row_offset = nullptr, .segs = {}, .seg_begin = {}};
}

// The segments of src's panels through `grid`: each panel's lanes in runs that land next to
// each other in C, the padding positions in none.
void grid_segments(BSource& src, const ColumnGrid& grid) {
  src.seg_begin.assign(1, 0);
  // Column j's position (i, y, x) in the grid, stepped a run at a time: the kept or skipped
  // positions up to the end of the panel, of the row (kept) or of the image (rows past the
  // kept ones).
  int64_t i = 0, y = 0, x = 0;
  for (int64_t p = 0; p < src.panels(); ++p) {
    const auto lanes = static_cast<int32_t>(std::min(kPanel, src.n - p * kPanel));
    bool open = false;  // the last lane went into the last segment
    for (int32_t lane = 0; lane < lanes;) {
      const bool kept = y < grid.rows_kept && x < grid.row_kept;
      const int64_t left = !kept ? (y < grid.rows_kept ? grid.row_len - x
                                                       : (grid.rows - y) * grid.row_len - x)
                                 : grid.row_kept - x;
      const auto run = static_cast<int32_t>(std::min<int64_t>(left, lanes - lane));
      if (kept) {
        const int64_t offset = i * grid.image_stride + y * grid.row_kept + x - lane;
        if (open && src.segs.back().offset == offset) {
          src.segs.back().count += run;
        } else {
          src.segs.push_back({.offset = offset, .first = lane, .count = run});
        }
      }
      open = kept;
      lane += run;
      x += run;
      if (!kept && y >= grid.rows_kept && x == (grid.rows - y) * grid.row_len) {
        x = grid.row_len;  // the image's last row ends here
        y = grid.rows - 1;
      }
      if (x == grid.row_len) {
        x = 0;
        if (++y == grid.rows) {
          y = 0;
          ++i;
        }
      }
    }
    src.seg_begin.push_back(static_cast<int32_t>(src.segs.size()));
  }
}

// B read in place, its columns stored through `grid`.
BSource in_place_source(const InPlaceColumns& b, const ColumnGrid& grid) {
  BSource src{.mode = BMode::InPlace, .data = b.data,
              .k = static_cast<int64_t>(b.row_offset.size()), .n = b.n,
              .row_offset = b.row_offset.data(), .segs = {}, .seg_begin = {}};
  grid_segments(src, grid);
  return src;
}

// Packed B, its columns stored through `grid`.
BSource packed_grid_source(const PackedMatrix& b, const ColumnGrid& grid) {
  BSource src = packed_source(b);
  grid_segments(src, grid);
  return src;
}

// C[m, n] = packed A @ B (+ C): the row groups' tasks shared among `threads`. `pack(t)` lays out
// row task t's groups of A (nothing where A came packed) before any product reads them.
template <typename Pack>
void run_products(int threads, int64_t m, const RowGroups& groups, const Pack& pack,
                  const float* pa, const BSource& b, float* c_out, int64_t ldc,
                  const Ends& ends, bool pack_in_parallel) {
  // Row groups in tasks of at most kTaskRows rows, panels in groups of kTaskQuads fours (the
  // AVX-512 kernel's width; the last four maybe short), as many groups as make the task count a
  // multiple of the threads where the panels allow. Small tasks let a worker that wakes late
  // still find some to take (task_pool.h).
  constexpr int64_t kTaskGroups = kTaskRows / kRows;
  int64_t row_tasks = (groups.count + kTaskGroups - 1) / kTaskGroups;
  const int64_t panels = b.panels();
  const int64_t quads = (panels + kQuad - 1) / kQuad;
  int64_t col_tasks = (quads + kTaskQuads - 1) / kTaskQuads;
  if (threads > 1) {
    const auto t = static_cast<int64_t>(threads);
    const int64_t step = t / std::gcd(t, row_tasks);
    col_tasks = std::min(quads, (col_tasks + step - 1) / step * step);
    // Where the panels are too few for that (a 7 x 7 plane's 4 panels: one column task), smaller
    // row tasks do it: 512 rows in 4 tasks rather than 3 keep two threads busy to the end.
    if (row_tasks * col_tasks % t != 0) {
      const int64_t row_step = t / std::gcd(t, col_tasks);
      row_tasks = std::min(groups.count, (row_tasks + row_step - 1) / row_step * row_step);
    }
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
  const double macs = double(m) * double(b.n) * double(b.k);
  if (macs < kSerialBelowMacs && double(b.n) * double(b.k) * sizeof(float) < kSharedFromBBytes) {
    threads = 1;
  }
  // Packing A on the workers too costs one more wake-up and wait: worth it only when every
  // thread has rows to pack.
  run_tasks(pack_in_parallel && row_tasks >= threads ? threads : 1, row_tasks,
            [&](int64_t t, int) { pack_rows(t); });
  run_tasks(threads, total, [&](int64_t t, int) { task(t); });
}

// B without depth: C is what the sums start from (`ends`), through the Relu where asked, at
// the places B's segments name. True when that was all to do.
bool empty_product(int64_t m, const BSource& b, float* c, int64_t ldc, const Ends& ends) {
  if (m <= 0 || b.n == 0) return true;
  if (b.k != 0) return false;
  PlainSegs plain;
  Call call{};
  for (int64_t p = 0; p < b.panels(); ++p) {
    b.segments(p, 1, plain, call);
    for (int32_t si = call.seg_begin[0]; si < call.seg_begin[1]; ++si) {
      const Seg& s = call.segs[si];
      for (int64_t i = 0; i < m; ++i) {
        float* out = at(c, ldc, static_cast<int>(i), s.offset);
        for (int32_t j = s.first; j < s.first + s.count; ++j) {
          float v = ends.accumulate  ? out[j]
                    : ends.col_start ? ends.col_start[s.offset + j]
                    : ends.row_start ? ends.row_start[i]
                                     : 0.0f;
          if (ends.col_add != nullptr) v += ends.col_add[s.offset + j];
          if (ends.addend != nullptr) v += ends.addend[out + j - c];
          out[j] = !ends.relu || v > 0 ? v : 0.0f;
        }
      }
    }
  }
  return true;
}

void check_supported() {
  if (!packed_gemm_supported()) fail_internal("packed gemm called on a CPU without AVX2/FMA");
}

// C = A @ B with A packed once: see gemm_f32_prepacked.
void prepacked(int threads, const PackedRows& a, const BSource& b, float* c_out, int64_t ldc,
               const float* row_start, bool relu, const float* addend) {
  if (a.k() != b.k) fail_internal("prepacked gemm: A and B differ in depth");
  if (a.layout() != RowLayout::Groups) fail_internal("prepacked gemm: A packed as lanes");
  const Ends ends{.row_start = row_start, .addend = addend, .relu = relu};
  if (empty_product(a.m(), b, c_out, ldc, ends)) return;
  const auto packed = [](int64_t, int64_t) {};
  run_products(threads, a.m(), RowGroups(a.m()), packed, a.data(), b, c_out, ldc, ends, false);
}

}  // namespace

void gemm_f32_packed(int threads, int64_t m, const float* a, int64_t lda, const PackedMatrix& b,
                     float* c_out, int64_t ldc, bool accumulate, const float* col_start,
                     const float* col_add) {
  check_supported();
  const Ends ends{.accumulate = accumulate,
                  .col_start = accumulate ? nullptr : col_start,
                  .col_add = col_add};
  const BSource src = packed_source(b);
  if (empty_product(m, src, c_out, ldc, ends)) return;
  const RowGroups groups(m);
  // The calling thread's, reused by later calls; it only grows (growing it again after a
  // smaller call's resize would zero what it adds).
  thread_local std::vector<float> packed_a;
  const auto floats = static_cast<size_t>(groups.count * b.k() * kRows);
  if (packed_a.size() < floats) packed_a.resize(floats);
  float* pa = packed_a.data();
  const auto pack = [&](int64_t g0, int64_t g1) { pack_a(a, lda, b.k(), groups, g0, g1, pa); };
  run_products(threads, m, groups, pack, pa, src, c_out, ldc, ends, true);
}

bool gemm_prepacked_one_pass(int64_t k) { return k <= max_depth(); }

void gemm_f32_prepacked(int threads, const PackedRows& a, const PackedMatrix& b, float* c_out,
                        int64_t ldc, const float* row_start, bool relu, const float* addend) {
  check_supported();
  prepacked(threads, a, packed_source(b), c_out, ldc, row_start, relu, addend);
}

namespace {

void check_grid(int64_t n, const ColumnGrid& grid) {
  if (n < 0 || grid.row_len < 1 || grid.rows < 1 || grid.row_kept > grid.row_len ||
      grid.rows_kept > grid.rows) {
    fail_internal("prepacked gemm: a column grid that does not fit its columns");
  }
}

}  // namespace

void gemm_f32_prepacked(int threads, const PackedRows& a, const PackedMatrix& b,
                        const ColumnGrid& grid, float* c_out, int64_t ldc, const float* row_start,
                        bool relu, const float* addend) {
  check_supported();
  check_grid(b.n(), grid);
  prepacked(threads, a, packed_grid_source(b, grid), c_out, ldc, row_start, relu, addend);
}

void gemm_f32_prepacked(int threads, const PackedRows& a, const InPlaceColumns& b,
                        const ColumnGrid& grid, float* c_out, int64_t ldc, const float* row_start,
                        bool relu, const float* addend) {
  check_supported();
  check_grid(b.n, grid);
  prepacked(threads, a, in_place_source(b, grid), c_out, ldc, row_start, relu, addend);
}

}  // namespace qforge
