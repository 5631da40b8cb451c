// The CPU W4A16 product: one task per tile of kTileN output columns. A task walks K block by
// block, dequantizes the block's rows of its columns into a small f32 tile (zero-padded to
// kTileN so the inner loops have fixed trip counts and vectorize), and accumulates every row of
// X into its [m, kTileN] accumulator. Each output element is one f32 sum over k ascending
// (acc = acc + x * w, w = (q - z) * s), owned by one task: the bytes of Y are the same for any
// thread count, and equal to dequantize-then-matmul in k order.
//
// With N even a tile row starts on a whole byte, and the tile keeps its columns deinterleaved
// (the 32 even columns, then the 32 odd ones: low and high nibbles of 32 consecutive bytes), so
// unpacking is two plain loops over bytes the compiler vectorizes; the columns go back into
// place when the accumulator is written out. An odd N keeps the natural order and unpacks
// nibble by nibble. The accumulation runs over 4 vectors of columns at a time, whose sums stay in
// registers across the chunk's rows of K (two rows of X at once where M allows).
//
// The tile task is built twice: for the x86-64 baseline (SSE2, 4-float vectors) and for AVX2
// (8-float vectors), picked at run time with __builtin_cpu_supports. Neither uses FMA, so both
// give the same bits; the unit test compares each with dequantize-then-matmul.
#include "kernels/cpu/int4_matmul_cpu.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "ir/half.h"
#include "kernels/cpu/task_pool.h"

// The helpers are forced inline so that the AVX2 build of the tile task compiles them for AVX2.
#define QF_INLINE inline __attribute__((always_inline))

