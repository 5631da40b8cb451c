#include "kernels/cpu/calib_cpu.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <climits>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <utility>
#include <vector>

#include "kernels/calib_math.h"
#include "kernels/cpu/lanes.h"
#include "kernels/cpu/task_pool.h"
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

// Branch-free so that it vectorizes: a NaN contributes the neutral key to min and max. Compiled
// for the baseline, AVX2 and AVX-512 (range_piece picks at run time): SSE2 has no 32-bit integer
// min or max, and the baseline loop cost calibration about as much as its histograms.
QF_LANES_INLINE void range_piece_w(const float* __restrict x, int64_t len, RangeAcc& acc) {
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

void range_piece_base(const float* x, int64_t len, RangeAcc& acc) { range_piece_w(x, len, acc); }

#if defined(__x86_64__)
__attribute__((target("avx2"))) void range_piece_avx2(const float* x, int64_t len,
                                                      RangeAcc& acc) {
  range_piece_w(x, len, acc);
}
__attribute__((target("avx512f"))) void range_piece_avx512(const float* x, int64_t len,
                                                          RangeAcc& acc) {
  range_piece_w(x, len, acc);
}
#endif

// The bin of each of x[0 .. len) as cm::histogram_bin gives it (bins <= 2^24, so it fits an
// int32), and `bins` itself for a NaN: branch-free, so that the loop vectorizes. A NaN's product
// is a NaN, whose bits (sign clear) exceed every finite float's and clamp like +Inf's; the NaN
// mask then replaces its bin. Magnitudes and products have the sign bit clear, so their bits
// compare as signed integers.
QF_LANES_INLINE void bin_indices_w(const float* __restrict x, int64_t len, float scale,
                                   int32_t bins, int32_t* __restrict out) {
  const auto top = std::bit_cast<int32_t>(static_cast<float>(bins)) - 1;
  for (int64_t k = 0; k < len; ++k) {
    const int32_t magnitude = std::bit_cast<int32_t>(x[k]) & INT32_MAX;
    const int32_t is_nan = -static_cast<int32_t>(magnitude > kBitsInf);  // 0 or ~0
    const int32_t v = std::bit_cast<int32_t>(std::bit_cast<float>(magnitude) * scale);
    const auto bin = static_cast<int32_t>(std::bit_cast<float>(std::min(v, top)));
    out[k] = (bin & ~is_nan) | (bins & is_nan);
  }
}

void bin_indices_base(const float* x, int64_t len, float scale, int32_t bins, int32_t* out) {
  bin_indices_w(x, len, scale, bins, out);
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) void bin_indices_avx2(const float* x, int64_t len, float scale,
                                                      int32_t bins, int32_t* out) {
  bin_indices_w(x, len, scale, bins, out);
}
#endif

using BinIndicesFn = void (*)(const float*, int64_t, float, int32_t, int32_t*);

std::atomic<bool> baseline_only{false};  // use_baseline_lanes
std::atomic<bool> avx2_at_most{false};   // use_avx2_lanes_at_most

bool avx2_lanes() { return lanes::cpu_has_avx2() && !baseline_only.load(); }
bool wide_lanes() { return lanes::cpu_has_avx512f() && !baseline_only.load() && !avx2_at_most; }

BinIndicesFn bin_indices() {
#if defined(__x86_64__)
  if (avx2_lanes()) return bin_indices_avx2;
#endif
  return bin_indices_base;
}

using RangePieceFn = void (*)(const float*, int64_t, RangeAcc&);

RangePieceFn range_piece() {
#if defined(__x86_64__)
  if (wide_lanes()) return range_piece_avx512;
  if (avx2_lanes()) return range_piece_avx2;
#endif
  return range_piece_base;
}

// Four interleaved 32-bit sub-histograms: consecutive equal values (a ReLU's zeros) would
// otherwise wait on each other's increment of one counter. Each has one slot past the bins for
// the NaNs. Folded into 64-bit counts before a counter could overflow.
class SubHistograms {
 public:
  explicit SubHistograms(int64_t bins)
      : bins_(bins), stride_(bins + 1), sub_(static_cast<size_t>(4 * stride_), 0) {}

  void count(const float* __restrict x, int64_t len, float scale) {
    uint32_t* const sub[4] = {sub_.data(), sub_.data() + stride_, sub_.data() + 2 * stride_,
                              sub_.data() + 3 * stride_};
    constexpr int64_t kBlock = 1024;
    std::array<int32_t, kBlock> bin{};
    for (int64_t start = 0; start < len; start += kBlock) {
      const int64_t m = std::min(kBlock, len - start);
      bin_indices_(x + start, m, scale, static_cast<int32_t>(bins_), bin.data());
      int64_t k = 0;
      for (; k + 4 <= m; k += 4) {
        for (int s = 0; s < 4; ++s) ++sub[s][bin[static_cast<size_t>(k + s)]];
      }
      for (; k < m; ++k) ++sub[0][bin[static_cast<size_t>(k)]];
    }
    pending_ += len;
  }
  [[nodiscard]] bool near_overflow() const { return pending_ > (int64_t{1} << 31); }
  void fold_into(uint64_t* out, uint64_t& nan) {
    for (int64_t s = 0; s < 4; ++s) {
      uint32_t* row = sub_.data() + s * stride_;
      for (int64_t b = 0; b < bins_; ++b) out[b] += row[b];
      nan += row[bins_];
    }
    std::fill(sub_.begin(), sub_.end(), 0);
    pending_ = 0;
  }

 private:
  int64_t bins_;
  int64_t stride_;
  std::vector<uint32_t> sub_;
  int64_t pending_ = 0;
  BinIndicesFn bin_indices_ = bin_indices();
};

// The range of a merge of RangeAccs over n values.
ValueRange range_of(const RangeAcc& acc, int64_t n) {
  ValueRange r;
  r.nan = acc.nan;
  r.count = static_cast<uint64_t>(n) - acc.nan;
  if (r.count > 0) {
    r.min = std::bit_cast<float>(order_key(acc.lo));
    r.max = std::bit_cast<float>(order_key(acc.hi));
  }
  return r;
}

void merge_range(RangeAcc& into, const RangeAcc& acc) {
  into.lo = std::min(into.lo, acc.lo);
  into.hi = std::max(into.hi, acc.hi);
  into.nan += acc.nan;
}

// The pieces cut into chunks of at most kChunk values, in order: what the tasks share.
std::vector<std::span<const float>> chunks_of(FloatPieces pieces) {
  std::vector<std::span<const float>> chunks;
  for (const std::span<const float> piece : pieces) {
    for (size_t at = 0; at < piece.size(); at += kChunk) {
      chunks.push_back(piece.subspan(at, std::min<size_t>(kChunk, piece.size() - at)));
    }
  }
  return chunks;
}

int64_t total_size(FloatPieces pieces) {
  int64_t n = 0;
  for (const std::span<const float> piece : pieces) n += static_cast<int64_t>(piece.size());
  return n;
}

}  // namespace

