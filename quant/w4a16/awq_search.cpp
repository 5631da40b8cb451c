// AWQ's scale and clip searches: see quant/w4a16/awq_search.h. Moved out of awq.cpp unchanged.
#include "quant/w4a16/awq_search.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "ir/half.h"
#include "kernels/cpu/task_pool.h"
#include "kernels/gemm.h"
#include "kernels/int4.h"

namespace qforge {

namespace {

constexpr float kMinScale = 1e-4f;  // llm-awq's clamp on mean|x|^alpha

// y[M, N] = x[M, K] @ w[K, N]. `threads` 1 inside the searches' own parallel loops.
void matmul(const float* x, const float* w, float* y, int64_t m, int64_t k, int64_t n,
            int threads) {
  const GemmShape shape{.m = m, .n = n, .k = k, .lda = k, .ldb = n, .ldc = n};
  gemm_f32(threads, shape, x, w, y);
}

// The searches run thousands of small quantize + sgemm steps: one run of the task pool over the
// independent steps (alpha points, clip ratios) with single-threaded steps inside is much
// cheaper than a short parallel run per step. Each step's result is computed exactly as a
// sequential run computes it and the choices are made afterwards in the original order, so the
// output does not depend on the thread count. `bytes_per_task` bounds the memory in flight:
// at most kTaskMemory across threads (fewer threads for very large weights, whose steps are
// then parallel inside).
constexpr int64_t kTaskMemory = int64_t{1} << 30;

int outer_threads(int64_t tasks, int64_t bytes_per_task) {
  const int64_t by_memory =
      std::max<int64_t>(1, kTaskMemory / std::max<int64_t>(1, bytes_per_task));
  return static_cast<int>(
      std::max<int64_t>(1, std::min({static_cast<int64_t>(cpu_threads()), tasks, by_memory})));
}

// sum + the squared differences of y and ref, element by element in order. A function of its
// own, not inlined: inside the search's task GCC kept the running sum on the stack (a store
// and a load per element; `convert --w4-method awq` of the tiny Llama fixture 8% slower).
__attribute__((noinline)) double add_squared_differences(double sum, std::span<const float> y,
                                                        std::span<const float> ref) {
  for (size_t j = 0; j < y.size(); ++j) {
    const double d = static_cast<double>(y[j]) - static_cast<double>(ref[j]);
    sum += d * d;
  }
  return sum;
}

std::vector<float> scales_for(std::span<const float> mean, double alpha) {
  std::vector<float> s(mean.size());
  float lo = 0.0f, hi = 0.0f;
  for (size_t k = 0; k < mean.size(); ++k) {
    s[k] = std::max(static_cast<float>(std::pow(static_cast<double>(mean[k]), alpha)), kMinScale);
    lo = k == 0 ? s[k] : std::min(lo, s[k]);
    hi = k == 0 ? s[k] : std::max(hi, s[k]);
  }
  const float norm = std::sqrt(hi * lo);
  for (float& v : s) v /= norm;
  return s;
}

// mean over output columns of |w| / amax of its block along K, per input channel (w [K, N]).
std::vector<float> weight_means(std::span<const AwqMember> members, int64_t k, int64_t block) {
  std::vector<double> sum(static_cast<size_t>(k), 0.0);
  int64_t cols = 0;
  for (const AwqMember& m : members) {
    const int64_t n = m.n;
    for (int64_t b0 = 0; b0 < k; b0 += block) {
      const int64_t b1 = std::min(k, b0 + block);
      for (int64_t c = 0; c < n; ++c) {
        float amax = 0.0f;
        for (int64_t r = b0; r < b1; ++r)
          amax = std::max(amax, std::fabs(m.w[static_cast<size_t>(r * n + c)]));
        const double denom = static_cast<double>(amax) + 1e-6;
        for (int64_t r = b0; r < b1; ++r)
          sum[static_cast<size_t>(r)] += std::fabs(m.w[static_cast<size_t>(r * n + c)]) / denom;
      }
    }
    cols += n;
  }
  std::vector<float> out(sum.size());
  for (size_t r = 0; r < sum.size(); ++r)
    out[r] = static_cast<float>(sum[r] / static_cast<double>(std::max<int64_t>(1, cols)));
  return out;
}

std::vector<float> duo_scales_for(std::span<const float> mean, std::span<const float> wmean,
                                  double alpha) {
  std::vector<float> s(mean.size());
  float lo = 0.0f, hi = 0.0f;
  for (size_t k = 0; k < mean.size(); ++k) {
    const double v = std::pow(static_cast<double>(mean[k]), alpha) /
                     (std::pow(static_cast<double>(wmean[k]), 1.0 - alpha) + 1e-4);
    s[k] = std::max(static_cast<float>(v), kMinScale);
    lo = k == 0 ? s[k] : std::min(lo, s[k]);
    hi = k == 0 ? s[k] : std::max(hi, s[k]);
  }
  const float norm = std::sqrt(hi * lo);
  for (float& v : s) v /= norm;
  return s;
}

}  // namespace

AwqScaleSearch awq_search_scales(const AwqActivation& act, std::span<const AwqMember> members,
                                 const AwqOptions& o, Device device, KernelWorkspace* workspace) {
  const int64_t m = act.sample_rows(), k = act.channels;
  const std::vector<float> mean = act.mean_abs();
  std::vector<std::vector<float>> ref(members.size());
  int64_t max_n = 0;
  for (size_t i = 0; i < members.size(); ++i) {
    ref[i].resize(static_cast<size_t>(m * members[i].n));
    matmul(act.sample.data(), members[i].w.data(), ref[i].data(), m, k, members[i].n,
           cpu_threads());
    max_n = std::max(max_n, members[i].n);
  }
  // One task per alpha point: its error summed over members and rows in the sequential order.
  const int grid = o.grid;
  const int points = o.duo ? 2 * grid : grid;
  const std::vector<float> wmean =
      o.duo ? weight_means(members, k, o.block_size) : std::vector<float>();
  std::vector<std::vector<float>> scales(static_cast<size_t>(points));
  std::vector<double> errors(static_cast<size_t>(points), 0.0);
  const int64_t task_bytes = (2 * k * max_n + m * max_n + m * k) * 4 + k * max_n / 2;
  // CUDA quantizes on the device: one point at a time there.
  const int threads = device == Device::Cpu ? outer_threads(points, task_bytes) : 1;
  const int inner = threads > 1 ? 1 : cpu_threads();
  // A point a task on the task pool (kernels/cpu/task_pool.h); each thread's buffers.
  struct PointScratch {
    std::vector<float> xs, ws, deq, y;
    std::vector<uint16_t> sc;
    std::vector<uint8_t> packed;
  };
  std::vector<PointScratch> scratch(static_cast<size_t>(threads));
  run_tasks(threads, points, [&](int64_t task, int slot) {
    const auto g = static_cast<int>(task);
    // The thread's buffers as locals for the task (the compiler then knows nothing else
    // points into them, and vectorizes the loops below), handed back at its end.
    PointScratch& t = scratch[static_cast<size_t>(slot)];
    std::vector<float> xs = std::move(t.xs), ws = std::move(t.ws), deq = std::move(t.deq),
                       y = std::move(t.y);
    std::vector<uint16_t> sc = std::move(t.sc);
    std::vector<uint8_t> packed = std::move(t.packed);
    xs.resize(act.sample.size());
    const double alpha = static_cast<double>(g % grid) / grid;
    std::vector<float> s =
        g < grid ? scales_for(mean, alpha) : duo_scales_for(mean, wmean, alpha);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < k; ++c) {
        const auto i = static_cast<size_t>(r * k + c);
        xs[i] = act.sample[i] / s[static_cast<size_t>(c)];
      }
    double error = 0.0;
    for (size_t i = 0; i < members.size(); ++i) {
      const int64_t n = members[i].n;
      ws.resize(members[i].w.size());
      for (int64_t r = 0; r < k; ++r)
        for (int64_t c = 0; c < n; ++c) {
          const auto j = static_cast<size_t>(r * n + c);
          ws[j] = members[i].w[j] * s[static_cast<size_t>(r)];
        }
      sc.assign(static_cast<size_t>(int4_block_count(k, o.block_size) * n), 0);
      packed.assign(static_cast<size_t>(int4_packed_bytes(k * n)), 0);
      deq.resize(ws.size());
      int4_round_trip(ws, k, n, o.block_size, sc, packed, deq, device, o.scale, workspace);
      y.resize(static_cast<size_t>(m * n));
      matmul(xs.data(), deq.data(), y.data(), m, k, n, inner);
      error = add_squared_differences(error, y, ref[i]);
    }
    errors[static_cast<size_t>(g)] = error;
    scales[static_cast<size_t>(g)] = std::move(s);
    t = PointScratch{.xs = std::move(xs), .ws = std::move(ws), .deq = std::move(deq),
                     .y = std::move(y), .sc = std::move(sc), .packed = std::move(packed)};
  });
  AwqScaleSearch out;
  for (int g = 0; g < points; ++g) {
    const double error = errors[static_cast<size_t>(g)];
    if (g == 0) out.error_rtn = error;
    if (g == 0 || error < out.error_best) {
      out.best = g;
      out.error_best = error;
    }
  }
  out.alpha = static_cast<double>(out.best % grid) / grid;
  out.duo = out.best >= grid;
  out.s = std::move(scales[static_cast<size_t>(out.best)]);
  return out;
}

