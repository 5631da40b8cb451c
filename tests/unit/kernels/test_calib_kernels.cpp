// Calibration kernels (kernels/calib.h): ranges and histograms against plain scalar references,
// across thread counts, and the CUDA twin against the CPU on the same inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "ir/error.h"
#include "kernels/calib.h"
#include "kernels/cpu/calib_cpu.h"
#include "kernels/device.h"
#include "tests/unit/cuda_test.h"

using namespace qforge;

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// Sizes around the CPU kernels' 16384-element chunks and 65536-element parallel threshold.
const std::vector<size_t> kSizes = {1, 7, 16383, 16385, 65536, 100003, 1 << 20};

// Gaussian activations with a ReLU-like run of zeros, a few outliers, and specials sprinkled in
// when `specials` is set.
std::vector<float> activations(size_t n, uint32_t seed, bool specials) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> gauss(0.0f, 1.5f);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) {
    x[i] = (i % 5 == 0) ? 0.0f : gauss(rng);
    if (i % 997 == 3) x[i] *= 40.0f;  // outliers
  }
  if (specials && n > 64) {
    x[n / 3] = kNaN;
    x[n / 2] = -kNaN;
    x[n / 4] = -0.0f;
    x[7] = 1e-42f;  // subnormal
  }
  return x;
}

struct RefRange {
  float min, max;
  uint64_t count, nan;
};

RefRange ref_minmax(const std::vector<float>& x) {
  RefRange r{0, 0, 0, 0};
  bool first = true;
  for (float v : x) {
    if (std::isnan(v)) {
      ++r.nan;
      continue;
    }
    ++r.count;
    // -0.0 orders below +0.0.
    auto less = [](float a, float b) {
      return a < b || (a == b && std::signbit(a) && !std::signbit(b));
    };
    if (first || less(v, r.min)) r.min = v;
    if (first || less(r.max, v)) r.max = v;
    first = false;
  }
  return r;
}

std::vector<uint64_t> ref_histogram(const std::vector<float>& x, float range_max, size_t bins,
                                    uint64_t& nan) {
  std::vector<uint64_t> h(bins, 0);
  const float scale = static_cast<float>(bins) / range_max;
  nan = 0;
  for (float v : x) {
    if (std::isnan(v)) {
      ++nan;
      continue;
    }
    const float scaled = std::fabs(v) * scale;
    size_t b = scaled >= static_cast<float>(bins) ? bins - 1 : static_cast<size_t>(scaled);
    h[b] += 1;
  }
  return h;
}

class ThreadGuard {
 public:
  explicit ThreadGuard(int threads) { set_cpu_threads(threads); }
  ~ThreadGuard() { set_cpu_threads(0); }
};

}  // namespace

// Every kernel the CPU runs (AVX-512, AVX2, the SSE2 baseline) against the scalar reference.
TEST(CalibKernels, MinMaxMatchesReference) {
  for (size_t n : kSizes) {
    for (bool specials : {false, true}) {
      const auto x = activations(n, static_cast<uint32_t>(n), specials);
      const RefRange ref = ref_minmax(x);
      for (const int lanes : {0, 1, 2}) {  // the widest, AVX2 at most, the baseline
        cpu::use_avx2_lanes_at_most(lanes == 1);
        cpu::use_baseline_lanes(lanes == 2);
        const ValueRange got = minmax(x, Device::Cpu);
        cpu::use_avx2_lanes_at_most(false);
        cpu::use_baseline_lanes(false);
        const std::string where = "n=" + std::to_string(n) +
                                  " specials=" + std::to_string(specials) +
                                  " lanes=" + std::to_string(lanes);
        EXPECT_EQ(std::bit_cast<uint32_t>(got.min), std::bit_cast<uint32_t>(ref.min)) << where;
        EXPECT_EQ(std::bit_cast<uint32_t>(got.max), std::bit_cast<uint32_t>(ref.max)) << where;
        EXPECT_EQ(got.count, ref.count) << where;
        EXPECT_EQ(got.nan, ref.nan) << where;
      }
    }
  }
}

