// Threshold searches of kernels/calib.h (entropy, MSE, percentile) and the shared arithmetic of
// kernels/calib_math.h, against textbook references written independently here.
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
#include "kernels/calib_math.h"
#include "kernels/cpu/calib_cpu.h"
#include "kernels/device.h"
#include "tests/unit/cuda_test.h"

using namespace qforge;

namespace {

constexpr double kInfD = std::numeric_limits<double>::infinity();

// KL(P || Q) exactly as kernels/calib.h states it, in the plainest form (pytorch-quantization's
// _compute_amax_entropy, loop by loop): bin 0 taken as bin 1, std::log, sums in bin order, +inf
// where some P_j > 0 has Q_j = 0.
std::vector<double> ref_entropy_scores(std::vector<uint64_t> h, int levels) {
  if (h.size() >= 2) h[0] = h[1];
  const auto n = static_cast<int64_t>(h.size());
  std::vector<double> out;
  for (int64_t i = levels; i <= n; ++i) {
    std::vector<double> p(h.begin(), h.begin() + i);
    double outliers = 0;
    for (int64_t j = i; j < n; ++j) outliers += static_cast<double>(h[j]);
    p[i - 1] += outliers;
    std::vector<double> level_sum(levels, 0.0), level_nonzero(levels, 0.0);
    for (int64_t j = 0; j < i; ++j) {
      level_sum[j * levels / i] += static_cast<double>(h[j]);
      if (h[j] > 0) level_nonzero[j * levels / i] += 1;
    }
    std::vector<double> q(i, 0.0);
    for (int64_t j = 0; j < i; ++j) {
      const int64_t l = j * levels / i;
      if (h[j] > 0) q[j] = level_sum[l] / level_nonzero[l];
    }
    double p_sum = 0, q_sum = 0;
    for (int64_t j = 0; j < i; ++j) {
      p_sum += p[j];
      q_sum += q[j];
    }
    double kl = q_sum > 0 ? 0.0 : kInfD;
    for (int64_t j = 0; j < i && q_sum > 0; ++j) {
      if (p[j] == 0) continue;
      kl = q[j] == 0 ? kInfD : kl + p[j] / p_sum * std::log((p[j] / p_sum) / (q[j] / q_sum));
    }
    out.push_back(kl);
  }
  return out;
}

// Mean squared error per value, values uniform in their bin, integrated piece by piece between
// every rounding edge and the clip point (a different decomposition from the kernel's).
std::vector<double> ref_mse_scores(const std::vector<uint64_t>& h, int quant_max) {
  const auto n = static_cast<int64_t>(h.size());
  double total = 0;
  for (uint64_t v : h) total += static_cast<double>(v);
  std::vector<double> out;
  for (int64_t i = quant_max + 1; i <= n; ++i) {
    const double t = static_cast<double>(i);
    const double step = t / quant_max;
    auto quantized = [&](double x) {
      return x >= t ? t : std::min(std::round(x / step), static_cast<double>(quant_max)) * step;
    };
    double err = 0;
    for (int64_t j = 0; j < n; ++j) {
      if (h[j] == 0) continue;
      std::vector<double> cuts = {static_cast<double>(j), static_cast<double>(j + 1)};
      for (int k = 0; k <= quant_max; ++k) cuts.push_back((k + 0.5) * step);
      cuts.push_back(t);
      std::sort(cuts.begin(), cuts.end());
      double e = 0;
      for (size_t c = 0; c + 1 < cuts.size(); ++c) {
        const double lo = std::max(cuts[c], static_cast<double>(j));
        const double hi = std::min(cuts[c + 1], static_cast<double>(j + 1));
        if (!(hi > lo)) continue;
        const double q = quantized((lo + hi) / 2);
        e += (std::pow(hi - q, 3) - std::pow(lo - q, 3)) / 3;
      }
      err += static_cast<double>(h[j]) * e;
    }
    out.push_back(err / total);
  }
  return out;
}

// |N(0, sigma)| in `bins` bins over [0, range], with `outliers` values at the top.
std::vector<uint64_t> gaussian_histogram(int64_t bins, double sigma, double range, uint64_t count,
                                         uint64_t outliers, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> gauss(0.0, sigma);
  std::vector<uint64_t> h(static_cast<size_t>(bins), 0);
  for (uint64_t k = 0; k < count; ++k) {
    const double b = std::fabs(gauss(rng)) / range * static_cast<double>(bins);
    h[static_cast<size_t>(std::min<double>(b, static_cast<double>(bins - 1)))] += 1;
  }
  h.back() += outliers;
  return h;
}

void expect_scores_near(const std::vector<double>& got, const std::vector<double>& ref, double rel,
                        const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  for (size_t k = 0; k < got.size(); ++k) {
    if (std::isinf(ref[k])) {
      EXPECT_TRUE(std::isinf(got[k])) << what << " candidate " << k;
      continue;
    }
    EXPECT_NEAR(got[k], ref[k], rel * std::max(1e-12, std::fabs(ref[k])))
        << what << " candidate " << k;
  }
}

double least(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

}  // namespace

TEST(CalibMath, DetLogMatchesStdLog) {
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> exponent(-300.0, 300.0);
  for (int k = 0; k < 200000; ++k) {
    const double x = std::pow(10.0, exponent(rng));
    const double want = std::log(x);
    EXPECT_NEAR(calib_math::det_log(x), want, 4.5e-16 * std::fabs(want) + 1e-300) << x;
  }
  for (double x : {1.0, 2.0, 0.5, 1.4142135623730951, 1.4142135623730954, 1e-310, 5e-324,
                   std::numeric_limits<double>::max()}) {
    const double want = std::log(x);
    EXPECT_NEAR(calib_math::det_log(x), want, 4.5e-16 * std::fabs(want)) << x;
  }
  EXPECT_EQ(calib_math::det_log(1.0), 0.0);
}

TEST(CalibSearch, EntropyScoresMatchReference) {
  const std::vector<std::vector<uint64_t>> cases = {
      gaussian_histogram(2048, 1.0, 8.0, 200000, 0, 1),
      gaussian_histogram(2048, 1.0, 30.0, 100000, 7, 2),  // far outliers, a gap before them
      gaussian_histogram(512, 2.0, 6.0, 5000, 0, 3),
      gaussian_histogram(300, 1.0, 4.0, 999, 1, 4),  // bins not a multiple of the levels
  };
  for (size_t c = 0; c < cases.size(); ++c) {
    const auto got = entropy_scores(cases[c], 128, Device::Cpu);
    const auto ref = ref_entropy_scores(cases[c], 128);
    expect_scores_near(got, ref, 1e-9, "case " + std::to_string(c));
    const ThresholdChoice choice = entropy_threshold(cases[c], 128, Device::Cpu);
    EXPECT_NEAR(ref[static_cast<size_t>(choice.kept - 128)], least(ref), 1e-12 * least(ref) + 1e-15)
        << "case " << c << " picked " << choice.kept;
  }
}

// Five bins, two levels, worked by hand. hist = {5, 1, 0, 2, 1}; bin 0 counts as bin 1, so the
// searched histogram is {1, 1, 0, 2, 1}, 5 values.
//   i = 2: P = {1, 1 + 3} / 5; levels {0, 1}: Q = {1, 1} / 2.
//          KL = 1/5 ln(2/5) + 4/5 ln(8/5).
//   i = 3: the 3 outliers fold onto bin 2, which is empty in the histogram: Q_2 = 0 < P_2, +inf.
//   i = 4: P = {1, 1, 0, 2 + 1} / 5; levels {0, 0, 1, 1}: Q = {1, 1, 0, 2} / 4 (level 1 spread
//          over its one non-empty bin). KL = 2/5 ln(4/5) + 3/5 ln(6/5).
//   i = 5: P = {1, 1, 0, 2, 1} / 5; levels {0, 0, 0, 1, 1}: Q = {1, 1, 0, 3/2, 3/2} / 5.
//          KL = 2/5 ln(4/3) + 1/5 ln(2/3).
TEST(CalibSearch, EntropyHandWorkedExample) {
  const std::vector<uint64_t> h = {5, 1, 0, 2, 1};
  const auto scores = entropy_scores(h, 2, Device::Cpu);
  ASSERT_EQ(scores.size(), 4u);
  EXPECT_NEAR(scores[0], 0.2 * std::log(0.4) + 0.8 * std::log(1.6), 1e-15);
  EXPECT_EQ(scores[1], kInfD);
  EXPECT_NEAR(scores[2], 0.4 * std::log(0.8) + 0.6 * std::log(1.2), 1e-15);
  EXPECT_NEAR(scores[3], 0.4 * std::log(4.0 / 3.0) + 0.2 * std::log(2.0 / 3.0), 1e-15);
  EXPECT_EQ(entropy_threshold(h, 2, Device::Cpu).kept, 4);  // 0.0201 < 0.0340 < 0.1927
}

// Attention probabilities (a softmax over mostly masked or negligible scores): nearly every
// value in bin 0, the rest thinning out towards 1. Taken as it is, bin 0 outweighs the rest of
// P and the search clips as hard as it can, at 128 bins of 2048 (layer 0 of MiniLM: 0.31 where
// the probabilities reach 1). TensorRT's reference counts bin 0 as bin 1 and keeps the tail.
TEST(CalibSearch, EntropyZeroBinDoesNotDriveTheThreshold) {
  std::vector<uint64_t> h(2048);
  for (size_t j = 0; j < h.size(); ++j) h[j] = 20000 / (j + 1);
  h[0] = 2000000;
  EXPECT_GT(entropy_threshold(h, 128, Device::Cpu).kept, 1900);
  // The same histogram with bin 0 already at bin 1's count scores identically.
  std::vector<uint64_t> flat = h;
  flat[0] = flat[1];
  EXPECT_EQ(entropy_scores(h, 128, Device::Cpu), entropy_scores(flat, 128, Device::Cpu));
  // Every value in bin 0: nothing to compare, everything kept.
  std::vector<uint64_t> zeros(2048, 0);
  zeros[0] = 100;
  EXPECT_EQ(entropy_threshold(zeros, 128, Device::Cpu).kept, 2048);
}

TEST(CalibSearch, EntropyKeepsEverythingWithoutOutliersAndClipsFarOnes) {
  std::vector<uint64_t> uniform(2048, 10);
  EXPECT_EQ(entropy_threshold(uniform, 128, Device::Cpu).kept, 2048);
  EXPECT_EQ(entropy_threshold(uniform, 128, Device::Cpu).score, 0.0);
  // A constant tensor: every value in the top bin.
  std::vector<uint64_t> constant(2048, 0);
  constant.back() = 1000;
  EXPECT_EQ(entropy_threshold(constant, 128, Device::Cpu).kept, 2048);
  // Gaussian with sigma 1 over [0, 40] and five values at 40: the Gaussian ends near 5 sigma,
  // bin 256; the threshold sits there, far below the outliers.
  const auto h = gaussian_histogram(2048, 1.0, 40.0, 1000000, 5, 9);
  const int64_t kept = entropy_threshold(h, 128, Device::Cpu).kept;
  EXPECT_GT(kept, 128);
  EXPECT_LT(kept, 400);
}

TEST(CalibSearch, MseScoresMatchReference) {
  const std::vector<std::vector<uint64_t>> cases = {
      gaussian_histogram(1024, 1.0, 8.0, 50000, 3, 5),
      gaussian_histogram(200, 1.0, 3.0, 1000, 0, 6),
  };
  for (size_t c = 0; c < cases.size(); ++c) {
    const auto got = mse_scores(cases[c], 127, Device::Cpu);
    const auto ref = ref_mse_scores(cases[c], 127);
    expect_scores_near(got, ref, 1e-9, "case " + std::to_string(c));
    const ThresholdChoice choice = mse_threshold(cases[c], 127, Device::Cpu);
    EXPECT_NEAR(ref[static_cast<size_t>(choice.kept - 128)], least(ref), 1e-12 * least(ref));
  }
}

TEST(CalibSearch, MseBalancesRoundingAgainstClipping) {
  // Uniform data over [0, N): rounding costs (t / 127)^2 / 12 * t / N and clipping
  // (N - t)^3 / (3 N); their derivatives balance at t = N / (1 + 1 / 254) = 2039.97 bins.
  std::vector<uint64_t> uniform(2048, 3);
  EXPECT_EQ(mse_threshold(uniform, 127, Device::Cpu).kept, 2040);
  // One far outlier among a million Gaussian values is not worth a 10x coarser step.
  const auto h = gaussian_histogram(2048, 1.0, 40.0, 1000000, 1, 10);
  EXPECT_LT(mse_threshold(h, 127, Device::Cpu).kept, 400);
}

TEST(CalibSearch, PercentileInterpolatesInsideTheBin) {
  const std::vector<uint64_t> h = {0, 10, 0, 10};
  EXPECT_DOUBLE_EQ(percentile_threshold(h, 25.0), 1.5);
  EXPECT_DOUBLE_EQ(percentile_threshold(h, 50.0), 2.0);
  EXPECT_DOUBLE_EQ(percentile_threshold(h, 75.0), 3.5);
  EXPECT_DOUBLE_EQ(percentile_threshold(h, 100.0), 4.0);
  EXPECT_DOUBLE_EQ(percentile_threshold(std::vector<uint64_t>{0, 0, 5, 0}, 100.0), 3.0);
  EXPECT_DOUBLE_EQ(percentile_threshold(std::vector<uint64_t>(8, 0), 99.0), 0.0);
  EXPECT_THROW(percentile_threshold(h, 0.0), Error);
  EXPECT_THROW(percentile_threshold(h, 100.5), Error);
}

TEST(CalibSearch, RejectsHistogramsOutsideTheContract) {
  const std::vector<uint64_t> empty(2048, 0);
  EXPECT_THROW(entropy_threshold(empty, 128, Device::Cpu), Error);
  EXPECT_THROW(mse_threshold(empty, 127, Device::Cpu), Error);
  const std::vector<uint64_t> narrow(100, 1);
  EXPECT_THROW(entropy_threshold(narrow, 128, Device::Cpu), Error);
  EXPECT_THROW(mse_threshold(narrow, 127, Device::Cpu), Error);
  const std::vector<uint64_t> wide(8192, 1);
  EXPECT_THROW(entropy_threshold(wide, 128, Device::Cpu), Error);
}

TEST(CalibSearch, ScoresDoNotDependOnThreadCount) {
  const auto h = gaussian_histogram(2048, 1.0, 12.0, 300000, 4, 12);
  set_cpu_threads(1);
  const auto e1 = entropy_scores(h, 128, Device::Cpu);
  const auto m1 = mse_scores(h, 127, Device::Cpu);
  set_cpu_threads(2);
  const auto e2 = entropy_scores(h, 128, Device::Cpu);
  const auto m2 = mse_scores(h, 127, Device::Cpu);
  set_cpu_threads(0);
  EXPECT_EQ(e1, e2);
  EXPECT_EQ(m1, m2);
}

TEST(CalibSearch, CudaScoresEqualCpuBitForBit) {
  QFORGE_NEEDS_CUDA_DEVICE("CUDA threshold searches not compared");
  for (uint32_t seed : {1u, 2u, 3u}) {
    const auto h = gaussian_histogram(2048, 1.0, 10.0 * seed, 100000 * seed, seed, seed);
    const auto ec = entropy_scores(h, 128, Device::Cpu);
    const auto eg = entropy_scores(h, 128, Device::Cuda);
    ASSERT_EQ(ec.size(), eg.size());
    for (size_t k = 0; k < ec.size(); ++k) {
      EXPECT_EQ(std::bit_cast<uint64_t>(eg[k]), std::bit_cast<uint64_t>(ec[k]))
          << "entropy seed " << seed << " candidate " << k;
    }
    EXPECT_EQ(mse_scores(h, 127, Device::Cuda), mse_scores(h, 127, Device::Cpu)) << seed;
    EXPECT_EQ(entropy_threshold(h, 128, Device::Cuda).kept,
              entropy_threshold(h, 128, Device::Cpu).kept);
  }
  // A heavy bin 0 (taken as bin 1) and empty bins under folded outliers (+inf candidates).
  std::vector<uint64_t> h(2048);
  for (size_t j = 0; j < h.size(); j += 3) h[j] = 20000 / (j + 1);
  h[0] = 2000000;
  h[1] = 7;
  const auto ec = entropy_scores(h, 128, Device::Cpu);
  const auto eg = entropy_scores(h, 128, Device::Cuda);
  ASSERT_EQ(ec.size(), eg.size());
  for (size_t k = 0; k < ec.size(); ++k) {
    EXPECT_EQ(std::bit_cast<uint64_t>(eg[k]), std::bit_cast<uint64_t>(ec[k])) << "candidate " << k;
  }
}

namespace {

// The searches as the CUDA kernels compute them (one block per candidate, lane t adding bins
// t, t + kLanes, ... in turn, calib_math's operations, the lane tree): a plain twin here, with no
// shortcut, that the CPU kernels' precomputed terms and tables must equal bit for bit.
std::vector<double> twin_entropy_scores(std::vector<uint64_t> h, int levels) {
  namespace cm = calib_math;
  if (h.size() >= 2) h[0] = h[1];
  const auto nb = static_cast<int64_t>(h.size());
  uint64_t total = 0;
  for (uint64_t v : h) total += v;
  std::vector<double> out;
  std::vector<double> lanes(cm::kLanes);
  for (int64_t kept = levels; kept <= nb; ++kept) {
    uint64_t outliers = 0;
    for (int64_t j = kept; j < nb; ++j) outliers += h[size_t(j)];
    std::vector<uint64_t> sum(size_t(levels), 0);
    std::vector<int64_t> nonzero(size_t(levels), 0);
    for (int64_t j = 0; j < kept; ++j) {
      sum[size_t(j * levels / kept)] += h[size_t(j)];
      nonzero[size_t(j * levels / kept)] += h[size_t(j)] > 0 ? 1 : 0;
    }
    const cm::EntropyCandidate c = cm::entropy_candidate(total, outliers, h[size_t(kept - 1)]);
    if (total == 0 || c.infinite) {
      out.push_back(kInfD);
      continue;
    }
    for (int t = 0; t < cm::kLanes; ++t) {
      double acc = 0.0;
      for (int64_t j = t; j < kept; j += cm::kLanes) {
        const uint64_t p = h[size_t(j)] + (j == kept - 1 ? outliers : 0);
        if (p == 0) continue;
        const int64_t l = j * levels / kept;
        const double q = cm::div(double(sum[size_t(l)]), double(nonzero[size_t(l)]));
        acc = cm::add(acc, cm::entropy_term(double(p), q, c));
      }
      lanes[size_t(t)] = acc;
    }
    out.push_back(cm::lane_tree_sum(lanes.data()));
  }
  return out;
}

std::vector<double> twin_mse_scores(const std::vector<uint64_t>& h, int quant_max) {
  namespace cm = calib_math;
  const auto nb = static_cast<int64_t>(h.size());
  uint64_t total = 0;
  for (uint64_t v : h) total += v;
  std::vector<double> out;
  std::vector<double> lanes(cm::kLanes);
  for (int64_t kept = quant_max + 1; kept <= nb; ++kept) {
    for (int t = 0; t < cm::kLanes; ++t) {
      double acc = 0.0;
      for (int64_t j = t; j < nb; j += cm::kLanes) {
        if (h[size_t(j)] == 0) continue;
        acc = cm::add(acc, cm::mul(double(h[size_t(j)]), cm::mse_bin_error(j, kept, quant_max)));
      }
      lanes[size_t(t)] = acc;
    }
    out.push_back(cm::div(cm::lane_tree_sum(lanes.data()), double(total)));
  }
  return out;
}

void expect_same_bits(const std::vector<double>& got, const std::vector<double>& want,
                      const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t k = 0; k < got.size(); ++k) {
    ASSERT_EQ(std::bit_cast<uint64_t>(got[k]), std::bit_cast<uint64_t>(want[k]))
        << what << " candidate " << k << ": " << got[k] << " vs " << want[k];
  }
}

}  // namespace