ValueRange minmax(std::span<const float> x) {
  const std::span<const float> one[] = {x};
  return minmax(FloatPieces(one));
}

ValueRange minmax(FloatPieces pieces) {
  const int64_t n = total_size(pieces);
  const std::vector<std::span<const float>> chunks = chunks_of(pieces);
  std::vector<RangeAcc> ranges(chunks.size());
  const RangePieceFn piece = range_piece();
  run_tasks(thread_count(n), static_cast<int64_t>(chunks.size()), [&](int64_t c, int) {
    const std::span<const float> chunk = chunks[static_cast<size_t>(c)];
    piece(chunk.data(), static_cast<int64_t>(chunk.size()), ranges[static_cast<size_t>(c)]);
  });
  RangeAcc all;
  for (const RangeAcc& acc : ranges) merge_range(all, acc);
  return range_of(all, n);
}

uint64_t histogram_abs(std::span<const float> x, float scale, std::span<uint64_t> bins) {
  const std::span<const float> one[] = {x};
  return histogram_abs(FloatPieces(one), scale, bins);
}

uint64_t histogram_abs(FloatPieces pieces, float scale, std::span<uint64_t> bins) {
  const int64_t n = total_size(pieces);
  const auto nb = static_cast<int64_t>(bins.size());
  const std::vector<std::span<const float>> chunks = chunks_of(pieces);
  const int threads = thread_count(n);
  // One row of 64-bit counts per thread slot (the first is `bins` itself), summed at the end.
  std::vector<uint64_t> rows(static_cast<size_t>((threads - 1) * nb), 0);
  std::vector<uint64_t> nans(static_cast<size_t>(threads), 0);
  std::vector<std::unique_ptr<SubHistograms>> subs(static_cast<size_t>(threads));
  const auto out = [&](int t) { return t == 0 ? bins.data() : rows.data() + (t - 1) * nb; };
  run_tasks(threads, static_cast<int64_t>(chunks.size()), [&](int64_t c, int t) {
    std::unique_ptr<SubHistograms>& sub = subs[static_cast<size_t>(t)];
    if (!sub) sub = std::make_unique<SubHistograms>(nb);
    const std::span<const float> chunk = chunks[static_cast<size_t>(c)];
    sub->count(chunk.data(), static_cast<int64_t>(chunk.size()), scale);
    if (sub->near_overflow()) sub->fold_into(out(t), nans[static_cast<size_t>(t)]);
  });
  for (int t = 0; t < threads; ++t) {
    if (subs[static_cast<size_t>(t)]) {
      subs[static_cast<size_t>(t)]->fold_into(out(t), nans[static_cast<size_t>(t)]);
    }
  }
  for (int t = 1; t < threads; ++t) {
    const uint64_t* row = rows.data() + (t - 1) * nb;
    for (int64_t b = 0; b < nb; ++b) bins[static_cast<size_t>(b)] += row[b];
  }
  uint64_t nan = 0;
  for (uint64_t v : nans) nan += v;
  return nan;
}

namespace {

// One task slot's share of range_histogram_abs_pow2: the range of its chunks, and their counts
// at the width they have needed so far.
struct RangeHistogramSlot {
  RangeAcc range;
  int exponent = kNoExponent;  // the floor, or kNoExponent until a non-zero number
  uint64_t zeros = 0;          // numbers seen before a width: all zeros
  bool infinite = false;       // a chunk reached +-inf: no histogram
  std::vector<uint64_t> row;   // 64-bit counts at `exponent`, once counting
  std::unique_ptr<SubHistograms> sub;
  uint64_t nan = 0;            // the sub-histograms' NaN slot (the range counts them)

  void count(std::span<const float> chunk, int64_t bins) {
    if (!sub) {
      row.assign(static_cast<size_t>(bins), 0);
      sub = std::make_unique<SubHistograms>(bins);
    }
    sub->count(chunk.data(), static_cast<int64_t>(chunk.size()), std::ldexp(1.0f, -exponent));
    if (sub->near_overflow()) sub->fold_into(row.data(), nan);
  }
  // The counts at `to` >= exponent.
  void widen_to(int to) {
    if (sub) {
      sub->fold_into(row.data(), nan);
      widen_pow2_bins(row, to - exponent);
    }
    exponent = to;
  }
};

}  // namespace

// Each chunk (kChunk values, 64 KiB) is read for its range and then, from the core's cache, for
// its bins, at the width its slot needs so far; a slot that needs a wider one merges its bins
// first. A bin of 2^e is a whole part of one of 2^(e + d) (histogram_abs_pow2's products are
// exact), and a slot's width always holds its values, so no count lands clamped: the slots'
// counts widened to the widest are the counts one call at that width would give.
RangeHistogram range_histogram_abs_pow2(FloatPieces pieces, int floor_exponent,
                                        std::span<uint64_t> bins) {
  const int64_t n = total_size(pieces);
  const auto nb = static_cast<int64_t>(bins.size());
  const std::vector<std::span<const float>> chunks = chunks_of(pieces);
  const int threads = thread_count(n);
  std::vector<RangeHistogramSlot> slots(static_cast<size_t>(threads));
  for (RangeHistogramSlot& slot : slots) slot.exponent = floor_exponent;
  const RangePieceFn piece = range_piece();
  run_tasks(threads, static_cast<int64_t>(chunks.size()), [&](int64_t c, int t) {
    RangeHistogramSlot& slot = slots[static_cast<size_t>(t)];
    const std::span<const float> chunk = chunks[static_cast<size_t>(c)];
    RangeAcc acc;
    piece(chunk.data(), static_cast<int64_t>(chunk.size()), acc);
    merge_range(slot.range, acc);
    const ValueRange r = range_of(acc, static_cast<int64_t>(chunk.size()));
    if (slot.infinite || r.count == 0) return;
    const float amax = std::fmax(std::fabs(r.min), std::fabs(r.max));
    if (!std::isfinite(amax)) {
      slot.infinite = true;
      return;
    }
    if (slot.exponent == kNoExponent && amax == 0.0f) {
      slot.zeros += r.count;
      return;
    }
    const int need = histogram_exponent(amax, nb);
    if (slot.exponent == kNoExponent) {
      slot.exponent = need;
    } else if (need > slot.exponent) {
      slot.widen_to(need);
    }
    slot.count(chunk, nb);
  });
  RangeAcc all;
  int exponent = floor_exponent;
  bool infinite = false;
  for (const RangeHistogramSlot& slot : slots) {
    merge_range(all, slot.range);
    exponent = std::max(exponent, slot.exponent);
    infinite = infinite || slot.infinite;
  }
  RangeHistogram out;
  out.range = range_of(all, n);
  if (infinite || exponent == kNoExponent) return out;
  out.exponent = exponent;
  out.binned = true;
  for (RangeHistogramSlot& slot : slots) {
    if (slot.exponent != kNoExponent) slot.widen_to(exponent);
    for (int64_t b = 0; b < static_cast<int64_t>(slot.row.size()); ++b) {
      bins[static_cast<size_t>(b)] += slot.row[static_cast<size_t>(b)];
    }
    bins[0] += slot.zeros;
  }
  return out;
}