TEST(CalibKernels, MinMaxOrdersSignedZerosAndInfinities) {
  const std::vector<float> zeros = {0.0f, -0.0f, 0.0f};
  const ValueRange z = minmax(zeros, Device::Cpu);
  EXPECT_TRUE(std::signbit(z.min));
  EXPECT_FALSE(std::signbit(z.max));
  const std::vector<float> inf = {1.0f, -kInf, kNaN, kInf};
  const ValueRange r = minmax(inf, Device::Cpu);
  EXPECT_EQ(r.min, -kInf);
  EXPECT_EQ(r.max, kInf);
  EXPECT_EQ(r.count, 3u);
  EXPECT_EQ(r.nan, 1u);
}

TEST(CalibKernels, MinMaxOfNothingIsZero) {
  const ValueRange empty = minmax(std::span<const float>(), Device::Cpu);
  EXPECT_EQ(empty.count, 0u);
  EXPECT_EQ(empty.min, 0.0f);
  const std::vector<float> nans(100000, kNaN);
  const ValueRange all_nan = minmax(nans, Device::Cpu);
  EXPECT_EQ(all_nan.count, 0u);
  EXPECT_EQ(all_nan.nan, 100000u);
  EXPECT_EQ(all_nan.min, 0.0f);
  EXPECT_EQ(all_nan.max, 0.0f);
}

TEST(CalibKernels, HistogramMatchesReference) {
  for (size_t n : kSizes) {
    for (size_t bins : {size_t{1}, size_t{7}, size_t{2048}, size_t{4096}}) {
      const auto x = activations(n, static_cast<uint32_t>(n + bins), true);
      // A range below the data's maximum too, so that values beyond it land in the last bin.
      for (float range : {minmax(x, Device::Cpu).max, 2.0f}) {
        if (!(range > 0.0f)) continue;
        uint64_t ref_nan = 0;
        const auto ref = ref_histogram(x, range, bins, ref_nan);
        for (bool baseline : {false, true}) {  // AVX2 where the CPU has it, and SSE2
          cpu::use_baseline_lanes(baseline);
          std::vector<uint64_t> got(bins, 0);
          const uint64_t nan = histogram_abs(x, range, got, Device::Cpu);
          cpu::use_baseline_lanes(false);
          EXPECT_EQ(got, ref) << "n=" << n << " bins=" << bins << " range=" << range
                              << (baseline ? " (baseline)" : "");
          EXPECT_EQ(nan, ref_nan) << "n=" << n << " bins=" << bins;
        }
      }
    }
  }
}

TEST(CalibKernels, HistogramAccumulatesAndPlacesEdges) {
  std::vector<uint64_t> bins(4, 0);
  const std::vector<float> x = {0.0f, -0.0f, 0.99f, 1.0f, -2.5f, 4.0f, 9.0f, kInf, -kInf, kNaN};
  EXPECT_EQ(histogram_abs(x, 4.0f, bins, Device::Cpu), 1u);
  // 0, 0, 0.99 -> bin 0; 1 -> bin 1; 2.5 -> bin 2; 4 (the range), 9, +-inf -> the last bin.
  EXPECT_EQ(bins, (std::vector<uint64_t>{3, 1, 1, 4}));
  histogram_abs(x, 4.0f, bins, Device::Cpu);
  EXPECT_EQ(bins, (std::vector<uint64_t>{6, 2, 2, 8}));
}

TEST(CalibKernels, HistogramRejectsBadRanges) {
  std::vector<uint64_t> bins(8, 0);
  const std::vector<float> x = {1.0f};
  for (float range : {0.0f, -1.0f, kInf, kNaN, 1e-45f}) {
    EXPECT_THROW(histogram_abs(x, range, bins, Device::Cpu), Error) << range;
  }
  std::vector<uint64_t> none;
  EXPECT_THROW(histogram_abs(x, 1.0f, none, Device::Cpu), Error);
}

TEST(CalibKernels, ResultsDoNotDependOnThreadCount) {
  const auto x = activations(size_t{3} << 20, 11, true);
  ValueRange r1, r2;
  std::vector<uint64_t> h1(2048, 0), h2(2048, 0);
  {
    ThreadGuard one(1);
    r1 = minmax(x, Device::Cpu);
    histogram_abs(x, r1.max, h1, Device::Cpu);
  }
  {
    ThreadGuard two(2);
    r2 = minmax(x, Device::Cpu);
    histogram_abs(x, r2.max, h2, Device::Cpu);
  }
  EXPECT_EQ(std::bit_cast<uint32_t>(r1.min), std::bit_cast<uint32_t>(r2.min));
  EXPECT_EQ(std::bit_cast<uint32_t>(r1.max), std::bit_cast<uint32_t>(r2.max));
  EXPECT_EQ(r1.nan, r2.nan);
  EXPECT_EQ(h1, h2);
}