TEST(CalibSearch, CpuScoresEqualThePlainTwinBitForBit) {
  std::vector<std::vector<uint64_t>> cases = {
      gaussian_histogram(2048, 1.0, 8.0, 200000, 0, 1),
      gaussian_histogram(2048, 1.0, 30.0, 100000, 7, 2),
      gaussian_histogram(300, 1.0, 4.0, 999, 1, 4),
      gaussian_histogram(4096, 1.0, 9.0, 300000, 3, 5),
  };
  std::vector<uint64_t> sparse(2048);  // empty bins under folded outliers: +inf candidates
  for (size_t j = 0; j < sparse.size(); j += 3) sparse[j] = 20000 / (j + 1);
  sparse[0] = 2000000;
  sparse[1] = 7;
  cases.push_back(sparse);
  for (size_t c = 0; c < cases.size(); ++c) {
    for (int threads : {1, 2}) {
      set_cpu_threads(threads);
      const std::string what = "case " + std::to_string(c) + ", " + std::to_string(threads) +
                               " thread(s)";
      const std::vector<double> twin = twin_entropy_scores(cases[c], 128);
      expect_same_bits(entropy_scores(cases[c], 128, Device::Cpu), twin, "entropy " + what);
      cpu::use_baseline_lanes(true);
      expect_same_bits(entropy_scores(cases[c], 128, Device::Cpu), twin, "2-lane entropy " + what);
      cpu::use_baseline_lanes(false);
      cpu::use_avx2_lanes_at_most(true);
      expect_same_bits(entropy_scores(cases[c], 128, Device::Cpu), twin, "4-lane entropy " + what);
      expect_same_bits(mse_scores(cases[c], 127, Device::Cpu), twin_mse_scores(cases[c], 127),
                       "4-lane mse " + what);
      cpu::use_avx2_lanes_at_most(false);
      expect_same_bits(mse_scores(cases[c], 127, Device::Cpu), twin_mse_scores(cases[c], 127),
                       "mse " + what);
    }
  }
  set_cpu_threads(0);
  // Other level counts and quant_max (the table is per bin count and quant_max).
  const auto h = gaussian_histogram(1024, 1.0, 6.0, 50000, 2, 9);
  expect_same_bits(entropy_scores(h, 100, Device::Cpu), twin_entropy_scores(h, 100), "levels 100");
  expect_same_bits(mse_scores(h, 63, Device::Cpu), twin_mse_scores(h, 63), "quant_max 63");
  expect_same_bits(mse_scores(h, 127, Device::Cpu), twin_mse_scores(h, 127), "1024 bins again");
}

