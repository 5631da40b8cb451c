// The entropy method's threshold (quant/calibration.h entropy_kept): TensorRT's KL search,
// floored at the least-squared-error threshold.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "kernels/calib.h"
#include "ir/calib_methods.h"
#include "kernels/device.h"
#include "quant/calib/calibration.h"

using namespace qforge;

namespace {

// |N(0, 1)| for `count` values in 2048 bins over [0, range], with `top` values in the last bin.
std::vector<uint64_t> gaussian_with_top(double range, uint64_t count, uint64_t top, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> gauss(0.0, 1.0);
  std::vector<uint64_t> h(2048, 0);
  for (uint64_t k = 0; k < count; ++k) {
    const double b = std::fabs(gauss(rng)) / range * 2048.0;
    h[static_cast<size_t>(std::min(b, 2047.0))] += 1;
  }
  h.back() += top;
  return h;
}

}  // namespace

// A transformer LayerNorm output with a "massive activation": one channel of one token near 28
// per sequence (MiniLM layer 0: 80 of 491520 values at 27.5 to 28.5, the rest below 8). KL folds
// the 80 into its last bin and clips them to about 4 (a seventh of their value); the
// squared-error floor keeps them.
TEST(EntropyKept, KeepsMassiveActivationsThatKlClips) {
  const auto h = gaussian_with_top(28.0, 500000, 80, 1);
  EXPECT_LT(entropy_threshold(h, kEntropyLevels, Device::Cpu).kept, 400);
  const int64_t kept = entropy_kept(h, Device::Cpu);
  EXPECT_EQ(kept, mse_threshold(h, kInt8QuantMax, Device::Cpu).kept);
  EXPECT_GT(kept, 1900);
}

// A rare far outlier in a million values is noise to both criteria: it is still clipped.
TEST(EntropyKept, StillClipsARareNoiseTail) {
  const auto h = gaussian_with_top(40.0, 1000000, 1, 10);
  const int64_t kl = entropy_threshold(h, kEntropyLevels, Device::Cpu).kept;
  const int64_t kept = entropy_kept(h, Device::Cpu);
  EXPECT_GE(kept, kl);
  EXPECT_LT(kept, 400);
}

// Where KL keeps more than the squared error would, KL's threshold stands.
TEST(EntropyKept, NeverBelowTheKlThreshold) {
  const std::vector<uint64_t> uniform(2048, 10);  // KL keeps all 2048, mse 2040
  EXPECT_EQ(entropy_kept(uniform, Device::Cpu), 2048);
  for (uint32_t seed : {2u, 3u, 4u}) {
    const auto h = gaussian_with_top(6.0 * seed, 200000, seed * 7, seed);
    EXPECT_EQ(entropy_kept(h, Device::Cpu),
              std::max(entropy_threshold(h, kEntropyLevels, Device::Cpu).kept,
                       mse_threshold(h, kInt8QuantMax, Device::Cpu).kept))
        << seed;
  }
}

// calibrate() chooses every tensor's threshold in one call, the MSE searches (the mse method's,
// and the entropy method's floors) of all tensors together: the same thresholds, bit for bit, as
// one tensor at a time. 40 histograms: more than two of the search's groups of 16, some whose KL
// threshold keeps everything (no floor searched), some that the floor raises, and a 1024-bin one
// among the 2048-bin ones.
TEST(EntropyKept, ThresholdsOfManyTensorsEqualThoseOneAtATime) {
  std::vector<std::vector<uint64_t>> hists;
  std::vector<double> ranges;  // each histogram's top edge
  std::vector<float> amax;     // and the largest value seen, at or below it
  for (uint32_t i = 0; i < 40; ++i) {
    if (i % 9 == 4) {
      hists.emplace_back(2048, 10 + i);  // uniform: KL keeps all
    } else {
      hists.push_back(gaussian_with_top(4.0 + i, 20000 + 3000 * i, i % 5 == 0 ? 60 : i % 3, i));
    }
    ranges.push_back(0.5 + i);
    amax.push_back(static_cast<float>(0.5 + i) * (i % 2 ? 1.0f : 0.75f));
  }
  hists[17].resize(1024);
  hists[17].back() += 5;
  const std::vector<std::span<const uint64_t>> views(hists.begin(), hists.end());
  for (CalibMethod m : {CalibMethod::MinMax, CalibMethod::Percentile, CalibMethod::Entropy,
                        CalibMethod::Mse}) {
    const std::vector<MethodThreshold> many =
        choose_thresholds(m, views, ranges, amax, 99.9, Device::Cpu);
    ASSERT_EQ(many.size(), hists.size());
    int raised = 0;
    for (size_t i = 0; i < hists.size(); ++i) {
      const MethodThreshold one =
          choose_threshold(m, hists[i], ranges[i], amax[i], 99.9, Device::Cpu);
      EXPECT_LE(many[i].amax, amax[i]) << calib_method_name(m) << " tensor " << i;
      EXPECT_EQ(std::bit_cast<uint32_t>(many[i].amax), std::bit_cast<uint32_t>(one.amax))
          << calib_method_name(m) << " tensor " << i;
      EXPECT_EQ(many[i].clipped, one.clipped) << calib_method_name(m) << " tensor " << i;
      if (m == CalibMethod::Entropy) {
        raised += entropy_kept(hists[i], Device::Cpu) >
                          entropy_threshold(hists[i], kEntropyLevels, Device::Cpu).kept
                      ? 1
                      : 0;
      }
    }
    if (m == CalibMethod::Entropy) {
      EXPECT_GT(raised, 0);
    }
  }
  // The MSE searches alone: every score's bits, against one search per histogram.
  const std::vector<ThresholdChoice> mse = mse_thresholds(views, kInt8QuantMax, Device::Cpu);
  for (size_t i = 0; i < hists.size(); ++i) {
    const ThresholdChoice one = mse_threshold(hists[i], kInt8QuantMax, Device::Cpu);
    EXPECT_EQ(mse[i].kept, one.kept) << i;
    EXPECT_EQ(std::bit_cast<uint64_t>(mse[i].score), std::bit_cast<uint64_t>(one.score)) << i;
  }
}