// Values in pieces (a padded batch's real rows where they lie) give what one call over the
// pieces laid end to end gives: the range (signed zeros and NaNs in different pieces) and the
// histogram, at 1 and 2 threads, with empty pieces and pieces across the 16384-value chunks.
TEST(CalibKernels, PiecesGiveWhatTheirConcatenationGives) {
  const auto x = activations(size_t{300000}, 21, true);
  std::vector<std::span<const float>> pieces;
  std::vector<float> joined;
  std::mt19937 rng(5);
  std::uniform_int_distribution<size_t> len(0, 40000);
  for (size_t at = 0; at < x.size();) {
    const size_t n = std::min(len(rng), x.size() - at);
    const std::span<const float> piece(x.data() + at, n);
    pieces.push_back(piece);
    joined.insert(joined.end(), piece.begin(), piece.end());
    at += n + 100;  // the 100 values between pieces are left out (padding)
  }
  ASSERT_GT(pieces.size(), 10u);
  const std::vector<float> signs = {-0.0f, kNaN, 0.0f};  // the zeros' order across pieces
  for (const float& v : signs) {
    pieces.emplace_back(&v, 1);
    joined.push_back(v);
  }
  for (const int threads : {1, 2}) {
    ThreadGuard guard(threads);
    const ValueRange want = minmax(joined, Device::Cpu);
    const ValueRange got = minmax(std::span<const std::span<const float>>(pieces), Device::Cpu);
    EXPECT_EQ(std::bit_cast<uint32_t>(got.min), std::bit_cast<uint32_t>(want.min));
    EXPECT_EQ(std::bit_cast<uint32_t>(got.max), std::bit_cast<uint32_t>(want.max));
    EXPECT_EQ(got.count, want.count);
    EXPECT_EQ(got.nan, want.nan);
    std::vector<uint64_t> h_want(2048, 0), h_got(2048, 0);
    const uint64_t nan_want = histogram_abs_pow2(joined, -4, h_want, Device::Cpu);
    const uint64_t nan_got = histogram_abs_pow2(std::span<const std::span<const float>>(pieces),
                                                -4, h_got, Device::Cpu);
    EXPECT_EQ(h_got, h_want);
    EXPECT_EQ(nan_got, nan_want);
  }
  const std::vector<std::span<const float>> none = {{}, {}};
  const ValueRange empty = minmax(std::span<const std::span<const float>>(none), Device::Cpu);
  EXPECT_EQ(empty.count, 0u);
}