// The MSE search's table of errors inside the threshold, W bins at a time, against
// calib_math's scalar mse_bin_error bit for bit: each lane width, quant_max from 1 to 127, rows
// from quant_max + 1 bins (a one-bin step) to 4096, lengths that leave a scalar tail.
TEST(CalibSearch, MseTableRowsEqualTheScalarErrorsAtEveryWidth) {
  for (const int mode : {0, 1, 2}) {  // widest, AVX2 at most, the two-lane baseline
    cpu::use_avx2_lanes_at_most(mode == 1);
    cpu::use_baseline_lanes(mode == 2);
    for (const int quant_max : {1, 7, 63, 127}) {
      for (const int64_t kept : {int64_t{quant_max} + 1, int64_t{129}, int64_t{1000},
                                 int64_t{2047}, int64_t{4096}}) {
        if (kept <= quant_max) continue;
        std::vector<double> row(static_cast<size_t>(kept));
        cpu::mse_inside_errors(kept, quant_max, row);
        for (int64_t j = 0; j < kept; ++j) {
          ASSERT_EQ(std::bit_cast<uint64_t>(row[size_t(j)]),
                    std::bit_cast<uint64_t>(calib_math::mse_bin_error(j, kept, quant_max)))
              << "mode " << mode << ", quant_max " << quant_max << ", kept " << kept << ", bin "
              << j;
        }
      }
    }
  }
  cpu::use_avx2_lanes_at_most(false);
  cpu::use_baseline_lanes(false);
}