// AWQ's second step: per block of the scaled weight and output column, the largest |w| is
// shrunk to ratio * amax (ratio 1, 0.95, ..., 0.55, as llm-awq) where that lowers the block's
// share of the output error on the sample, ||X_b diag(1/s)_b (W_b - Q(W_b))||^2 per column.
// Clipped values are written into the float weight, so RTN then picks scale = ratio * amax / 7.
// With clip_scales, the candidates are scales (ratio * amax / 7, then the signed ratio * amax / 8
// that maps the block's extreme to -8), each measured as it rounds, and the chosen one is kept.
AwqClip awq_search_clip(const AwqActivation& act, std::span<const float> s, const AwqMember& m,
                        const AwqOptions& o) {
  constexpr int kClipRatios = 10;
  const int steps = o.clip_scales ? 2 * kClipRatios : kClipRatios;
  const int64_t rows = act.sample_rows(), k = act.channels, n = m.n, bs = o.block_size;
  std::vector<float> xs(act.sample.size()), ws(m.w.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < k; ++c) {
      const auto i = static_cast<size_t>(r * k + c);
      xs[i] = act.sample[i] / s[static_cast<size_t>(c)];
    }
  for (int64_t r = 0; r < k; ++r)
    for (int64_t c = 0; c < n; ++c) {
      const auto j = static_cast<size_t>(r * n + c);
      ws[j] = m.w[j] * s[static_cast<size_t>(r)];
    }
  const int64_t blocks = int4_block_count(k, bs);
  // Per (block, column): amax and whether its first largest |w| is positive.
  std::vector<float> amax(static_cast<size_t>(blocks * n), 0.0f);
  std::vector<uint8_t> positive(static_cast<size_t>(blocks * n), 1);
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t r = b * bs; r < std::min(k, (b + 1) * bs); ++r)
      for (int64_t c = 0; c < n; ++c) {
        const auto at = static_cast<size_t>(b * n + c);
        const float w = ws[static_cast<size_t>(r * n + c)];
        if (std::fabs(w) > amax[at]) {
          amax[at] = std::fabs(w);
          positive[at] = w >= 0.0f ? 1 : 0;
        }
      }
  auto ratio_of = [](int step) { return 1.0f - static_cast<float>(step % kClipRatios) / 20.0f; };
  // The scale of candidate `step` for (block, column) `at` (clip_scales), as fp16 bits.
  auto candidate = [&](size_t at, int step) -> uint16_t {
    const float reach = ratio_of(step) * amax[at];
    if (step < kClipRatios || amax[at] == 0.0f) return int4_symmetric_scale_f16(reach);
    uint16_t bits = f32_to_f16(reach / 8.0f);
    if (bits == 0) bits = 0x0001;       // smallest subnormal
    if (bits >= 0x7c00) bits = 0x7bff;  // largest finite
    return positive[at] != 0 ? static_cast<uint16_t>(bits | 0x8000) : bits;
  };
  // One task per (block, candidate): its per-column error, [blocks, steps, n]; the choices are
  // made below in the sequential order.
  const int64_t tasks = blocks * steps;
  std::vector<double> errs(static_cast<size_t>(tasks * n));
  const int64_t task_bytes = (std::min(bs, k) + rows) * n * 4 + n * 8;
  const int threads = outer_threads(tasks, task_bytes);
  const int inner = threads > 1 ? 1 : cpu_threads();
  // A (block, candidate) a task on the task pool (kernels/cpu/task_pool.h); each thread's
  // buffers.
  struct ClipScratch {
    std::vector<float> d, e, lims, scales;
  };
  std::vector<ClipScratch> scratch(static_cast<size_t>(threads));
  run_tasks(threads, tasks, [&](int64_t t, int slot) {
    ClipScratch& sb = scratch[static_cast<size_t>(slot)];
    sb.e.resize(static_cast<size_t>(rows * n));
    sb.lims.resize(static_cast<size_t>(n));
    sb.scales.resize(static_cast<size_t>(n));
    std::vector<float>& d = sb.d;
    std::vector<float>& e = sb.e;
    std::vector<float>& lims = sb.lims;
    std::vector<float>& scales = sb.scales;
    const int64_t b = t / steps;
    const int step = static_cast<int>(t % steps);
    const int64_t r0 = b * bs, len = std::min(bs, k - r0);
    d.resize(static_cast<size_t>(len * n));
    for (int64_t c = 0; c < n; ++c) {
      const auto ci = static_cast<size_t>(c);
      const auto at = static_cast<size_t>(b * n + c);
      // Without clip_scales w is clamped to the limit first; with them, not (infinity).
      lims[ci] = o.clip_scales ? std::numeric_limits<float>::infinity()
                               : ratio_of(step) * amax[at];
      scales[ci] = f16_to_f32(o.clip_scales ? candidate(at, step)
                                            : int4_symmetric_scale_f16(lims[ci]));
    }
    for (int64_t r = 0; r < len; ++r)
      for (int64_t c = 0; c < n; ++c) {
        const auto ci = static_cast<size_t>(c);
        const float w = ws[static_cast<size_t>((r0 + r) * n + c)];
        const float q = std::clamp(
            std::nearbyint(std::clamp(w, -lims[ci], lims[ci]) / scales[ci]), -8.0f, 7.0f);
        d[static_cast<size_t>(r * n + c)] = w - q * scales[ci];
      }
    const GemmShape shape{.m = rows, .n = n, .k = len, .lda = k, .ldb = n, .ldc = n};
    gemm_f32(inner, shape, xs.data() + r0, d.data(), e.data());
    double* col_err = errs.data() + t * n;
    std::fill(col_err, col_err + n, 0.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < n; ++c) {
        const double v = e[static_cast<size_t>(r * n + c)];
        col_err[c] += v * v;
      }
  });
  AwqClip out;
  out.limit.assign(static_cast<size_t>(blocks * n), std::numeric_limits<float>::infinity());
  if (o.clip_scales) out.scale.assign(static_cast<size_t>(blocks * n), 0);
  std::vector<double> best(static_cast<size_t>(n));
  for (int64_t b = 0; b < blocks; ++b) {
    for (int step = 0; step < steps; ++step) {
      const double* col_err = errs.data() + (b * steps + step) * n;
      for (int64_t c = 0; c < n; ++c) {
        const auto ci = static_cast<size_t>(c);
        const auto at = static_cast<size_t>(b * n + c);
        if (step == 0) {
          best[ci] = col_err[c];
          out.before += col_err[c];
        } else if (col_err[c] < best[ci]) {
          best[ci] = col_err[c];
          out.limit[at] = ratio_of(step) * amax[at];  // the reach on the extreme's side
        } else {
          continue;
        }
        if (o.clip_scales) out.scale[at] = candidate(at, step);
      }
    }
    for (int64_t c = 0; c < n; ++c) {
      out.after += best[static_cast<size_t>(c)];
      out.clipped += std::isinf(out.limit[static_cast<size_t>(b * n + c)]) ? 0 : 1;
    }
  }
  return out;
}

}  // namespace qforge