namespace {

// ---- entropy terms, several lanes at a time ---------------------------------------------------
// The lanes of the search (lane t adds bins t, t + kLanes, ...) are independent, so W adjacent
// lanes take one block of adjacent bins together: calib_math's operations on vectors of W
// doubles (GCC/Clang vector extensions; two lanes on the SSE2 baseline, four where the CPU has
// AVX2, eight where it has AVX-512F, chosen at run time), each lane rounding exactly as the
// scalar code does (no FMA: the project builds with -ffp-contract=off). Subnormal ratios (never
// seen in practice) go through the scalar det_log.

// D: the values; L: lane masks (what comparisons give); U: bits.
template <int W>
struct DLanes {
  using D = typename lanes::Lanes<double, W>::V;
  using L = typename lanes::Lanes<double, W>::M;
  using U = typename lanes::Lanes<double, W>::U;
};

using lanes::select;
using lanes::splat;

// calib_math::det_log lane by lane for normal x > 0 (the caller checks).
template <int W>
QF_LANES_INLINE typename DLanes<W>::D det_log_lanes(typename DLanes<W>::D x) {
  using D = typename DLanes<W>::D;
  using L = typename DLanes<W>::L;
  using U = typename DLanes<W>::U;
  const U b = reinterpret_cast<U>(x);
  L e = reinterpret_cast<L>((b >> 52) & splat<U>(uint64_t{0x7ff})) - splat<L>(int64_t{1023});
  D m = reinterpret_cast<D>((b & splat<U>(uint64_t{0x000fffffffffffffULL})) |
                            splat<U>(uint64_t{0x3ff0000000000000ULL}));
  const L big = m > splat<D>(1.4142135623730951);
  m = select(big, m * splat<D>(0.5), m);
  e = e - big;  // big lanes are -1: e + 1
  const D one = splat<D>(1.0);
  const D s = (m - one) / (m + one);
  const D s2 = s * s;
  D poly = splat<D>(1.0 / 23.0);
  poly = splat<D>(1.0 / 21.0) + s2 * poly;
  poly = splat<D>(1.0 / 19.0) + s2 * poly;
  poly = splat<D>(1.0 / 17.0) + s2 * poly;
  poly = splat<D>(1.0 / 15.0) + s2 * poly;
  poly = splat<D>(1.0 / 13.0) + s2 * poly;
  poly = splat<D>(1.0 / 11.0) + s2 * poly;
  poly = splat<D>(1.0 / 9.0) + s2 * poly;
  poly = splat<D>(1.0 / 7.0) + s2 * poly;
  poly = splat<D>(1.0 / 5.0) + s2 * poly;
  poly = splat<D>(1.0 / 3.0) + s2 * poly;
  const D two_s = splat<D>(2.0) * s;
  const D log_m = two_s + two_s * (s2 * poly);
  // e as a double without a conversion instruction per lane: 2^52 + 2^51 + e is exact in the
  // mantissa bits, and subtracting 2^52 + 2^51 leaves e exactly.
  const D ed = reinterpret_cast<D>(e + splat<L>(int64_t{0x4338000000000000LL})) -
               splat<D>(6755399441055744.0);
  return ed * splat<D>(cm::kDetLogLn2Hi) + (ed * splat<D>(cm::kDetLogLn2Lo) + log_m);
}

// det_log of x[0 .. n) into out, W at a time where every value is normal and positive; 0 where
// x is 0 (a bin or level without values, whose term is 0 whatever its log); the scalar det_log
// (the same bits) for subnormals.
template <int W>
QF_LANES_INLINE void det_log_span_w(const double* x, double* out, int64_t n) {
  using D = typename DLanes<W>::D;
  using U = typename DLanes<W>::U;
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    D v;
    std::memcpy(&v, x + i, sizeof v);
    const U exponent = (reinterpret_cast<U>(v) >> 52) & splat<U>(uint64_t{0x7ff});
    bool normal = true;
    for (int k = 0; k < W; ++k) normal = normal && exponent[k] != 0 && v[k] > 0;
    if (normal) {
      const D l = det_log_lanes<W>(v);
      std::memcpy(out + i, &l, sizeof l);
      continue;
    }
    for (int k = 0; k < W; ++k) out[i + k] = x[i + k] > 0 ? cm::det_log(x[i + k]) : 0.0;
  }
  for (; i < n; ++i) out[i] = x[i] > 0 ? cm::det_log(x[i]) : 0.0;
}

// calib_math's lane_tree_sum, W pairs at a time while the stride allows: the same additions.
template <int W>
QF_LANES_INLINE double lane_tree_sum_w(double* lanes) {
  using D = typename DLanes<W>::D;
  int stride = cm::kLanes / 2;
  for (; stride >= W; stride >>= 1) {
    for (int t = 0; t < stride; t += W) {
      D a, b;
      std::memcpy(&a, lanes + t, sizeof a);
      std::memcpy(&b, lanes + t + stride, sizeof b);
      a = a + b;
      std::memcpy(lanes + t, &a, sizeof a);
    }
  }
  for (; stride > 0; stride >>= 1) {
    for (int t = 0; t < stride; ++t) lanes[t] = cm::add(lanes[t], lanes[t + stride]);
  }
  return lanes[0];
}

