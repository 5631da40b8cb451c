// The CPU W4A16 product: one task per tile of kTileN output columns. A task walks K block by
// block, dequantizes the block's rows of its columns into a small f32 tile (zero-padded to
// kTileN so the inner loop has a fixed trip count and vectorizes), and accumulates every row of
// X into its [m, kTileN] accumulator. Each output element is one f32 sum over k ascending,
// owned by one task: the bytes of Y are the same for any thread count.
#include "kernels/cpu/int4_matmul_cpu.h"

#include <algorithm>
#include <vector>

#include "ir/half.h"

namespace qforge::cpu {

namespace {

constexpr int64_t kTileN = 64;         // output columns per task
constexpr int64_t kChunkK = 128;       // rows of K dequantized at once (bounds the tile)
constexpr int64_t kParallelMin = 1 << 22;  // multiply-adds below which one thread runs

inline uint32_t nibble_at(const uint8_t* packed, int64_t e) {
  return (static_cast<uint32_t>(packed[e >> 1]) >> ((e & 1) * 4)) & 0x0fu;
}

}  // namespace

void int4_matmul(const float* x, int64_t m, const Int4Weight& w, float* y, int max_threads) {
  const int64_t k = w.k, n = w.n, bs = w.block_size;
  const int64_t blocks = (k + bs - 1) / bs;
  const int64_t tiles = (n + kTileN - 1) / kTileN;
  const int threads = m * k * n >= kParallelMin ? std::max(1, max_threads) : 1;
  const uint8_t* packed = w.packed.data();
  const bool f16_scales = !w.scales_f16.empty();
  const bool zeros = !w.zero_points.empty();

#pragma omp parallel num_threads(threads)
  {
    std::vector<float> tile(static_cast<size_t>(kChunkK * kTileN));
    std::vector<float> acc(static_cast<size_t>(m * kTileN));
    float scale[kTileN], zero[kTileN], q[kTileN];
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t n0 = t * kTileN;
      const int64_t nt = std::min(kTileN, n - n0);
      std::fill(acc.begin(), acc.end(), 0.0f);
      std::fill(q, q + kTileN, 0.0f);  // columns past nt stay 0 (and so do their weights)
      for (int64_t b = 0; b < blocks; ++b) {
        for (int64_t j = 0; j < kTileN; ++j) {
          const auto s = static_cast<size_t>(b * n + n0 + j);
          scale[j] = j >= nt ? 0.0f : (f16_scales ? f16_to_f32(w.scales_f16[s]) : w.scales_f32[s]);
          zero[j] = j < nt && zeros ? static_cast<float>(w.zero_points[s]) : 0.0f;
        }
        const int64_t block_end = std::min(k, (b + 1) * bs);
        for (int64_t k0 = b * bs; k0 < block_end; k0 += kChunkK) {
          const int64_t k1 = std::min(block_end, k0 + kChunkK);
          for (int64_t r = k0; r < k1; ++r) {
            const int64_t e0 = r * n + n0;
            if ((e0 & 1) == 0) {  // whole bytes: low nibble = even column, high = odd
              const uint8_t* p = packed + e0 / 2;
              const int64_t pairs = nt / 2;
              for (int64_t jj = 0; jj < pairs; ++jj) {
                const auto byte = static_cast<int8_t>(p[jj]);
                q[2 * jj] = static_cast<float>(static_cast<int8_t>(byte << 4) >> 4);
                q[2 * jj + 1] = static_cast<float>(byte >> 4);
              }
              if (nt % 2 != 0) q[nt - 1] = static_cast<float>(static_cast<int8_t>(p[pairs] << 4) >> 4);
            } else {
              for (int64_t j = 0; j < nt; ++j) {
                const uint32_t u = nibble_at(packed, e0 + j);
                q[j] = static_cast<float>(static_cast<int32_t>(u << 28) >> 28);
              }
            }
            // (q - z) * s is exact in f32: |q - z| <= 15 and s is an fp16 value or the caller's.
            float* row = tile.data() + (r - k0) * kTileN;
            for (int64_t j = 0; j < kTileN; ++j) row[j] = (q[j] - zero[j]) * scale[j];
            if (w.round_to_f16) {
              for (int64_t j = 0; j < nt; ++j) row[j] = f16_to_f32(f32_to_f16(row[j]));
            }
          }
          for (int64_t i = 0; i < m; ++i) {
            const float* xi = x + i * k;
            float* a = acc.data() + i * kTileN;
            for (int64_t r = k0; r < k1; ++r) {
              const float xv = xi[r];
              const float* row = tile.data() + (r - k0) * kTileN;
              for (int64_t j = 0; j < kTileN; ++j) a[j] += xv * row[j];
            }
          }
        }
      }
      for (int64_t i = 0; i < m; ++i) {
        std::copy_n(acc.data() + i * kTileN, nt, y + i * n + n0);
      }
    }
  }
}

}  // namespace qforge::cpu