// The entropy searches of many histograms in one parallel loop: each gets its own search's bits
// (the plain twin's), at 1 and 2 threads and each lane width, whatever its bin count; one holds
// a value in every bin (no empty level anywhere) and one is all zeros but bin 0 (every score
// +inf, everything kept).
TEST(CalibSearch, ManyEntropySearchesKeepTheirOwnBits) {
  std::vector<std::vector<uint64_t>> hists;
  const int64_t widths[] = {300, 2048, 128, 1500, 1024, 4096};
  for (size_t i = 0; i < std::size(widths); ++i) {
    hists.push_back(gaussian_histogram(widths[i], 1.0, 3.0 + static_cast<double>(i), 40000 + i,
                                       static_cast<int>(i % 3), static_cast<uint32_t>(50 + i)));
  }
  std::vector<uint64_t> full(700);
  for (size_t j = 0; j < full.size(); ++j) full[j] = 1 + (j * 7919) % 13;
  hists.push_back(full);
  std::vector<uint64_t> zeros(256, 0);
  zeros[0] = 99;
  hists.push_back(zeros);
  for (const int mode : {0, 1, 2}) {
    cpu::use_avx2_lanes_at_most(mode == 1);
    cpu::use_baseline_lanes(mode == 2);
    for (int threads : {1, 2}) {
      set_cpu_threads(threads);
      std::vector<std::span<const uint64_t>> views(hists.begin(), hists.end());
      const std::vector<ThresholdChoice> many = entropy_thresholds(views, 128, Device::Cpu);
      for (size_t i = 0; i < hists.size(); ++i) {
        const std::string what = "histogram " + std::to_string(i) + ", mode " +
                                 std::to_string(mode) + ", " + std::to_string(threads) +
                                 " thread(s)";
        const std::vector<double> twin = twin_entropy_scores(hists[i], 128);
        expect_same_bits(entropy_scores(hists[i], 128, Device::Cpu), twin, what);
        EXPECT_EQ(many[i].kept, entropy_threshold(hists[i], 128, Device::Cpu).kept) << what;
        EXPECT_EQ(std::bit_cast<uint64_t>(many[i].score),
                  std::bit_cast<uint64_t>(entropy_threshold(hists[i], 128, Device::Cpu).score))
            << what;
      }
    }
  }
  cpu::use_avx2_lanes_at_most(false);
  cpu::use_baseline_lanes(false);
  set_cpu_threads(0);
}