template <int W>
QF_LANES_INLINE typename DLanes<W>::D load_lanes(const double* p) {
  typename DLanes<W>::D v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// a_g += v_g * e for the first C of four histograms.
template <int W, int C, typename D = typename DLanes<W>::D>
QF_LANES_INLINE void add_products(D e, D v0, D v1, D v2, D v3, D& a0, D& a1, D& a2, D& a3) {
  a0 = a0 + v0 * e;
  if constexpr (C > 1) a1 = a1 + v1 * e;
  if constexpr (C > 2) a2 = a2 + v2 * e;
  if constexpr (C > 3) a3 = a3 + v3 * e;
}

// The MSE search's sums of one candidate for C histograms at once: sums[g] = lane_tree_sum of
// lanes t = 0 .. kLanes - 1, lane t being the sum, in increasing j, of rows[g][j] * err_j over
// the bins j = t, t + kLanes, ... below nb, err_j being inside[j] below `kept` and
// clipped[j - kept] from it: the CUDA block's terms in its order. Each lane is a register that
// walks its bins, and the C histograms share each load of the errors. A bin without values
// adds h * err = +0 (err is a finite squared error, never negative), which leaves a lane as it
// was (a lane's sum starts at +0 and is never -0); so do the vector lanes past nb, whose h is
// taken as 0. `lanes` holds C * kLanes doubles of scratch.
template <int W, int C>
QF_LANES_INLINE void mse_rows_w(const double* const* rows, const double* inside,
                                const double* clipped, int64_t kept, int64_t nb, double* lanes,
                                double* sums) {
  using D = typename DLanes<W>::D;
  static_assert(cm::kLanes % W == 0 && C >= 1 && C <= 4);
  const double* h0 = rows[0];
  const double* h1 = C > 1 ? rows[1] : rows[0];
  const double* h2 = C > 2 ? rows[2] : rows[0];
  const double* h3 = C > 3 ? rows[3] : rows[0];
  for (int64_t t0 = 0; t0 < cm::kLanes; t0 += W) {
    D a0 = {}, a1 = {}, a2 = {}, a3 = {};
    int64_t j = t0;
    for (; j + W <= kept && j + W <= nb; j += cm::kLanes) {  // inside
      add_products<W, C>(load_lanes<W>(inside + j), load_lanes<W>(h0 + j), load_lanes<W>(h1 + j),
                         load_lanes<W>(h2 + j), load_lanes<W>(h3 + j), a0, a1, a2, a3);
    }
    for (; j < nb; j += cm::kLanes) {
      D e;
      if (j >= kept && j - kept + W <= nb) {  // clipped holds nb errors
        e = load_lanes<W>(clipped + (j - kept));
      } else {  // straddles `kept` or nb
        for (int k = 0; k < W; ++k) {
          const int64_t b = j + k;
          e[k] = b < kept ? inside[b] : b < nb ? clipped[b - kept] : 0.0;
        }
      }
      if (j + W <= nb) {
        add_products<W, C>(e, load_lanes<W>(h0 + j), load_lanes<W>(h1 + j), load_lanes<W>(h2 + j),
                           load_lanes<W>(h3 + j), a0, a1, a2, a3);
        continue;
      }
      D v0 = {}, v1 = {}, v2 = {}, v3 = {};
      for (int k = 0; j + k < nb; ++k) {
        v0[k] = h0[j + k];
        v1[k] = h1[j + k];
        v2[k] = h2[j + k];
        v3[k] = h3[j + k];
      }
      add_products<W, C>(e, v0, v1, v2, v3, a0, a1, a2, a3);
    }
    std::memcpy(lanes + t0, &a0, sizeof a0);
    if constexpr (C > 1) std::memcpy(lanes + cm::kLanes + t0, &a1, sizeof a1);
    if constexpr (C > 2) std::memcpy(lanes + 2 * cm::kLanes + t0, &a2, sizeof a2);
    if constexpr (C > 3) std::memcpy(lanes + 3 * cm::kLanes + t0, &a3, sizeof a3);
  }
  for (int g = 0; g < C; ++g) sums[g] = lane_tree_sum_w<W>(lanes + g * cm::kLanes);
}

// Up to kMseRows histograms per call of the search's row function.
constexpr int kMseRows = 4;

template <int W>
QF_LANES_INLINE void mse_rows_any(const double* const* h, int count, const double* inside,
                                  const double* clipped, int64_t kept, int64_t nb, double* lanes,
                                  double* sums) {
  switch (count) {
    case 1: mse_rows_w<W, 1>(h, inside, clipped, kept, nb, lanes, sums); break;
    case 2: mse_rows_w<W, 2>(h, inside, clipped, kept, nb, lanes, sums); break;
    case 3: mse_rows_w<W, 3>(h, inside, clipped, kept, nb, lanes, sums); break;
    default: mse_rows_w<W, kMseRows>(h, inside, clipped, kept, nb, lanes, sums); break;
  }
}

// Q per level: (count / bins) / q_total, 0 for a level without values (bins = 0).
template <int W>
QF_LANES_INLINE void level_q_w(const double* count, const double* bins, double q_total,
                               double* q, int64_t n) {
  using D = typename DLanes<W>::D;
  using L = typename DLanes<W>::L;
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    D c, b;
    std::memcpy(&c, count + i, sizeof c);
    std::memcpy(&b, bins + i, sizeof b);
    const L empty = b == splat<D>(0.0);
    const D v = select(empty, splat<D>(0.0), (c / select(empty, splat<D>(1.0), b)) /
                                                 splat<D>(q_total));
    std::memcpy(q + i, &v, sizeof v);
  }
  for (; i < n; ++i) q[i] = bins[i] > 0 ? cm::div(cm::div(count[i], bins[i]), q_total) : 0.0;
}

// What every candidate of one histogram's entropy search reads.
struct EntropyInputs {
  const uint64_t* hist;
  // suffix_d[i] = sum hist[i..], and prefix_nonzero_d[i] how many of bins [0, i) hold values,
  // as doubles: exact, for the counts stay below 2^53 (kernels/calib.cpp checks), and so is a
  // difference of two of them.
  const double* suffix_d;
  const double* prefix_nonzero_d;
  const double* p_all;             // h_j / total
  const double* log_p;             // det_log(p_all[j]), 0 where h_j = 0
  uint64_t total;
  int levels;
};

