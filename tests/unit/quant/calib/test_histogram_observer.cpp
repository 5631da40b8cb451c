// HistogramObserver (quant/calib/observer.h): one pass of power-of-two bins that widen as larger
// values arrive gives the histogram one call over all values would at the final width, whatever
// the batches and their order; and the edges a one-pass histogram meets (zeros first, NaNs,
// infinities, -FLT_MAX attention masks, subnormal ranges).
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

#include "kernels/calib.h"
#include "quant/calib/observer.h"

using namespace qforge;

namespace {

constexpr float kFltMax = std::numeric_limits<float>::max();

// Observes `x` cut into batches of the given sizes (cycled), in that order: with each batch's
// range measured first, or (`one_read`) measured by the observer in the same read as its bins,
// which must return that same range.
HistogramObserver::Histogram observe_in_batches(const std::vector<float>& x,
                                                const std::vector<size_t>& sizes, int64_t bins,
                                                bool one_read = false) {
  HistogramObserver obs(bins, Device::Cpu);
  size_t at = 0;
  for (size_t k = 0; at < x.size(); ++k) {
    const size_t n = std::min(sizes[k % sizes.size()], x.size() - at);
    const std::span<const float> batch(x.data() + at, n);
    const ValueRange want = minmax(batch, Device::Cpu);
    if (one_read) {
      const std::span<const float> one[] = {batch};
      const ValueRange got = obs.observe("t", FloatPieces(one));
      EXPECT_EQ(std::bit_cast<uint32_t>(got.min), std::bit_cast<uint32_t>(want.min));
      EXPECT_EQ(std::bit_cast<uint32_t>(got.max), std::bit_cast<uint32_t>(want.max));
      EXPECT_EQ(got.count, want.count);
      EXPECT_EQ(got.nan, want.nan);
    } else {
      obs.observe("t", batch, want);
    }
    at += n;
  }
  const auto h = obs.histogram("t");
  EXPECT_TRUE(h.has_value());
  return h.value_or(HistogramObserver::Histogram{});
}

// The histogram one call over every value gives at the width the amax of all of them needs.
HistogramObserver::Histogram one_call(const std::vector<float>& x, int64_t bins) {
  const ValueRange r = minmax(x, Device::Cpu);
  const float amax = std::fmax(std::fabs(r.min), std::fabs(r.max));
  const int e = histogram_exponent(amax, bins);
  std::vector<uint64_t> counts(static_cast<size_t>(bins), 0);
  histogram_abs_pow2(x, e, counts, Device::Cpu);
  size_t used = counts.size();
  while (used > 0 && counts[used - 1] == 0) --used;
  used = std::max(used, std::min(counts.size(), size_t{256}));
  counts.resize(used);
  return {counts, std::ldexp(static_cast<double>(used), e)};
}

}  // namespace

TEST(HistogramObserver, ExponentIsTheLeastPowerOfTwoThatHoldsAmax) {
  EXPECT_EQ(histogram_exponent(20.0f, 2048), -6);   // 2048 / 64 = 32 > 20 >= 16
  EXPECT_EQ(histogram_exponent(1.0f, 2048), -10);   // 2048 / 2048 = 1 is not above 1
  EXPECT_EQ(histogram_exponent(0.99f, 2048), -11);
  EXPECT_EQ(histogram_exponent(1000.0f, 1000), 1);  // 1000 x 1 = 1000 is not above 1000
  EXPECT_EQ(histogram_exponent(kFltMax, 2048), 117);  // 2048 x 2^117 = 2^128 > FLT_MAX
  EXPECT_EQ(histogram_exponent(1e-40f, 2048), -127);  // floored where 2^-e stays a float
  EXPECT_EQ(histogram_exponent(0.0f, 2048), -127);
  for (const float amax : {3e-30f, 0.37f, 1.0f, 2.5f, 7e20f}) {
    for (const int64_t bins : {128, 1000, 2048, 4096}) {
      const int e = histogram_exponent(amax, bins);
      EXPECT_GT(std::ldexp(static_cast<double>(bins), e), amax) << amax << " " << bins;
      EXPECT_LE(std::ldexp(static_cast<double>(bins), e - 1), amax) << amax << " " << bins;
    }
  }
}

// Batches whose ranges grow by factors of 2 to 10^4 (so the bins widen several times, by one or
// many powers of two at once), cut three ways and in two orders: every result is the one-call
// histogram, count for count.
TEST(HistogramObserver, OnePassEqualsOneCallOverAllValuesInAnyBatchesAndOrder) {
  std::mt19937 rng(3);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  std::vector<float> x;
  for (const float scale : {0.01f, 0.03f, 1.0f, 1.5f, 300.0f, 0.2f, 4000.0f}) {
    for (int i = 0; i < 5000; ++i) x.push_back(scale * gauss(rng));
  }
  x.insert(x.begin() + 100, {0.0f, -0.0f, std::nanf("")});
  std::vector<float> reversed(x.rbegin(), x.rend());
  for (const int64_t bins : {256, 1000, 2048}) {
    const HistogramObserver::Histogram want = one_call(x, bins);
    EXPECT_GT(want.counts.size(), static_cast<size_t>(bins / 2));
    for (const auto& sizes : std::vector<std::vector<size_t>>{{1000}, {7, 4999, 13}, {40000}}) {
      for (const auto* data : {&x, &reversed}) {
        for (const bool one_read : {false, true}) {
          const HistogramObserver::Histogram got =
              observe_in_batches(*data, sizes, bins, one_read);
          EXPECT_EQ(got.counts, want.counts)
              << bins << " bins, first batch " << sizes[0] << (one_read ? ", one read" : "");
          EXPECT_EQ(got.range, want.range) << bins << " bins";
        }
      }
    }
  }
}

