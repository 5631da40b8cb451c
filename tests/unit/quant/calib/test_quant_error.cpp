#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "ir/error.h"
#include "kernels/device.h"
#include "quant/calib/quant_error.h"

using namespace qforge;

TEST(QuantError, KnownValues) {
  const std::vector<float> original{3.0f, -4.0f, 0.0f};
  const std::vector<float> dequantized{3.0f, -3.5f, 0.25f};
  const QuantError e = measure_quant_error(original, dequantized);
  EXPECT_DOUBLE_EQ(e.max_abs, 0.5);
  EXPECT_NEAR(e.sqnr_db, 10.0 * std::log10(25.0 / (0.25 + 0.0625)), 1e-12);
}

TEST(QuantError, ExactReconstructionIsPlusInfinity) {
  const std::vector<float> v{1.0f, 0.0f, -2.0f};
  const QuantError e = measure_quant_error(v, v);
  EXPECT_EQ(e.max_abs, 0.0);
  EXPECT_EQ(e.sqnr_db, std::numeric_limits<double>::infinity());
  EXPECT_EQ(sqnr_text(e.sqnr_db), "exact");
}

TEST(QuantError, SameResultForAnyThreadCount) {
  std::mt19937 rng(5);
  std::normal_distribution<float> dist;
  std::vector<float> a(300001), b(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = dist(rng);
    b[i] = a[i] + 0.01f * dist(rng);
  }
  set_cpu_threads(1);
  const QuantError one = measure_quant_error(a, b);
  set_cpu_threads(2);
  const QuantError two = measure_quant_error(a, b);
  set_cpu_threads(0);
  EXPECT_EQ(one.max_abs, two.max_abs);
  EXPECT_EQ(one.sqnr_db, two.sqnr_db) << "bitwise equal, not just close";
}

TEST(QuantError, MismatchedSizesAreInternal) {
  const std::vector<float> a(3), b(4);
  try {
    measure_quant_error(a, b);
    FAIL() << "accepted 3 values against 4";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::Internal);
  }
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

ErrorSums sums_of(const std::vector<float>& original, const std::vector<float>& approx) {
  ErrorSums s;
  s.add(original, approx);
  return s;
}

}  // namespace

TEST(ErrorSums, IdenticalTensorsAreExactZerosIncluded) {
  for (const std::vector<float>& v :
       {std::vector<float>{1.0f, -2.0f}, std::vector<float>(5, 0.0f)}) {
    const ErrorSums s = sums_of(v, v);
    EXPECT_TRUE(s.exact());
    EXPECT_EQ(s.sqnr_db(), kInf);
    EXPECT_EQ(s.cosine(), 1.0);
    EXPECT_EQ(s.max_abs, 0.0);
  }
}

TEST(ErrorSums, ZeroOriginalWithNonZeroApproximationIsMinusInfinity) {
  const ErrorSums s = sums_of({0.0f, 0.0f, 0.0f}, {0.0f, 0.5f, 0.0f});
  EXPECT_FALSE(s.exact());
  EXPECT_EQ(s.sqnr_db(), -kInf);
  EXPECT_EQ(s.cosine(), 0.0);
  EXPECT_EQ(s.max_abs, 0.5);
}

TEST(ErrorSums, SameNonFiniteValuesAgreeAndCountNowhere) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  // An additive mask both models carry: -inf, NaN at the same places, finite values elsewhere.
  const ErrorSums s = sums_of({-inf, nan, inf, 3.0f, 4.0f}, {-inf, nan, inf, 3.0f, 3.0f});
  EXPECT_EQ(s.nonfinite_mismatches, 0);
  EXPECT_DOUBLE_EQ(s.sqnr_db(), 10.0 * std::log10(25.0 / 1.0));
  EXPECT_FALSE(std::isnan(s.cosine()));
  EXPECT_EQ(s.max_abs, 1.0);
  const ErrorSums same = sums_of({-inf, nan, 2.0f}, {-inf, nan, 2.0f});
  EXPECT_TRUE(same.exact());
  EXPECT_EQ(same.sqnr_db(), kInf);
}

TEST(ErrorSums, NonFiniteMismatchIsTheWorstAndNeverNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<std::pair<float, float>> pairs = {{1.0f, inf}, {inf, 1.0f}, {-inf, inf},
                                                      {nan, 1.0f}, {1.0f, nan}, {inf, nan}};
  for (const auto& [x, y] : pairs) {
    const ErrorSums s = sums_of({2.0f, x}, {2.0f, y});
    EXPECT_EQ(s.nonfinite_mismatches, 1) << x << " vs " << y;
    EXPECT_EQ(s.sqnr_db(), -kInf) << x << " vs " << y;
    EXPECT_EQ(s.cosine(), 0.0) << x << " vs " << y;
    EXPECT_EQ(s.max_abs, kInf) << x << " vs " << y;
  }
}

TEST(ErrorSums, MergeEqualsOneRun) {
  const std::vector<float> a{1.0f, 2.0f, 3.0f, 4.0f}, b{1.5f, 2.0f, 2.0f, 4.0f};
  ErrorSums halves = sums_of({a[0], a[1]}, {b[0], b[1]});
  halves.merge(sums_of({a[2], a[3]}, {b[2], b[3]}));
  const ErrorSums whole = sums_of(a, b);
  EXPECT_EQ(halves.sqnr_db(), whole.sqnr_db());
  EXPECT_EQ(halves.cosine(), whole.cosine());
  EXPECT_EQ(halves.max_abs, whole.max_abs);
}

TEST(RanksWorse, SortsWorstFirstWithExactLastWhateverTheStartingOrder) {
  const std::vector<LayerErrorRow> want = {
      {"mismatch_a", -kInf, 0.0}, {"mismatch_b", -kInf, 0.0}, {"low", 3.8, 0.9},
      {"tie_low_cos", 9.6, 0.5},  {"tie_high_cos", 9.6, 0.7}, {"high", 40.0, 0.999},
      {"exact_a", kInf, 1.0},     {"exact_b", kInf, 1.0}};
  std::vector<LayerErrorRow> rows = want;
  std::mt19937 rng(3);
  for (int round = 0; round < 20; ++round) {
    std::shuffle(rows.begin(), rows.end(), rng);
    std::sort(rows.begin(), rows.end(), ranks_worse);
    for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(rows[i].name, want[i].name) << i;
  }
}

TEST(RanksWorse, NaNRanksAsTheWorstKeepingTheOrderStrict) {
  const LayerErrorRow nan_row{"n", std::numeric_limits<double>::quiet_NaN(), 1.0};
  const LayerErrorRow low{"l", 1.0, 1.0};
  EXPECT_TRUE(ranks_worse(nan_row, low));
  EXPECT_FALSE(ranks_worse(low, nan_row));
  EXPECT_FALSE(ranks_worse(nan_row, nan_row));
}

TEST(SqnrText, EachKind) {
  EXPECT_EQ(sqnr_text(kInf), "exact");
  EXPECT_EQ(sqnr_text(-kInf), "-inf dB");
  EXPECT_EQ(sqnr_text(31.54), "31.5 dB");
}