// One thread's buffers for the candidates it takes. The per-level arrays have a vector of room
// past their last level: the level edges are computed W at a time.
struct EntropyScratch {
  static constexpr size_t kMaxLanesW = 8;  // doubles in the widest vector
  EntropyScratch(int levels, int64_t bins)
      : level_count(static_cast<size_t>(levels)), level_bins(static_cast<size_t>(levels)),
        q_level(static_cast<size_t>(levels)), log_q(static_cast<size_t>(levels)),
        level_first(static_cast<size_t>(levels) + 1 + kMaxLanesW),
        edge_suffix(static_cast<size_t>(levels) + 1), edge_nonzero(static_cast<size_t>(levels) + 1),
        log_q_bin(static_cast<size_t>(bins) + kMaxLanesW), lanes(cm::kLanes) {}
  std::vector<double> level_count;  // values in each level (exact below 2^53)
  std::vector<double> level_bins;   // non-empty bins in each level
  std::vector<double> q_level;
  std::vector<double> log_q;
  std::vector<int64_t> level_first;
  std::vector<double> edge_suffix;   // suffix_d[level_first[l]]
  std::vector<double> edge_nonzero;  // prefix_nonzero_d[level_first[l]]
  std::vector<double> log_q_bin;    // each bin's level's log Q, and room for a vector past it
  std::vector<double> lanes;
};

// floor(x) lane by lane for 0 <= x < 2^51: x rounded to an integer through 2^52, less one where
// that rounded up. Exact, as std::floor.
template <int W>
QF_LANES_INLINE typename DLanes<W>::D floor_lanes(typename DLanes<W>::D x) {
  using D = typename DLanes<W>::D;
  using L = typename DLanes<W>::L;
  const D big = splat<D>(4503599627370496.0);  // 2^52
  const D r = (x + big) - big;
  return r - reinterpret_cast<D>(reinterpret_cast<L>(splat<D>(1.0)) & (r > x));
}

// first[l] = ceil(l * kept / levels) for l = 0 .. levels (and a few past, which nothing reads),
// W at a time in doubles: it is floor((l * kept + levels - 1/2) / levels), whose numerator is
// exact (a half-integer below 2^23) and whose quotient lies at least 1 / (2 levels) >= 2^-11
// from an integer, so multiplying by the rounded 1 / levels (relative error below 2^-52, so
// below 2^-39 on quotients up to 4097) cannot move it across one; the conversion goes through
// 2^52 + 2^51, as det_log_lanes does.
template <int W>
QF_LANES_INLINE void level_edges_w(int64_t kept, int64_t levels, int64_t* first) {
  using D = typename DLanes<W>::D;
  using L = typename DLanes<W>::L;
  const auto k = static_cast<double>(kept);
  D a;
  for (int t = 0; t < W; ++t) a[t] = static_cast<double>(t) * k + static_cast<double>(levels) - 0.5;
  const D step = splat<D>(static_cast<double>(W) * k);
  const D inverse = splat<D>(1.0 / static_cast<double>(levels));
  const D magic = splat<D>(6755399441055744.0);  // 2^52 + 2^51
  for (int64_t l = 0; l <= levels; l += W) {
    const D t = floor_lanes<W>(a * inverse);
    const L n = reinterpret_cast<L>(t + magic) - splat<L>(int64_t{0x4338000000000000LL});
    std::memcpy(first + l, &n, sizeof n);
    a = a + step;
  }
}

// Each level's count and non-empty bins from the suffix and prefix sums at its edges, W levels
// at a time.
template <int W>
QF_LANES_INLINE void level_counts_w(const EntropyInputs& in, const int64_t* first,
                                    EntropyScratch& s) {
  using D = typename DLanes<W>::D;
  const int64_t levels = in.levels;
  double* edge_suffix = s.edge_suffix.data();
  double* edge_nonzero = s.edge_nonzero.data();
  for (int64_t l = 0; l <= levels; ++l) {
    edge_suffix[l] = in.suffix_d[first[l]];
    edge_nonzero[l] = in.prefix_nonzero_d[first[l]];
  }
  double* count = s.level_count.data();
  double* bins = s.level_bins.data();
  int64_t l = 0;
  for (; l + W <= levels; l += W) {
    const D c = load_lanes<W>(edge_suffix + l) - load_lanes<W>(edge_suffix + l + 1);
    const D b = load_lanes<W>(edge_nonzero + l + 1) - load_lanes<W>(edge_nonzero + l);
    std::memcpy(count + l, &c, sizeof c);
    std::memcpy(bins + l, &b, sizeof b);
  }
  for (; l < levels; ++l) {
    count[l] = cm::sub(edge_suffix[l], edge_suffix[l + 1]);
    bins[l] = cm::sub(edge_nonzero[l + 1], edge_nonzero[l]);
  }
}

