// The entropy method's threshold (quant/calibration.h entropy_kept): TensorRT's KL search,
// floored at the least-squared-error threshold.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/calib.h"
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