// minmax and the histogram in one read: what minmax and then histogram_abs_pow2 at
// max(floor, histogram_exponent(amax)) give, at 1, 2 and 3 threads, in pieces across chunks.
// The values grow from chunk to chunk (and one late chunk 10^5 times), so each task widens its
// bins on its way and the tasks meet at different widths; zeros-only chunks come first (counted
// before any width); NaNs, -0 and subnormals are in.
TEST(CalibKernels, RangeAndHistogramInOneReadEqualTheTwoCalls) {
  const auto base = activations(size_t{400000}, 31, true);
  std::vector<float> x(40000, 0.0f);  // zeros first: more than two chunks of them
  for (size_t i = 0; i < base.size(); ++i) {
    const float grow = 1.0f + static_cast<float>(i / 16384);
    x.push_back(base[i] * grow * (i == 300001 ? 1e5f : 1.0f));
  }
  std::vector<std::span<const float>> pieces;
  for (size_t at = 0; at < x.size(); at += 30011) {
    pieces.emplace_back(x.data() + at, std::min<size_t>(30011, x.size() - at));
  }
  const FloatPieces all(pieces);
  for (const int threads : {1, 2, 3}) {
    ThreadGuard guard(threads);
    const ValueRange want_range = minmax(x, Device::Cpu);
    const float amax = std::fmax(std::fabs(want_range.min), std::fabs(want_range.max));
    for (const int floor : {kNoExponent, -20, 30}) {
      for (const size_t nb : {size_t{128}, size_t{2048}}) {
        const int e = std::max(floor, histogram_exponent(amax, static_cast<int64_t>(nb)));
        std::vector<uint64_t> want(nb, 0), got(nb, 0);
        histogram_abs_pow2(x, e, want, Device::Cpu);
        const RangeHistogram r = range_histogram_abs_pow2(all, floor, got, Device::Cpu);
        const std::string what = std::to_string(threads) + " thread(s), floor " +
                                 std::to_string(floor) + ", " + std::to_string(nb) + " bins";
        EXPECT_EQ(std::bit_cast<uint32_t>(r.range.min), std::bit_cast<uint32_t>(want_range.min));
        EXPECT_EQ(std::bit_cast<uint32_t>(r.range.max), std::bit_cast<uint32_t>(want_range.max));
        EXPECT_EQ(r.range.count, want_range.count) << what;
        EXPECT_EQ(r.range.nan, want_range.nan) << what;
        EXPECT_TRUE(r.binned) << what;
        EXPECT_EQ(r.exponent, e) << what;
        EXPECT_EQ(got, want) << what;
      }
    }
  }
  // Nothing to bin: zeros (and NaNs) before any width, or an infinity; `bins` left alone.
  std::vector<float> zeros(70000, 0.0f);
  zeros[5] = -0.0f;
  zeros[90] = kNaN;
  std::vector<uint64_t> bins(256, 7);
  const RangeHistogram z = range_histogram_abs_pow2(
      FloatPieces(std::vector<std::span<const float>>{zeros}), kNoExponent, bins, Device::Cpu);
  EXPECT_FALSE(z.binned);
  EXPECT_EQ(z.range.count, 69999u);
  EXPECT_EQ(bins, std::vector<uint64_t>(256, 7));
  // The same zeros under a width: all in bin 0.
  std::vector<uint64_t> floored(256, 0);
  const RangeHistogram zf = range_histogram_abs_pow2(
      FloatPieces(std::vector<std::span<const float>>{zeros}), -3, floored, Device::Cpu);
  EXPECT_TRUE(zf.binned);
  EXPECT_EQ(zf.exponent, -3);
  EXPECT_EQ(floored[0], 69999u);
  std::vector<float> inf = x;
  inf[200000] = -kInf;
  for (const int threads : {1, 2}) {
    ThreadGuard guard(threads);
    std::vector<uint64_t> untouched(2048, 0);
    const RangeHistogram r = range_histogram_abs_pow2(
        FloatPieces(std::vector<std::span<const float>>{inf}), kNoExponent, untouched,
        Device::Cpu);
    EXPECT_FALSE(r.binned);
    EXPECT_EQ(r.range.min, -kInf);
  }
}

TEST(CalibKernels, CudaMatchesCpu) {
  QFORGE_NEEDS_CUDA_DEVICE("CUDA calibration kernels not compared");
  std::vector<size_t> sizes = kSizes;
  sizes.push_back((size_t{1} << 21) + 977);  // past one grid (2^20 threads): grid-stride passes
  for (size_t n : sizes) {
    const auto x = activations(n, static_cast<uint32_t>(3 * n), true);
    const ValueRange c = minmax(x, Device::Cpu);
    const ValueRange g = minmax(x, Device::Cuda);
    EXPECT_EQ(std::bit_cast<uint32_t>(g.min), std::bit_cast<uint32_t>(c.min)) << n;
    EXPECT_EQ(std::bit_cast<uint32_t>(g.max), std::bit_cast<uint32_t>(c.max)) << n;
    EXPECT_EQ(g.nan, c.nan) << n;
    for (size_t bins : {size_t{2048}, size_t{20000}}) {  // shared-memory and global kernels
      std::vector<uint64_t> hc(bins, 5), hg(bins, 5);
      EXPECT_EQ(histogram_abs(x, 3.0f, hg, Device::Cuda), histogram_abs(x, 3.0f, hc, Device::Cpu));
      EXPECT_EQ(hg, hc) << "n=" << n << " bins=" << bins;
    }
  }
}
