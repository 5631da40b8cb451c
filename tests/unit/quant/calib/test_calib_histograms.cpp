// What calibrate() keeps for reports: the histograms it counted, in the table, and
// choose_threshold() on them giving every method's table threshold.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <string>

#include "importers/dataset/dataset.h"
#include "importers/onnx/onnx_importer.h"
#include "quant/calib/calibration.h"

using namespace qforge;

namespace {

const std::string kSampleDir = std::string(QFORGE_SOURCE_DIR) + "/calib_data";

const Graph& sample_graph() {
  static const Graph g = import_onnx(kSampleDir + "/sample_cnn.onnx");
  return g;
}

CalibrationTable run(CalibMethod method, bool histograms_for_minmax = false) {
  Dataset data(kSampleDir + "/calib.npz", calibration_inputs(sample_graph()), 0, 64);
  CalibOptions o;
  o.method = method;
  o.device = Device::Cpu;
  o.histograms_for_minmax = histograms_for_minmax;
  PassReport report;
  return calibrate(sample_graph(), data, o, report);
}

float range_of(const TensorRange& r) { return std::fmax(std::fabs(r.min), std::fabs(r.max)); }

}  // namespace

TEST(CalibHistograms, EveryMethodsThresholdFromOneHistogram) {
  const CalibrationTable entropy = run(CalibMethod::Entropy);
  ASSERT_FALSE(entropy.histograms.empty());
  for (const CalibMethodInfo& m : kCalibMethods) {
    const CalibrationTable other = run(m.method);
    for (const auto& [name, hist] : entropy.histograms) {
      // Power-of-two bins: the largest |x| lands in the upper half of the 2048 (the histogram
      // ends at its last non-empty bin), and the top edge is within one bin above it.
      ASSERT_GT(hist.size(), 1024u) << name;
      ASSERT_LE(hist.size(), 2048u) << name;
      EXPECT_NE(hist.back(), 0u) << name;
      const float amax = range_of(entropy.ranges.at(name));
      const double range = entropy.histogram_ranges.at(name);
      const double width = range / static_cast<double>(hist.size());
      EXPECT_EQ(std::exp2(std::round(std::log2(width))), width) << name;
      EXPECT_GT(range, amax) << name;  // amax is in the last bin, [range - width, range)
      EXPECT_LE(range - width, amax) << name;
      const MethodThreshold t = choose_threshold(m.method, hist, range, amax, 99.99, Device::Cpu);
      EXPECT_EQ(std::bit_cast<uint32_t>(t.amax),
                std::bit_cast<uint32_t>(other.ranges.at(name).amax))
          << m.name << " " << name;
    }
  }
}

TEST(CalibHistograms, MinMaxCountsThemOnlyWhenAsked) {
  const CalibrationTable plain = run(CalibMethod::MinMax);
  EXPECT_TRUE(plain.histograms.empty());
  const CalibrationTable counted = run(CalibMethod::MinMax, /*histograms_for_minmax=*/true);
  const CalibrationTable entropy = run(CalibMethod::Entropy);
  EXPECT_EQ(counted.histograms, entropy.histograms);
  EXPECT_EQ(counted.histogram_ranges, entropy.histogram_ranges);
  ASSERT_EQ(counted.ranges.size(), plain.ranges.size());
  for (const auto& [name, r] : plain.ranges) {
    EXPECT_EQ(std::bit_cast<uint32_t>(r.amax),
              std::bit_cast<uint32_t>(counted.ranges.at(name).amax))
        << name;
  }
  // One histogram per tensor with a range; each counts every value of the tensor.
  for (const auto& [name, r] : counted.ranges) {
    EXPECT_EQ(counted.histograms.count(name), range_of(r) > 0 ? 1u : 0u) << name;
  }
}