// Batches of zeros before the first non-zero value: counted in bin 0 of whatever width comes.
// A tensor of nothing but zeros (or NaNs) keeps no histogram.
TEST(HistogramObserver, ZerosBeforeTheFirstValueAndAllZeroTensors) {
  const std::vector<float> x = {0.0f, 0.0f, -0.0f, 0.0f, 3.0f, -1.0f, 0.0f, 0.25f};
  for (const bool one_read : {false, true}) {
    const HistogramObserver::Histogram got = observe_in_batches(x, {2}, 2048, one_read);
    EXPECT_EQ(got.counts, one_call(x, 2048).counts);
    EXPECT_EQ(got.counts[0], 5u);
  }
  HistogramObserver obs(2048, Device::Cpu);
  const std::vector<float> zeros(10, 0.0f);
  const std::vector<float> nans(3, std::nanf(""));
  obs.observe("zeros", zeros, minmax(zeros, Device::Cpu));
  obs.observe("nans", nans, minmax(nans, Device::Cpu));
  const std::span<const float> zeros_piece[] = {zeros};
  const std::span<const float> nans_piece[] = {nans};
  EXPECT_EQ(obs.observe("zeros 1", FloatPieces(zeros_piece)).count, 10u);
  EXPECT_EQ(obs.observe("nans 1", FloatPieces(nans_piece)).nan, 3u);
  EXPECT_FALSE(obs.histogram("zeros").has_value());
  EXPECT_FALSE(obs.histogram("nans").has_value());
  EXPECT_FALSE(obs.histogram("zeros 1").has_value());
  EXPECT_FALSE(obs.histogram("nans 1").has_value());
  EXPECT_FALSE(obs.histogram("never seen").has_value());
}

// A value of +-inf drops the tensor's histogram for good (calibrate leaves it out of the table);
// -FLT_MAX, the additive mask value transformers fills attention scores with, does not: its top
// edge, 2^128, is past FLT_MAX, so it is kept in double.
TEST(HistogramObserver, InfinityDropsTheTensorAndFltMaxMasksAreCounted) {
  HistogramObserver obs(2048, Device::Cpu);
  const std::vector<float> a = {1.0f, 2.0f};
  const std::vector<float> inf = {-std::numeric_limits<float>::infinity(), 1.0f};
  obs.observe("x", a, minmax(a, Device::Cpu));
  obs.observe("x", inf, minmax(inf, Device::Cpu));
  obs.observe("x", a, minmax(a, Device::Cpu));
  EXPECT_FALSE(obs.histogram("x").has_value());
  const std::span<const float> a_piece[] = {a};
  const std::span<const float> inf_piece[] = {inf};
  obs.observe("y", FloatPieces(a_piece));
  EXPECT_TRUE(obs.histogram("y").has_value());
  EXPECT_EQ(obs.observe("y", FloatPieces(inf_piece)).min,
            -std::numeric_limits<float>::infinity());
  EXPECT_EQ(obs.observe("y", FloatPieces(a_piece)).max, 2.0f);  // the range, without bins
  EXPECT_FALSE(obs.histogram("y").has_value());

  const std::vector<float> masked = {0.5f, -kFltMax, 3.0f, -kFltMax, -1.0f};
  const HistogramObserver::Histogram got = observe_in_batches(masked, {2}, 2048);
  EXPECT_EQ(observe_in_batches(masked, {2}, 2048, true).counts, got.counts);
  EXPECT_EQ(got.range, std::ldexp(static_cast<double>(got.counts.size()), 117));
  EXPECT_EQ(got.counts.back(), 2u);  // the two masks, in the top bin
  EXPECT_EQ(got.counts.front(), 3u);  // 0.5, 3 and 1 are far below one bin of 2^117
  EXPECT_GT(got.range, static_cast<double>(kFltMax));
}

// A tensor whose values are all subnormal: the bins stop widening downwards at 2^-127 and every
// value lands in bin 0 of a histogram long enough for the threshold searches.
TEST(HistogramObserver, SubnormalRangesKeepASearchableHistogram) {
  const std::vector<float> tiny = {1e-40f, -3e-41f, 0.0f};
  const HistogramObserver::Histogram got = observe_in_batches(tiny, {1}, 2048);
  EXPECT_EQ(observe_in_batches(tiny, {1}, 2048, true).counts, got.counts);
  ASSERT_EQ(got.counts.size(), 256u);
  EXPECT_EQ(got.counts[0], 3u);
  EXPECT_EQ(got.range, std::ldexp(256.0, -127));
}
