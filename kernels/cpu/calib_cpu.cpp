#include "kernels/cpu/calib_cpu.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <bit>
#include <climits>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/calib_math.h"
#include "kernels/device.h"

namespace qforge::cpu {

namespace cm = calib_math;

namespace {

// Fixed chunks, independent of the thread count; every result here is a min, a max or an
// integer count, so it never depends on how chunks land on threads.
constexpr int64_t kChunk = 16384;
constexpr int64_t kParallelMin = 65536;

int thread_count(int64_t n) { return n >= kParallelMin ? cpu_threads() : 1; }

constexpr int32_t kBitsInf = 0x7f800000;

// A signed key whose integer order is the float order with -0.0 < +0.0 (negative floats have
// their magnitude bits flipped). The transform is its own inverse.
inline int32_t order_key(int32_t bits) { return bits ^ ((bits >> 31) & INT32_MAX); }

struct RangeAcc {
  int32_t lo = INT32_MAX;
  int32_t hi = INT32_MIN;
  uint64_t nan = 0;
};

// Branch-free so that it vectorizes: a NaN contributes the neutral key to min and max.
void range_piece(const float* __restrict x, int64_t len, RangeAcc& acc) {
  int32_t lo = acc.lo;
  int32_t hi = acc.hi;
  int32_t nan = 0;  // 32-bit like the keys, so the loop vectorizes; len <= kChunk
  for (int64_t k = 0; k < len; ++k) {
    const auto bits = std::bit_cast<int32_t>(x[k]);
    const int32_t nan_mask = -static_cast<int32_t>((bits & INT32_MAX) > kBitsInf);  // 0 or ~0
    const int32_t key = order_key(bits) & ~nan_mask;
    lo = std::min(lo, key | (INT32_MAX & nan_mask));
    hi = std::max(hi, key | (INT32_MIN & nan_mask));
    nan -= nan_mask;
  }
  acc.lo = lo;
  acc.hi = hi;
  acc.nan += static_cast<uint64_t>(nan);
}

// Four interleaved 32-bit sub-histograms: consecutive equal values (a ReLU's zeros) would
// otherwise wait on each other's increment of one counter. Folded into 64-bit counts before a
// counter could overflow.
class SubHistograms {
 public:
  explicit SubHistograms(int64_t bins) : bins_(bins), sub_(static_cast<size_t>(4 * bins), 0) {}

  void count(const float* __restrict x, int64_t len, float scale, uint64_t& nan) {
    uint32_t* const sub[4] = {sub_.data(), sub_.data() + bins_, sub_.data() + 2 * bins_,
                              sub_.data() + 3 * bins_};
    int64_t k = 0;
    for (; k + 4 <= len; k += 4) {
      for (int s = 0; s < 4; ++s) add(x[k + s], scale, sub[s], nan);
    }
    for (; k < len; ++k) add(x[k], scale, sub[0], nan);
    pending_ += len;
  }
  [[nodiscard]] bool near_overflow() const { return pending_ > (int64_t{1} << 31); }
  void fold_into(uint64_t* out) {
    for (int64_t b = 0; b < bins_; ++b) {
      for (int64_t s = 0; s < 4; ++s) {
        uint32_t& c = sub_[static_cast<size_t>(s * bins_ + b)];
        out[b] += c;
        c = 0;
      }
    }
    pending_ = 0;
  }

 private:
  void add(float v, float scale, uint32_t* __restrict sub, uint64_t& nan) const {
    const auto magnitude = std::bit_cast<int32_t>(v) & INT32_MAX;
    if (magnitude > kBitsInf) {
      ++nan;
      return;
    }
    ++sub[cm::histogram_bin(std::bit_cast<float>(magnitude), scale, bins_)];
  }

  int64_t bins_;
  std::vector<uint32_t> sub_;
  int64_t pending_ = 0;
};

}  // namespace

ValueRange minmax(std::span<const float> x) {
  const auto n = static_cast<int64_t>(x.size());
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  int32_t lo = INT32_MAX;
  int32_t hi = INT32_MIN;
  uint64_t nan = 0;
#pragma omp parallel for num_threads(thread_count(n)) schedule(static) \
    reduction(min : lo) reduction(max : hi) reduction(+ : nan)
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const int64_t begin = chunk * kChunk;
    RangeAcc acc;
    range_piece(x.data() + begin, std::min(kChunk, n - begin), acc);
    lo = std::min(lo, acc.lo);
    hi = std::max(hi, acc.hi);
    nan += acc.nan;
  }
  ValueRange r;
  r.nan = nan;
  r.count = static_cast<uint64_t>(n) - nan;
  if (r.count > 0) {
    r.min = std::bit_cast<float>(order_key(lo));
    r.max = std::bit_cast<float>(order_key(hi));
  }
  return r;
}