// The divergence of the candidate that keeps `kept` bins, the CUDA kernel's terms in its order:
// lane t of kLanes adds, in bin order, the terms P_j (log P_j - log Q_j) of bins t, t + kLanes,
// ... below kept - 1 (a register per W lanes), then the last kept bin's term, which holds the
// outliers too, is its lane's last; the lanes are summed by lane_tree_sum. A bin without values
// has P_j = 0 and log P_j = 0: its term is a zero, which leaves a lane's sum as it was (a sum is
// never -0: it starts at +0, and x + -x is +0), so adding it is skipping it; the vector lanes
// past the last bin add +0 too. Q is taken per level, not per bin, and the level edges and
// counts W levels at a time.
template <int W>
QF_LANES_INLINE double entropy_candidate_w(const EntropyInputs& in, int64_t kept,
                                           EntropyScratch& s) {
  using D = typename DLanes<W>::D;
  const int64_t levels = in.levels;
  const auto outliers = static_cast<uint64_t>(in.suffix_d[kept]);
  const cm::EntropyCandidate c = cm::entropy_candidate(in.total, outliers, in.hist[kept - 1]);
  if (c.infinite) return std::numeric_limits<double>::infinity();
  // Bin j goes to level floor(j * levels / kept), so level l holds the bins from
  // ceil(l * kept / levels) up to the next level's first (kept >= levels: none is empty); its
  // count and non-empty bins come from the suffix and prefix sums.
  const int64_t whole = kept / levels;
  int64_t* level_first = s.level_first.data();
  level_edges_w<W>(kept, levels, level_first);
  level_counts_w<W>(in, level_first, s);
  // Finite: every bin with P_j > 0 has h_j > 0, so its level has a non-empty bin.
  level_q_w<W>(s.level_count.data(), s.level_bins.data(), c.q_total, s.q_level.data(), levels);
  det_log_span_w<W>(s.q_level.data(), s.log_q.data(), levels);
  // Each level's log Q over its bins, a vector at a time: a store past the level's end is
  // overwritten by the next level's. A level holds `whole` or whole + 1 bins, so the same count of
  // stores covers every level (a loop whose count does not change mispredicts no branch); the
  // last level starts at kept - whole, so its stores end by kept + W, inside the buffer.
  double* log_q_bin = s.log_q_bin.data();
  const double* log_q = s.log_q.data();
  const int64_t stores = (whole + W) / W;  // ceil((whole + 1) / W)
  for (int64_t l = 0; l < levels; ++l) {
    // A broadcast (x - +0 is x, -0 included): splat's lane loop becomes W masked loads here.
    const D v = log_q[l] - D{};
    double* to = log_q_bin + level_first[l];
    for (int64_t k = 0; k < stores; ++k) std::memcpy(to + k * W, &v, sizeof v);
  }
  const double p_last =
      cm::div(static_cast<double>(in.hist[kept - 1] + outliers), c.p_total);
  // The last kept bin is in the last level.
  const double last_term =
      p_last > 0 ? cm::mul(p_last, cm::sub(cm::det_log(p_last), s.log_q[levels - 1])) : 0.0;
  const int64_t body = kept - 1;
  double* lanes = s.lanes.data();
  for (int64_t t0 = 0; t0 < cm::kLanes; t0 += W) {
    D acc = {};
    int64_t j = t0;
    for (; j + W <= body; j += cm::kLanes) {
      acc = acc + load_lanes<W>(in.p_all + j) *
                      (load_lanes<W>(in.log_p + j) - load_lanes<W>(log_q_bin + j));
    }
    if (j < body) {  // the vector that holds the last bins below kept - 1
      D p = {}, lp = {}, lq = {};
      for (int k = 0; j + k < body; ++k) {
        p[k] = in.p_all[j + k];
        lp[k] = in.log_p[j + k];
        lq[k] = log_q_bin[j + k];
      }
      acc = acc + p * (lp - lq);
    }
    std::memcpy(lanes + t0, &acc, sizeof acc);
  }
  if (p_last > 0) {
    double& lane = lanes[body % cm::kLanes];
    lane = cm::add(lane, last_term);
  }
  return lane_tree_sum_w<W>(lanes);
}

// calib_math's squared_error_integral, lane by lane.
template <int W, typename D = typename DLanes<W>::D>
QF_LANES_INLINE D squared_error_integral_w(const D& lo, const D& hi, const D& c) {
  const D u = hi - c;
  const D v = lo - c;
  return ((hi - lo) * ((u * u + u * v) + v * v)) / splat<D>(3.0);
}

// out[j] = mse_bin_error(j, kept, quant_max) for j < kept (bins inside the threshold), W bins at
// a time with the same operations: both of its cases computed, the one it takes selected.
template <int W>
QF_LANES_INLINE void mse_inside_row_w(int64_t kept, int quant_max, double* out) {
  using D = typename DLanes<W>::D;
  const auto t = static_cast<double>(kept);
  const double step_s = cm::div(t, static_cast<double>(quant_max));
  const D step = splat<D>(step_s);
  const D half = splat<D>(0.5);
  const D one = splat<D>(1.0);
  D lo;
  for (int k = 0; k < W; ++k) lo[k] = static_cast<double>(k);
  int64_t j = 0;
  for (; j + W <= kept; j += W) {
    const D hi = lo + one;
    const D k = floor_lanes<W>(lo / step + half);
    const D edge = (k + half) * step;
    const D at = k * step;
    const D split = squared_error_integral_w<W>(lo, edge, at) +
                    squared_error_integral_w<W>(edge, hi, (k + one) * step);
    const D whole = squared_error_integral_w<W>(lo, hi, at);
    const D e = select(edge < hi, split, whole);
    std::memcpy(out + j, &e, sizeof e);
    lo = lo + splat<D>(static_cast<double>(W));
  }
  for (; j < kept; ++j) out[j] = cm::mse_bin_error(j, kept, quant_max);
}

struct SearchLanes {
  void (*det_log_span)(const double*, double*, int64_t);
  double (*entropy_candidate)(const EntropyInputs&, int64_t, EntropyScratch&);
  void (*mse_rows)(const double* const*, int, const double*, const double*, int64_t, int64_t,
                   double*, double*);
  void (*mse_inside_row)(int64_t, int, double*);
};

template <int W>
void det_log_span(const double* x, double* out, int64_t n) {
  det_log_span_w<W>(x, out, n);
}
template <int W>
double entropy_candidate(const EntropyInputs& in, int64_t kept, EntropyScratch& s) {
  return entropy_candidate_w<W>(in, kept, s);
}
template <int W>
void mse_rows(const double* const* h, int count, const double* inside, const double* clipped,
              int64_t kept, int64_t nb, double* lanes, double* sums) {
  mse_rows_any<W>(h, count, inside, clipped, kept, nb, lanes, sums);
}
template <int W>
void mse_inside_row(int64_t kept, int quant_max, double* out) {
  mse_inside_row_w<W>(kept, quant_max, out);
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) void det_log_span_avx2(const double* x, double* out, int64_t n) {
  det_log_span_w<4>(x, out, n);
}
__attribute__((target("avx2"))) double entropy_candidate_avx2(const EntropyInputs& in,
                                                              int64_t kept, EntropyScratch& s) {
  return entropy_candidate_w<4>(in, kept, s);
}
__attribute__((target("avx2"))) void mse_rows_avx2(const double* const* h, int count,
                                                   const double* inside, const double* clipped,
                                                   int64_t kept, int64_t nb, double* lanes,
                                                   double* sums) {
  mse_rows_any<4>(h, count, inside, clipped, kept, nb, lanes, sums);
}
__attribute__((target("avx2"))) void mse_inside_row_avx2(int64_t kept, int quant_max,
                                                         double* out) {
  mse_inside_row_w<4>(kept, quant_max, out);
}
__attribute__((target("avx512f"))) void det_log_span_avx512(const double* x, double* out,
                                                           int64_t n) {
  det_log_span_w<8>(x, out, n);
}
__attribute__((target("avx512f"))) double entropy_candidate_avx512(const EntropyInputs& in,
                                                                  int64_t kept,
                                                                  EntropyScratch& s) {
  return entropy_candidate_w<8>(in, kept, s);
}
__attribute__((target("avx512f"))) void mse_rows_avx512(const double* const* h, int count,
                                                       const double* inside,
                                                       const double* clipped, int64_t kept,
                                                       int64_t nb, double* lanes, double* sums) {
  mse_rows_any<8>(h, count, inside, clipped, kept, nb, lanes, sums);
}
__attribute__((target("avx512f"))) void mse_inside_row_avx512(int64_t kept, int quant_max,
                                                             double* out) {
  mse_inside_row_w<8>(kept, quant_max, out);
}
#endif