// The MSE searches of many histograms together (calibrate() hands over every tensor's at once):
// histograms of different bin counts share groups, padded to the widest of theirs, and up to
// four share each row of errors; each still gets its own search's bits. 19 histograms: two
// groups, rows of 4, 3 and 1 histograms, and one past the table's 2048 bins.
TEST(CalibSearch, ManyHistogramsOfAnyWidthKeepTheirOwnSearchBits) {
  std::vector<std::vector<uint64_t>> hists;
  const int64_t widths[] = {1100, 2048, 300, 1500, 1500, 1499, 2047, 700, 129, 2048,
                            1025, 1800, 4096, 128, 1600, 1024, 2000, 900, 1333};
  for (size_t i = 0; i < std::size(widths); ++i) {
    hists.push_back(gaussian_histogram(widths[i], 1.0, 4.0 + static_cast<double>(i), 50000 + i,
                                       static_cast<int>(i % 3), static_cast<uint32_t>(20 + i)));
  }
  for (const bool avx2 : {false, true}) {
    cpu::use_avx2_lanes_at_most(avx2);
    for (int threads : {1, 2}) {
      set_cpu_threads(threads);
      std::vector<std::span<const uint64_t>> views(hists.begin(), hists.end());
      std::vector<std::vector<double>> scores;
      for (const auto& h : hists) scores.emplace_back(h.size() - 127);
      const std::vector<std::span<double>> out(scores.begin(), scores.end());
      cpu::mse_scores_many(views, 127, out);
      for (size_t i = 0; i < hists.size(); ++i) {
        expect_same_bits(scores[i], twin_mse_scores(hists[i], 127),
                         "histogram " + std::to_string(i) + " of " + std::to_string(widths[i]) +
                             " bins, " + std::to_string(threads) + " thread(s)" +
                             (avx2 ? ", 4 lanes" : ""));
      }
    }
  }
  cpu::use_avx2_lanes_at_most(false);
  set_cpu_threads(0);
}