uint64_t histogram_abs(std::span<const float> x, float scale, std::span<uint64_t> bins) {
  const auto n = static_cast<int64_t>(x.size());
  const auto nb = static_cast<int64_t>(bins.size());
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  const int threads = thread_count(n);
  // One row of 64-bit counts per thread (the first is `bins` itself), summed at the end.
  std::vector<uint64_t> rows(static_cast<size_t>((threads - 1) * nb), 0);
  std::vector<uint64_t> nans(static_cast<size_t>(threads), 0);
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
    uint64_t* out = t == 0 ? bins.data() : rows.data() + (t - 1) * nb;
    SubHistograms sub(nb);
    uint64_t nan = 0;
#pragma omp for schedule(static)
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      const int64_t begin = chunk * kChunk;
      sub.count(x.data() + begin, std::min(kChunk, n - begin), scale, nan);
      if (sub.near_overflow()) sub.fold_into(out);
    }
    sub.fold_into(out);
    nans[static_cast<size_t>(t)] = nan;
  }
  for (int t = 1; t < threads; ++t) {
    const uint64_t* row = rows.data() + (t - 1) * nb;
    for (int64_t b = 0; b < nb; ++b) bins[static_cast<size_t>(b)] += row[b];
  }
  uint64_t nan = 0;
  for (uint64_t v : nans) nan += v;
  return nan;
}

void entropy_scores(std::span<const uint64_t> hist, int quant_levels, std::span<double> scores) {
  const auto nb = static_cast<int64_t>(hist.size());
  std::vector<uint64_t> suffix(static_cast<size_t>(nb + 1), 0);  // suffix[i] = sum hist[i..]
  for (int64_t b = nb; b-- > 0;) suffix[b] = suffix[b + 1] + hist[static_cast<size_t>(b)];
  const uint64_t total = suffix[0];
  const auto candidates = static_cast<int64_t>(scores.size());
#pragma omp parallel num_threads(cpu_threads())
  {
    std::vector<uint64_t> level_sum(static_cast<size_t>(quant_levels));
    std::vector<int64_t> level_nonzero(static_cast<size_t>(quant_levels));
    std::array<double, cm::kLanes> lanes{};
    // Later candidates cost more (they keep more bins): hand them out one at a time.
#pragma omp for schedule(dynamic, 8)
    for (int64_t k = 0; k < candidates; ++k) {
      const int64_t kept = quant_levels + k;
      const uint64_t outliers = suffix[kept];
      auto p_count = [&](int64_t j) {
        return hist[static_cast<size_t>(j)] + (j == kept - 1 ? outliers : 0);
      };
      std::fill(level_sum.begin(), level_sum.end(), 0);
      std::fill(level_nonzero.begin(), level_nonzero.end(), 0);
      for (int64_t j = 0; j < kept; ++j) {
        const uint64_t h = hist[static_cast<size_t>(j)];
        const int64_t level = j * quant_levels / kept;
        level_sum[level] += h;
        level_nonzero[level] += h > 0 ? 1 : 0;
      }
      const cm::EntropyCandidate c =
          cm::entropy_candidate(total, outliers, hist[static_cast<size_t>(kept - 1)]);
      if (c.infinite) {
        scores[static_cast<size_t>(k)] = std::numeric_limits<double>::infinity();
        continue;
      }
      for (int t = 0; t < cm::kLanes; ++t) {
        double acc = 0.0;
        for (int64_t j = t; j < kept; j += cm::kLanes) {
          const uint64_t p = p_count(j);
          if (p == 0) continue;  // a zero term
          const int64_t level = j * quant_levels / kept;
          const double q = cm::div(static_cast<double>(level_sum[level]),
                                   static_cast<double>(level_nonzero[level]));
          acc = cm::add(acc, cm::entropy_term(static_cast<double>(p), q, c));
        }
        lanes[static_cast<size_t>(t)] = acc;
      }
      scores[static_cast<size_t>(k)] = cm::lane_tree_sum(lanes.data());
    }
  }
}

void mse_scores(std::span<const uint64_t> hist, int quant_max, std::span<double> scores) {
  const auto nb = static_cast<int64_t>(hist.size());
  uint64_t total = 0;
  for (uint64_t v : hist) total += v;
  const auto candidates = static_cast<int64_t>(scores.size());
#pragma omp parallel num_threads(cpu_threads())
  {
    std::array<double, cm::kLanes> lanes{};
#pragma omp for schedule(static)
    for (int64_t k = 0; k < candidates; ++k) {
      const int64_t kept = quant_max + 1 + k;
      for (int t = 0; t < cm::kLanes; ++t) {
        double acc = 0.0;
        for (int64_t j = t; j < nb; j += cm::kLanes) {
          const uint64_t h = hist[static_cast<size_t>(j)];
          if (h == 0) continue;
          acc =
              cm::add(acc, cm::mul(static_cast<double>(h), cm::mse_bin_error(j, kept, quant_max)));
        }
        lanes[static_cast<size_t>(t)] = acc;
      }
      scores[static_cast<size_t>(k)] =
          cm::div(cm::lane_tree_sum(lanes.data()), static_cast<double>(total));
    }
  }
}

}  // namespace qforge::cpu