SearchLanes search_lanes() {
#if defined(__x86_64__)
  if (wide_lanes()) {
    return {det_log_span_avx512, entropy_candidate_avx512, mse_rows_avx512,
            mse_inside_row_avx512};
  }
  if (avx2_lanes()) {
    return {det_log_span_avx2, entropy_candidate_avx2, mse_rows_avx2, mse_inside_row_avx2};
  }
#endif
  return {det_log_span<2>, entropy_candidate<2>, mse_rows<2>, mse_inside_row<2>};
}

}  // namespace

void use_baseline_lanes(bool on) { baseline_only.store(on); }
void use_avx2_lanes_at_most(bool on) { avx2_at_most.store(on); }

void mse_inside_errors(int64_t kept, int quant_max, std::span<double> out) {
  search_lanes().mse_inside_row(kept, quant_max, out.data());
}

namespace {

// What entropy_candidate_w reads of one histogram, with the storage behind the pointers.
struct EntropyPrepared {
  std::vector<double> suffix_d, prefix_nonzero_d, p_all, log_p;
  EntropyInputs in{};

  EntropyPrepared(std::span<const uint64_t> hist, int quant_levels, const SearchLanes& fns) {
    const auto nb = static_cast<int64_t>(hist.size());
    uint64_t total = 0;  // below 2^53: every partial sum is exact in a double
    suffix_d.assign(static_cast<size_t>(nb + 1), 0.0);
    for (int64_t b = nb; b-- > 0;) {
      total += hist[static_cast<size_t>(b)];
      suffix_d[b] = static_cast<double>(total);
    }
    prefix_nonzero_d.assign(static_cast<size_t>(nb + 1), 0.0);
    for (int64_t b = 0; b < nb; ++b) {
      prefix_nonzero_d[b + 1] = prefix_nonzero_d[b] + (hist[static_cast<size_t>(b)] > 0 ? 1 : 0);
    }
    p_all.resize(static_cast<size_t>(nb));
    for (int64_t j = 0; j < nb; ++j) {
      p_all[static_cast<size_t>(j)] =
          cm::div(static_cast<double>(hist[static_cast<size_t>(j)]), static_cast<double>(total));
    }
    log_p.resize(static_cast<size_t>(nb));
    fns.det_log_span(p_all.data(), log_p.data(), nb);
    in = EntropyInputs{hist.data(), suffix_d.data(), prefix_nonzero_d.data(), p_all.data(),
                       log_p.data(), total, quant_levels};
  }
};

}  // namespace

// The same terms as the CUDA kernel's, in the same lane order (tests/unit/kernels/
// test_calib_search.cpp checks the bits against a plain twin), with what does not change between
// candidates computed once: P_j = h_j / total and its log for every bin but the one holding the
// outliers, Q and its log per level rather than per bin, and the level edges by a multiply
// instead of a division. Every histogram's candidates go to one parallel loop, eight at a time
// (later candidates cost more: they keep more bins), so that a model's tensors share one
// fork and join instead of one each.
void entropy_scores_many(std::span<const std::span<const uint64_t>> hists, int quant_levels,
                         std::span<const std::span<double>> scores) {
  constexpr int64_t kChunk = 8;
  const SearchLanes fns = search_lanes();
  std::vector<std::unique_ptr<EntropyPrepared>> prepared(hists.size());
  std::vector<int64_t> chunk_start(hists.size() + 1, 0);  // histogram h's first chunk
  int64_t widest = 0;
  for (size_t h = 0; h < hists.size(); ++h) {
    const auto candidates = static_cast<int64_t>(scores[h].size());
    chunk_start[h + 1] = chunk_start[h] + (candidates + kChunk - 1) / kChunk;
    widest = std::max(widest, static_cast<int64_t>(hists[h].size()));
  }
  const auto count = static_cast<int64_t>(hists.size());
  const int threads = cpu_threads();
  run_tasks(threads, count, [&](int64_t h, int) {
    prepared[static_cast<size_t>(h)] =
        std::make_unique<EntropyPrepared>(hists[static_cast<size_t>(h)], quant_levels, fns);
  });
  // Scratch per thread slot, made by the slot's first task.
  std::vector<std::unique_ptr<EntropyScratch>> scratch(static_cast<size_t>(threads));
  run_tasks(threads, chunk_start.back(), [&](int64_t chunk, int slot) {
    auto& mine = scratch[static_cast<size_t>(slot)];
    if (!mine) mine = std::make_unique<EntropyScratch>(quant_levels, widest);
    const auto h = static_cast<size_t>(
        std::upper_bound(chunk_start.begin(), chunk_start.end(), chunk) - chunk_start.begin() - 1);
    const EntropyInputs& in = prepared[h]->in;
    const std::span<double> out = scores[h];
    const int64_t first = (chunk - chunk_start[h]) * kChunk;
    const int64_t last = std::min(first + kChunk, static_cast<int64_t>(out.size()));
    for (int64_t k = first; k < last; ++k) {
      out[static_cast<size_t>(k)] = fns.entropy_candidate(in, quant_levels + k, *mine);
    }
  });
}

