#include "kernels/cpu/int4_cpu.h"

#include <algorithm>
#include <bit>
#include <vector>

#include "ir/half.h"
#include "kernels/cpu/task_pool.h"
#include "kernels/device.h"
#include "kernels/int4_math.h"

namespace qforge::cpu {

namespace {

// Fixed work pieces, independent of the thread count; every result is exact per element (or a
// max), so output never depends on how pieces land on threads.
constexpr int64_t kChunkBytes = 8192;
constexpr int64_t kParallelMin = 65536;

int thread_count(int64_t n) { return n >= kParallelMin ? cpu_threads() : 1; }

// Calls run(row, col, count) over the elements [first, first + count) of a row-major
// [rows, cols] matrix, split at row ends.
template <typename Run>
void for_each_row_piece(int64_t first, int64_t count, int64_t cols, Run run) {
  int64_t row = first / cols;
  int64_t col = first - row * cols;
  while (count > 0) {
    const int64_t len = std::min(cols - col, count);
    run(row, col, len);
    count -= len;
    ++row;
    col = 0;
  }
}

}  // namespace

void quantize_int4_blocked(std::span<const float> w, int64_t rows, int64_t cols, int64_t block_size,
                           std::span<uint16_t> scales_f16, std::span<uint8_t> packed,
                           bool search_scale) {
  const int64_t n = rows * cols;
  const int64_t blocks = (rows + block_size - 1) / block_size;
  const int threads = thread_count(n);
  const float* x = w.data();
  uint16_t* s = scales_f16.data();

  // Scales: one task per block; the inner loops run along columns (contiguous) and vectorize.
  // The search sums each column's fit over the block's rows in row order, as the CUDA twin.
  // Each task's buffers: one set per thread of the task pool, sized by its first task.
  struct BlockScratch {
    std::vector<int32_t> m;
    std::vector<float> amax, cand;
    std::vector<uint16_t> cand_bits;
    std::vector<double> err, wq, qq, best, best_wq, best_qq;
    std::vector<uint8_t> refining;
  };
  const auto ucols = static_cast<size_t>(cols);
  std::vector<BlockScratch> scratch(static_cast<size_t>(threads));
  run_tasks(threads, blocks, [&](int64_t b, int slot) {
    BlockScratch& t = scratch[static_cast<size_t>(slot)];
    if (t.m.size() != ucols) {
      for (auto* v : {&t.err, &t.wq, &t.qq, &t.best, &t.best_wq, &t.best_qq}) v->resize(ucols);
      t.m.resize(ucols);
      t.amax.resize(ucols);
      t.cand.resize(ucols);
      t.cand_bits.resize(ucols);
      t.refining.resize(ucols);
    }
    std::vector<int32_t>& m = t.m;
    std::vector<float>& amax = t.amax;
    std::vector<float>& cand = t.cand;
    std::vector<uint16_t>& cand_bits = t.cand_bits;
    std::vector<double>& err = t.err;
    std::vector<double>& wq = t.wq;
    std::vector<double>& qq = t.qq;
    std::vector<double>& best = t.best;
    std::vector<double>& best_wq = t.best_wq;
    std::vector<double>& best_qq = t.best_qq;
    std::vector<uint8_t>& refining = t.refining;
    std::fill(m.begin(), m.end(), 0);
    const int64_t end = std::min(rows, (b + 1) * block_size);
    for (int64_t r = b * block_size; r < end; ++r) {
      const float* row = x + r * cols;
      for (int64_t c = 0; c < cols; ++c) {
        const int32_t bits = std::bit_cast<int32_t>(row[c]) & 0x7fffffff;
        m[static_cast<size_t>(c)] = std::max(m[static_cast<size_t>(c)], bits);
      }
    }
    uint16_t* sb = s + b * cols;
    for (size_t c = 0; c < ucols; ++c) {
      // NaN/Inf (bits above +Inf's) are the caller's to reject; treat them as 0 here.
      amax[c] = m[c] >= 0x7f800000 ? 0.0f : std::bit_cast<float>(m[c]);
      sb[c] = int4_math::scale_bits(amax[c]);
    }
    if (!search_scale) return;
    // Evaluates cand (bits cand_bits) for every column into err, wq and qq.
    auto evaluate = [&] {
      for (size_t c = 0; c < ucols; ++c) cand[c] = f16_to_f32(cand_bits[c]);
      std::fill(err.begin(), err.end(), 0.0);
      std::fill(wq.begin(), wq.end(), 0.0);
      std::fill(qq.begin(), qq.end(), 0.0);
      for (int64_t r = b * block_size; r < end; ++r) {
        const float* row = x + r * cols;
        for (size_t c = 0; c < ucols; ++c)
          int4_math::accumulate_fit(row[c], cand[c], err[c], wq[c], qq[c]);
      }
    };
    // Keeps column c's candidate when strictly better: ties keep the earlier one.
    auto keep_if_better = [&](size_t c, bool first) {
      if (!first && !(err[c] < best[c])) return false;
      best[c] = err[c];
      best_wq[c] = wq[c];
      best_qq[c] = qq[c];
      sb[c] = cand_bits[c];
      return true;
    };
    for (int k = 0; k < int4_math::kScaleCandidates; ++k) {
      for (size_t c = 0; c < ucols; ++c)
        cand_bits[c] = int4_math::candidate_scale_bits(amax[c], k);
      evaluate();
      for (size_t c = 0; c < ucols; ++c) keep_if_better(c, k == 0);
    }
    std::fill(refining.begin(), refining.end(), uint8_t{1});
    for (int round = 0; round < int4_math::kRefineRounds; ++round) {
      bool any = false;
      for (size_t c = 0; c < ucols; ++c) {
        const uint16_t next = int4_math::refined_scale_bits(best_wq[c], best_qq[c]);
        if (next == 0 || next == sb[c]) refining[c] = 0;
        cand_bits[c] = refining[c] != 0 ? next : sb[c];
        any = any || refining[c] != 0;
      }
      if (!any) break;
      evaluate();
      for (size_t c = 0; c < ucols; ++c) {
        if (refining[c] != 0 && !keep_if_better(c, false)) refining[c] = 0;
      }
    }
  });

  // The scales as floats, once: converting per element would dominate the loop below.
  std::vector<float> sf(static_cast<size_t>(blocks * cols));
  for (size_t i = 0; i < sf.size(); ++i) sf[i] = f16_to_f32(s[i]);

  // Values: fixed byte chunks, each covering an even number of elements, so no byte is shared.
  // With an even column count a byte never straddles two rows, and is written whole.
  uint8_t* out = packed.data();
  const int64_t bytes = static_cast<int64_t>(packed.size());
  const int64_t chunks = (bytes + kChunkBytes - 1) / kChunkBytes;
  run_tasks(threads, chunks, [&](int64_t chunk, int) {
    const int64_t first = chunk * kChunkBytes * 2;
    const int64_t count = std::min(n, first + kChunkBytes * 2) - first;
    for_each_row_piece(first, count, cols, [&](int64_t row, int64_t col, int64_t len) {
      const float* xr = x + row * cols;
      const float* sr = sf.data() + (row / block_size) * cols;
      if (cols % 2 == 0) {
        uint8_t* o = out + (row * cols) / 2;
        for (int64_t c = col; c < col + len; c += 2) {
          o[c / 2] = static_cast<uint8_t>(
              int4_math::nibble(int4_math::quantize_one(xr[c], sr[c])) |
              (int4_math::nibble(int4_math::quantize_one(xr[c + 1], sr[c + 1])) << 4));
        }
        return;
      }
      for (int64_t c = col; c < col + len; ++c) {
        const int64_t e = row * cols + c;
        const uint8_t nib = int4_math::nibble(int4_math::quantize_one(xr[c], sr[c]));
        uint8_t& byte = out[e / 2];
        byte = (e % 2 == 0) ? nib : static_cast<uint8_t>(byte | (nib << 4));
      }
    });
  });
}

void dequantize_int4_blocked(std::span<const uint8_t> packed, std::span<const uint16_t> scales_f16,
                             int64_t rows, int64_t cols, int64_t block_size, std::span<float> out) {
  const int64_t n = rows * cols;
  const int threads = thread_count(n);
  const uint8_t* in = packed.data();
  const uint16_t* s = scales_f16.data();
  float* y = out.data();
  const int64_t chunk_elems = kChunkBytes * 2;
  const int64_t chunks = (n + chunk_elems - 1) / chunk_elems;
  run_tasks(threads, chunks, [&](int64_t chunk, int) {
    const int64_t first = chunk * chunk_elems;
    const int64_t count = std::min(n, first + chunk_elems) - first;
    for_each_row_piece(first, count, cols, [&](int64_t row, int64_t col, int64_t len) {
      const uint16_t* sr = s + (row / block_size) * cols;
      for (int64_t c = col; c < col + len; ++c) {
        const int64_t e = row * cols + c;
        const auto nib = static_cast<uint8_t>(in[e / 2] >> (4 * (e % 2)));
        y[e] = static_cast<float>(int4_math::from_nibble(nib)) * f16_to_f32(sr[c]);
      }
    });
  });
}

}  // namespace qforge::cpu