namespace qforge::cpu {

namespace {

constexpr int64_t kTileN = 64;             // output columns per task
constexpr int64_t kHalf = kTileN / 2;      // bytes of one tile row (N even)
constexpr int64_t kChunkK = 128;           // rows of K dequantized at once (bounds the tile)
constexpr int64_t kParallelMin = 1 << 22;  // multiply-adds below which one thread runs

QF_INLINE uint32_t nibble_at(const uint8_t* packed, int64_t e) {
  return (static_cast<uint32_t>(packed[e >> 1]) >> ((e & 1) * 4)) & 0x0fu;
}

// Tile position p holds column col_of(p) of the tile.
QF_INLINE int64_t col_of(int64_t p, bool pairs) {
  if (!pairs) return p;
  return p < kHalf ? 2 * p : 2 * (p - kHalf) + 1;
}

// One tile row from kHalf bytes, deinterleaved: row[p] = column 2p, row[kHalf + p] = 2p + 1.
// Without zero points q - 0 is q, bit for bit: the subtraction is skipped.
template <bool kZeros>
QF_INLINE void unpack_row(const uint8_t* __restrict src, const float* __restrict zero,
                          const float* __restrict scale, float* __restrict row) {
  for (int64_t p = 0; p < kHalf; ++p) {
    const int v = src[p];
    auto lo = static_cast<float>(((v & 15) ^ 8) - 8);
    auto hi = static_cast<float>(((v >> 4) ^ 8) - 8);
    if constexpr (kZeros) {
      lo -= zero[p];
      hi -= zero[kHalf + p];
    }
    row[p] = lo * scale[p];
    row[kHalf + p] = hi * scale[kHalf + p];
  }
}

// The same for two rows of X at once: each tile vector loaded feeds both, and the eight
// independent sums hide the add latency. Written with the compiler's generic vectors of L
// floats (L = 4: SSE2, the x86-64 baseline; L = 8 in the AVX2 build below). No FMA in either:
// each step is a product rounded, then a sum rounded, so both give the same bits.
using F4 = float __attribute__((vector_size(16)));
using F8 = float __attribute__((vector_size(32)));

template <int64_t L>
QF_INLINE void accumulate2(const float* __restrict x0, const float* __restrict x1,
                           const float* __restrict tile, int64_t rows, float* __restrict a0,
                           float* __restrict a1) {
  using V = std::conditional_t<L == 8, F8, F4>;
  static_assert(sizeof(V) == static_cast<size_t>(4 * L));
  constexpr int64_t kVecs = 4;  // kVecs * L columns
  V s0[kVecs], s1[kVecs];
  std::memcpy(s0, a0, sizeof(s0));
  std::memcpy(s1, a1, sizeof(s1));
  for (int64_t r = 0; r < rows; ++r) {
    const float xv0 = x0[r], xv1 = x1[r];
    const float* row = tile + r * kTileN;
    for (int64_t v = 0; v < kVecs; ++v) {
      V t;
      std::memcpy(&t, row + L * v, sizeof(t));
      s0[v] += xv0 * t;
      s1[v] += xv1 * t;
    }
  }
  std::memcpy(a0, s0, sizeof(s0));
  std::memcpy(a1, s1, sizeof(s1));
}

// One row of X: a[0, 4 L) += x[r] * tile[r * kTileN + 0, 4 L) for r ascending.
template <int64_t L>
QF_INLINE void accumulate1(const float* __restrict x, const float* __restrict tile, int64_t rows,
                           float* __restrict a) {
  using V = std::conditional_t<L == 8, F8, F4>;
  static_assert(sizeof(V) == static_cast<size_t>(4 * L));
  constexpr int64_t kVecs = 4;
  V s[kVecs];
  std::memcpy(s, a, sizeof(s));
  for (int64_t r = 0; r < rows; ++r) {
    const float xv = x[r];
    const float* row = tile + r * kTileN;
    for (int64_t v = 0; v < kVecs; ++v) {
      V t;
      std::memcpy(&t, row + L * v, sizeof(t));
      s[v] += xv * t;
    }
  }
  std::memcpy(a, s, sizeof(s));
}

struct Scratch {
  std::vector<float> tile, acc;
  float scale[kTileN], zero[kTileN], q[kTileN];
  uint8_t bytes[kHalf];
};

// Output columns [t * kTileN, ...) of y: one task.
template <int64_t L>
QF_INLINE void tile_task(const float* x, int64_t m, const Int4Weight& w, float* y, int64_t t,
                         Scratch& sc) {
  const int64_t k = w.k, n = w.n, bs = w.block_size;
  const int64_t blocks = (k + bs - 1) / bs;
  const uint8_t* packed = w.packed.data();
  const bool f16_scales = !w.scales_f16.empty();
  const bool zeros = !w.zero_points.empty();
  const bool pairs = n % 2 == 0;  // every row starts on a whole byte
  std::vector<float>& tile = sc.tile;
  std::vector<float>& acc = sc.acc;
  float* scale = sc.scale;
  float* zero = sc.zero;
  float* q = sc.q;
  uint8_t* bytes = sc.bytes;
  const int64_t n0 = t * kTileN;
  const int64_t nt = std::min(kTileN, n - n0);
  std::fill(acc.begin(), acc.end(), 0.0f);
  std::fill(q, q + kTileN, 0.0f);  // columns past nt stay 0 (and so do their weights)
  for (int64_t b = 0; b < blocks; ++b) {
    for (int64_t p = 0; p < kTileN; ++p) {
      const int64_t j = col_of(p, pairs);
      const auto s = static_cast<size_t>(b * n + n0 + j);
      scale[p] = j >= nt ? 0.0f : (f16_scales ? f16_to_f32(w.scales_f16[s]) : w.scales_f32[s]);
      zero[p] = j < nt && zeros ? static_cast<float>(w.zero_points[s]) : 0.0f;
    }
    const int64_t block_end = std::min(k, (b + 1) * bs);
    for (int64_t k0 = b * bs; k0 < block_end; k0 += kChunkK) {
      const int64_t k1 = std::min(block_end, k0 + kChunkK);
      for (int64_t r = k0; r < k1; ++r) {
        const int64_t e0 = r * n + n0;
        float* row = tile.data() + (r - k0) * kTileN;
        // (q - z) * s is exact in f32: |q - z| <= 15 and s is an fp16 value or the caller's.
        if (pairs) {
          const uint8_t* src = packed + e0 / 2;
          if (nt < kTileN) {  // the last tile: zero bytes past it, so its weights are 0
            const int64_t whole = nt / 2;
            std::memcpy(bytes, src, static_cast<size_t>(whole));
            std::fill(bytes + whole, bytes + kHalf, uint8_t{0});
            src = bytes;
          }
          if (zeros) {
            unpack_row<true>(src, zero, scale, row);
          } else {
            unpack_row<false>(src, zero, scale, row);
          }
        } else {
          for (int64_t j = 0; j < nt; ++j) {
            const uint32_t u = nibble_at(packed, e0 + j);
            q[j] = static_cast<float>(static_cast<int32_t>(u << 28) >> 28);
          }
          for (int64_t j = 0; j < kTileN; ++j) row[j] = (q[j] - zero[j]) * scale[j];
        }
        if (w.round_to_f16) {
          for (int64_t j = 0; j < kTileN; ++j) row[j] = f16_to_f32(f32_to_f16(row[j]));
        }
      }
      int64_t i = 0;
      for (; i + 1 < m; i += 2) {
        for (int64_t j0 = 0; j0 < kTileN; j0 += 4 * L) {
          accumulate2<L>(x + i * k + k0, x + (i + 1) * k + k0, tile.data() + j0, k1 - k0,
                         acc.data() + i * kTileN + j0, acc.data() + (i + 1) * kTileN + j0);
        }
      }
      for (; i < m; ++i) {
        for (int64_t j0 = 0; j0 < kTileN; j0 += 4 * L) {
          accumulate1<L>(x + i * k + k0, tile.data() + j0, k1 - k0, acc.data() + i * kTileN + j0);
        }
      }
    }
  }
  for (int64_t i = 0; i < m; ++i) {
    const float* a = acc.data() + i * kTileN;
    float* yi = y + i * n + n0;
    for (int64_t p = 0; p < kTileN; ++p) {
      const int64_t j = col_of(p, pairs);
      if (j < nt) yi[j] = a[p];
    }
  }
}

void tile_task_base(const float* x, int64_t m, const Int4Weight& w, float* y, int64_t t,
                    Scratch& sc) {
  tile_task<4>(x, m, w, y, t, sc);
}

#if defined(__x86_64__) && defined(__GNUC__)
// The same task compiled for AVX2 (8-float vectors; AVX2 does not imply FMA, so every product
// and sum rounds as in the baseline build: the same bits). Chosen at run time.
__attribute__((target("avx2"))) void tile_task_avx2(const float* x, int64_t m, const Int4Weight& w,
                                                    float* y, int64_t t, Scratch& sc) {
  tile_task<8>(x, m, w, y, t, sc);
}
#endif

using TileTask = void (*)(const float*, int64_t, const Int4Weight&, float*, int64_t, Scratch&);

TileTask pick_task(bool allow_avx2) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (allow_avx2 && __builtin_cpu_supports("avx2")) return tile_task_avx2;
#endif
  (void)allow_avx2;
  return tile_task_base;
}

}  // namespace

bool int4_matmul_has_avx2() {
#if defined(__x86_64__) && defined(__GNUC__)
  return __builtin_cpu_supports("avx2");
#else
  return false;
#endif
}

void int4_matmul(const float* x, int64_t m, const Int4Weight& w, float* y, int max_threads,
                 bool allow_avx2) {
  const int64_t tiles = (w.n + kTileN - 1) / kTileN;
  const int threads = m * w.k * w.n >= kParallelMin ? std::max(1, max_threads) : 1;
  const TileTask task = pick_task(allow_avx2);
  // One scratch per thread of the task pool (kernels/cpu/task_pool.h), made by its first task.
  std::vector<Scratch> scratch(static_cast<size_t>(threads));
  run_tasks(threads, tiles, [&](int64_t t, int slot) {
    Scratch& sc = scratch[static_cast<size_t>(slot)];
    if (sc.tile.empty()) {
      sc.tile.resize(static_cast<size_t>(kChunkK * kTileN));
      sc.acc.resize(static_cast<size_t>(m * kTileN));
    }
    task(x, m, w, y, t, sc);
  });
}

}  // namespace qforge::cpu