namespace {

// mse_bin_error(j, kept, quant_max) for every candidate kept up to kMseTableMaxBins and bin
// j < kept: it depends on neither the histogram, nor its bin count, nor the data, so one table
// per quant_max serves every tensor (about 17 MB; calibration's histograms end at their last
// non-empty bin, so their bin counts differ, and each reads the rows up to its own). Candidate
// k's row holds its kept = quant_max + 1 + k terms, the rows one after another.
struct MseTable {
  int quant_max = 0;
  std::vector<double> inside;
  // Where candidate k's row starts: rows 0 .. k - 1 hold (quant_max + 1) + ... + (quant_max + k).
  [[nodiscard]] size_t start(int64_t k) const {
    return static_cast<size_t>(k * (quant_max + 1) + k * (k - 1) / 2);
  }
};

// The table holds the candidates of histograms of up to this many bins (2048, the default, and
// fewer); wider histograms compute their rows in the search.
constexpr int64_t kMseTableMaxBins = 2048;

const MseTable& mse_table(int quant_max) {
  static std::mutex mutex;
  static std::map<int, std::unique_ptr<MseTable>> tables;
  const std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<MseTable>& slot = tables[quant_max];
  if (slot) return *slot;
  auto table = std::make_unique<MseTable>();
  const int64_t candidates = kMseTableMaxBins - quant_max;
  table->quant_max = quant_max;
  table->inside.resize(table->start(candidates));
  const SearchLanes fns = search_lanes();
  constexpr int64_t kRowsPerTask = 16;
  run_tasks(cpu_threads(), (candidates + kRowsPerTask - 1) / kRowsPerTask, [&](int64_t t, int) {
    for (int64_t k = t * kRowsPerTask; k < std::min(candidates, (t + 1) * kRowsPerTask); ++k) {
      fns.mse_inside_row(quant_max + 1 + k, quant_max, table->inside.data() + table->start(k));
    }
  });
  slot = std::move(table);
  return *slot;
}

}  // namespace

void mse_scores(std::span<const uint64_t> hist, int quant_max, std::span<double> scores) {
  const std::span<const uint64_t> hists[1] = {hist};
  const std::span<double> out[1] = {scores};
  mse_scores_many(hists, quant_max, out);
}

// Histograms go through the candidates in groups small enough that their counts stay in the
// core's cache (16 x 2048 doubles: 256 KiB) while each candidate's row of the table is read
// once for the whole group, and each load of it serves up to kMseRows histograms. A group takes
// histograms of neighbouring bin counts (sorted by bin count), its counts padded with zeros to
// its widest: a bin past a histogram's end adds h * err = +0 to its lane, which leaves the lane
// as it was, so each keeps the bits of its own search; candidates past its bins are not kept.
void mse_scores_many(std::span<const std::span<const uint64_t>> hists, int quant_max,
                     std::span<const std::span<double>> scores) {
  constexpr size_t kGroup = 16;
  std::vector<size_t> order(hists.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return hists[a].size() < hists[b].size(); });
  if (order.empty()) return;
  const auto widest = static_cast<int64_t>(hists[order.back()].size());
  const SearchLanes fns = search_lanes();
  // A bin at or past the threshold: its error depends on j - kept alone.
  std::vector<double> clipped(static_cast<size_t>(widest));
  for (int64_t d = 0; d < widest; ++d) {
    clipped[static_cast<size_t>(d)] = cm::mse_clipped_bin_error(d);
  }
  std::vector<double> counts(kGroup * static_cast<size_t>(widest));  // each exact below 2^53
  std::vector<double> totals(kGroup);
  for (size_t g0 = 0; g0 < order.size(); g0 += kGroup) {
    const size_t group = std::min(kGroup, order.size() - g0);
    const auto member = [&](size_t b) { return order[g0 + b]; };
    const auto nb = static_cast<int64_t>(hists[member(group - 1)].size());
    const MseTable* table = nb <= kMseTableMaxBins ? &mse_table(quant_max) : nullptr;
    for (size_t b = 0; b < group; ++b) {
      const std::span<const uint64_t> hist = hists[member(b)];
      double* row = counts.data() + b * static_cast<size_t>(nb);
      uint64_t total = 0;
      for (size_t j = 0; j < hist.size(); ++j) {
        row[j] = static_cast<double>(hist[j]);
        total += hist[j];
      }
      std::fill(row + hist.size(), row + nb, 0.0);
      totals[b] = static_cast<double>(total);
    }
    const int64_t candidates = nb - quant_max;
    // Scratch per thread slot; candidates in tasks of kCandidatesPerTask.
    constexpr int64_t kCandidatesPerTask = 16;
    const int threads = cpu_threads();
    std::vector<std::vector<double>> lanes(static_cast<size_t>(threads),
                                           std::vector<double>(kMseRows * cm::kLanes));
    std::vector<std::vector<double>> row_terms(static_cast<size_t>(threads));
    const int64_t tasks = (candidates + kCandidatesPerTask - 1) / kCandidatesPerTask;
    run_tasks(threads, tasks, [&](int64_t t, int slot) {
      std::vector<double>& my_lanes = lanes[static_cast<size_t>(slot)];
      std::vector<double>& my_terms = row_terms[static_cast<size_t>(slot)];
      for (int64_t k = t * kCandidatesPerTask;
           k < std::min(candidates, (t + 1) * kCandidatesPerTask); ++k) {
        const int64_t kept = quant_max + 1 + k;
        const double* inside = nullptr;
        if (table != nullptr) {
          inside = table->inside.data() + table->start(k);
        } else {
          my_terms.resize(static_cast<size_t>(kept));
          fns.mse_inside_row(kept, quant_max, my_terms.data());  // the table's row, made here
          inside = my_terms.data();
        }
        // Only the histograms with this candidate among theirs (the group's narrowest first).
        size_t first = 0;
        while (first < group && static_cast<int64_t>(hists[member(first)].size()) < kept) {
          ++first;
        }
        for (size_t b0 = first; b0 < group; b0 += kMseRows) {
          const int rows = static_cast<int>(std::min<size_t>(kMseRows, group - b0));
          const double* h[kMseRows];
          for (int r = 0; r < rows; ++r) {
            h[r] = counts.data() + (b0 + static_cast<size_t>(r)) * static_cast<size_t>(nb);
          }
          double sums[kMseRows];
          fns.mse_rows(h, rows, inside, clipped.data(), kept, nb, my_lanes.data(), sums);
          for (int r = 0; r < rows; ++r) {
            const size_t b = b0 + static_cast<size_t>(r);
            scores[member(b)][static_cast<size_t>(k)] = cm::div(sums[r], totals[b]);
          }
        }
      }
    });
  }
}

}  // namespace qforge::cpu
