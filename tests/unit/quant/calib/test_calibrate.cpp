// calibrate(): the sample CNN with every method, independence from batch size, sample order and
// thread count, what counts as an activation, and bad data.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "importers/dataset/dataset.h"
#include "importers/onnx/onnx_importer.h"
#include "ir/error.h"
#include "kernels/calib.h"
#include "quant/calib/calibration.h"
#include "quant/calib/observer.h"
#include "tests/unit/importers/dataset/dataset_test_util.h"

using namespace qforge;
using namespace qforge::test;

namespace {

const std::string kSampleDir = std::string(QFORGE_SOURCE_DIR) + "/calib_data";

const Graph& sample_graph() {
  static const Graph g = import_onnx(kSampleDir + "/sample_cnn.onnx");
  return g;
}

CalibrationTable run(const std::string& data_path, CalibMethod method, int64_t batch,
                     int threads = 0, PassReport* report_out = nullptr) {
  Dataset data(data_path, calibration_inputs(sample_graph()), 0, batch);
  CalibOptions o;
  o.method = method;
  o.device = Device::Cpu;
  o.threads = threads;
  PassReport report;
  CalibrationTable t = calibrate(sample_graph(), data, o, report);
  if (report_out != nullptr) *report_out = report;
  return t;
}

void expect_same_ranges(const CalibrationTable& a, const CalibrationTable& b,
                        const std::string& what) {
  ASSERT_EQ(a.ranges.size(), b.ranges.size()) << what;
  for (const auto& [name, r] : a.ranges) {
    const TensorRange& s = b.ranges.at(name);
    EXPECT_EQ(std::bit_cast<uint32_t>(r.amax), std::bit_cast<uint32_t>(s.amax))
        << what << " " << name;
    EXPECT_EQ(std::bit_cast<uint32_t>(r.min), std::bit_cast<uint32_t>(s.min))
        << what << " " << name;
    EXPECT_EQ(std::bit_cast<uint32_t>(r.max), std::bit_cast<uint32_t>(s.max))
        << what << " " << name;
  }
}

// Ranges equal to within `rel` of the larger magnitude: the sample CNN's activations across
// batch sizes. OpenBLAS picks its kernel by the shape of the product, so a row's Gemm output
// may differ in the last bits between a batch of 1 and a batch of 7 (measured: 3 ulp here).
void expect_close_ranges(const CalibrationTable& a, const CalibrationTable& b,
                         const std::string& what, float rel = 1e-5f) {
  ASSERT_EQ(a.ranges.size(), b.ranges.size()) << what;
  const auto near = [rel](float x, float y) {
    return std::fabs(x - y) <= rel * std::max(std::fabs(x), std::fabs(y));
  };
  for (const auto& [name, r] : a.ranges) {
    const TensorRange& s = b.ranges.at(name);
    EXPECT_TRUE(near(r.amax, s.amax)) << what << " " << name << ": " << r.amax << " " << s.amax;
    EXPECT_TRUE(near(r.min, s.min)) << what << " " << name << ": " << r.min << " " << s.min;
    EXPECT_TRUE(near(r.max, s.max)) << what << " " << name << ": " << r.max << " " << s.max;
  }
}

// The sample's calibration inputs, in order.
std::vector<float> sample_inputs() {
  Dataset d(kSampleDir + "/calib.npz", calibration_inputs(sample_graph()), 0, 200);
  Dataset::Feeds batch;
  d.next(batch);
  return batch[0].second.to_f32();
}

// A graph y = Relu(x) over [N, n] f32: every activation is the data itself or its ReLU.
Graph relu_graph(int64_t n) {
  Graph g;
  g.inputs.push_back({"x", DType::F32, std::vector<Dim>{Dim{std::nullopt, "N"}, Dim{n, ""}}, ""});
  g.outputs.push_back({"y", DType::F32, std::nullopt, ""});
  g.nodes.push_back(Node{"relu", "Relu", "", {"x"}, {"y"}, {}, ""});
  g.set_opset("", 17);
  return g;
}

// dir/d.npz: two samples of an input x [N, 2], [1, -4] and [0, 2].
std::filesystem::path two_samples(const ScratchDir& dir) {
  write_file(
      dir / "d.npz",
      zip({{"x.npy", npy("<f4", {2, 2}, raw_bytes(std::vector<float>{1, -4, 0, 2}))}}, false));
  return dir / "d.npz";
}

CalibOptions cpu_minmax() {
  CalibOptions o;
  o.method = CalibMethod::MinMax;
  o.device = Device::Cpu;
  return o;
}

// n Gaussian values (sigma 1, seed 7) of which `count` (every 9973rd) are `at`.
struct Outliers {
  size_t n, count;
  float at;
};
// 1 outlier at 20 among a million: rare noise. 4 at 50 among 40000: 0.01% of the values, far
// out.
constexpr Outliers kRareNoise{1000000, 1, 20.0f};
constexpr Outliers kFewFar{40000, 4, 50.0f};

// Calibrates relu_graph(40) with `method` on the values `o` describes, which it leaves in `x`.
CalibrationTable gaussian_with_outliers(const Outliers& o, CalibMethod method, PassReport& report,
                                        std::vector<float>& x) {
  std::mt19937 rng(7);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  x.resize(o.n);
  for (float& v : x) v = gauss(rng);
  for (size_t i = 0; i < o.count; ++i) x[i * 9973] = o.at;
  ScratchDir dir("calib_gauss");
  write_file(dir / "d.npz",
             zip({{"x.npy", npy("<f4", {static_cast<int64_t>(o.n / 40), 40}, raw_bytes(x))}},
                 false));
  const Graph g = relu_graph(40);
  Dataset data(dir / "d.npz", calibration_inputs(g), 0, 1024);
  CalibOptions options;
  options.method = method;
  options.device = Device::Cpu;
  return calibrate(g, data, options, report);
}

}  // namespace

TEST(Calibrate, SampleCnnMinMaxMatchesTheData) {
  PassReport report;
  const CalibrationTable t = run(kSampleDir + "/calib.npz", CalibMethod::MinMax, 32, 0, &report);
  EXPECT_EQ(t.method, "minmax");
  EXPECT_EQ(t.samples, 200);
  EXPECT_EQ(t.dataset_digest, "b0f66d040db118226a0246f10d863daac72bfb77f05635d47c3536c0bd0c092b");
  // The graph input and the output of each of the 11 nodes.
  EXPECT_EQ(t.ranges.size(), 12u);
  for (const Node& n : sample_graph().nodes) EXPECT_EQ(t.ranges.count(n.outputs[0]), 1u) << n.name;
  const auto x = sample_inputs();
  float max_abs = 0.0f;
  for (float v : x) max_abs = std::max(max_abs, std::fabs(v));
  EXPECT_EQ(t.ranges.at("input").amax, max_abs);
  EXPECT_EQ(t.ranges.at("input").min, *std::min_element(x.begin(), x.end()));
  EXPECT_EQ(t.ranges.at("input").max, *std::max_element(x.begin(), x.end()));
  for (const auto& [name, r] : t.ranges) {
    EXPECT_EQ(r.amax, std::max(std::fabs(r.min), std::fabs(r.max))) << name;
    EXPECT_GT(r.amax, 0.0f) << name;
  }
  EXPECT_EQ(report.stats["batches"], 7);
  EXPECT_EQ(report.stats["tensors"].size(), 12u);
}

TEST(Calibrate, HistogramMethodsStayWithinTheObservedRange) {
  const CalibrationTable mm = run(kSampleDir + "/calib.npz", CalibMethod::MinMax, 50);
  for (CalibMethod m : {CalibMethod::Percentile, CalibMethod::Entropy, CalibMethod::Mse}) {
    const CalibrationTable t = run(kSampleDir + "/calib.npz", m, 50);
    EXPECT_EQ(t.method, calib_method_name(m));
    ASSERT_EQ(t.ranges.size(), mm.ranges.size());
    int clipped = 0;
    for (const auto& [name, r] : t.ranges) {
      const TensorRange& full = mm.ranges.at(name);
      EXPECT_GT(r.amax, 0.0f) << name;
      EXPECT_LE(r.amax, full.amax) << calib_method_name(m) << " " << name;
      EXPECT_EQ(r.min, full.min);
      EXPECT_EQ(r.max, full.max);
      clipped += r.amax < full.amax ? 1 : 0;
    }
    // Every method clips something on real activations (ReLU outputs have long tails).
    EXPECT_GT(clipped, 0) << calib_method_name(m);
  }
}

TEST(Calibrate, ResultsDoNotDependOnThreadsAndFollowOnlyRoundingAcrossBatchSizes) {
  for (CalibMethod m : {CalibMethod::MinMax, CalibMethod::Entropy, CalibMethod::Percentile}) {
    // Same batch size: the bits do not follow the thread count.
    const CalibrationTable seven_1 = run(kSampleDir + "/calib.npz", m, 7, 1);
    const CalibrationTable seven_2 = run(kSampleDir + "/calib.npz", m, 7, 2);
    expect_same_ranges(seven_1, seven_2, std::string(calib_method_name(m)) + " 1 vs 2 threads");
    // Another batch size: the activations themselves differ only by the GEMM's rounding.
    const CalibrationTable one = run(kSampleDir + "/calib.npz", m, 1, 1);
    expect_close_ranges(one, seven_2, std::string(calib_method_name(m)) + " batch 1 vs 7");
    EXPECT_EQ(one.dataset_digest, seven_2.dataset_digest);
  }
  // The same samples shuffled, in a stored .npz.
  const auto x = sample_inputs();
  std::vector<size_t> order(200);
  std::iota(order.begin(), order.end(), size_t{0});
  std::shuffle(order.begin(), order.end(), std::mt19937(42));
  std::vector<float> shuffled;
  for (size_t i : order)
    shuffled.insert(shuffled.end(), x.begin() + 64 * i, x.begin() + 64 * (i + 1));
  ScratchDir dir("calib_shuffle");
  write_file(dir / "s.npz",
             zip({{"input.npy", npy("<f4", {200, 1, 8, 8}, raw_bytes(shuffled))}}, false));
  const CalibrationTable a = run(kSampleDir + "/calib.npz", CalibMethod::Entropy, 16);
  const CalibrationTable b = run((dir / "s.npz").string(), CalibMethod::Entropy, 5);
  expect_close_ranges(a, b, "shuffled");
  EXPECT_EQ(a.ranges.at("input").amax, b.ranges.at("input").amax);  // no product before it
  EXPECT_NE(a.dataset_digest, b.dataset_digest);  // the digest follows the order
}

TEST(Calibrate, HistogramsDoNotDependOnBatchSizeOrOrderBitForBit) {
  // Without a matrix product every activation is computed element by element, so the ranges of
  // every method are the same bits for any batch size, sample order and thread count.
  std::mt19937 rng(11);
  std::lognormal_distribution<float> tail(0.0f, 1.0f);
  std::vector<float> x(3000 * 24);
  for (size_t i = 0; i < x.size(); ++i) x[i] = (i % 3 == 0 ? -1.0f : 1.0f) * tail(rng);
  std::vector<float> rev;
  for (size_t r = 3000; r-- > 0;) rev.insert(rev.end(), x.begin() + 24 * r, x.begin() + 24 * (r + 1));
  ScratchDir dir("calib_relu_order");
  write_file(dir / "a.npz", zip({{"x.npy", npy("<f4", {3000, 24}, raw_bytes(x))}}, false));
  write_file(dir / "b.npz", zip({{"x.npy", npy("<f4", {3000, 24}, raw_bytes(rev))}}, false));
  const Graph g = relu_graph(24);
  const auto table = [&](const std::string& file, int64_t batch, int threads, CalibMethod m) {
    Dataset data(dir / file, calibration_inputs(g), 0, batch);
    CalibOptions o;
    o.method = m;
    o.device = Device::Cpu;
    o.threads = threads;
    PassReport report;
    return calibrate(g, data, o, report);
  };
  for (CalibMethod m : {CalibMethod::MinMax, CalibMethod::Entropy, CalibMethod::Percentile,
                        CalibMethod::Mse}) {
    const CalibrationTable ref = table("a.npz", 1, 1, m);
    expect_same_ranges(ref, table("a.npz", 7, 2, m), std::string(calib_method_name(m)) + " batch 7");
    expect_same_ranges(ref, table("b.npz", 256, 2, m),
                       std::string(calib_method_name(m)) + " reversed");
  }
}

TEST(Calibrate, ObservesOnlyDataDependentFloatValues) {
  Graph g;
  g.inputs.push_back({"x", DType::F32, std::vector<Dim>{Dim{std::nullopt, "N"}, Dim{2, ""}}, ""});
  g.outputs.push_back({"y", DType::F32, std::nullopt, ""});
  g.outputs.push_back({"shape", DType::I64, std::nullopt, ""});
  g.set_initializer("w", Tensor::from_f32(std::vector<float>{2.0f, 3.0f}, {2}));
  Attribute value;
  value.name = "value";
  value.type = AttrType::Tensor;
  value.t = Tensor::from_f32(std::vector<float>{1.0f, 1.0f}, {2});
  g.nodes.push_back(Node{"c", "Constant", "", {}, {"c"}, {value}, ""});
  g.nodes.push_back(Node{"cw", "Mul", "", {"c", "w"}, {"cw"}, {}, ""});  // constant: skipped
  g.nodes.push_back(Node{"add", "Add", "", {"x", "cw"}, {"y"}, {}, ""});
  g.nodes.push_back(Node{"shape", "Shape", "", {"y"}, {"shape"}, {}, ""});  // int64: skipped
  g.set_opset("", 17);
  ScratchDir dir("calib_consts");
  Dataset data(two_samples(dir), calibration_inputs(g), 0, 1);
  CalibOptions o = cpu_minmax();
  PassReport report;
  const CalibrationTable t = calibrate(g, data, o, report);
  ASSERT_EQ(t.ranges.size(), 2u);
  EXPECT_EQ(t.ranges.at("x").amax, 4.0f);
  // y = x + [2, 3] = [[3, -1], [2, 5]]
  EXPECT_EQ(t.ranges.at("y").min, -1.0f);
  EXPECT_EQ(t.ranges.at("y").max, 5.0f);
}

// With `only`, the nodes that no observed value needs do not run: here a node after them is
// one no runtime runs, which stops the calibration that observes everything.
TEST(Calibrate, OnlyTheNodesTheObservedValuesNeedRun) {
  Graph g = relu_graph(2);
  g.outputs.clear();
  g.outputs.push_back({"z", DType::F32, std::nullopt, ""});
  g.nodes.push_back(Node{"neg", "Neg", "", {"y"}, {"n"}, {}, ""});
  g.nodes.push_back(Node{"later", "NoSuchOp", "", {"n"}, {"z"}, {}, ""});
  ScratchDir dir("calib_needed");
  Dataset data(two_samples(dir), calibration_inputs(g), 0, 1);
  CalibOptions o = cpu_minmax();
  PassReport report;
  EXPECT_THROW((void)calibrate(g, data, o, report), Error) << "NoSuchOp runs without `only`";
  for (const std::set<std::string>& only :
       {std::set<std::string>{"y"}, std::set<std::string>{"x", "n"}}) {
    o.only = only;
    const CalibrationTable t = calibrate(g, data, o, report);
    ASSERT_EQ(t.ranges.size(), only.size());
    for (const std::string& name : only) ASSERT_EQ(t.ranges.count(name), 1u) << name;
    if (only.count("y") > 0) {
      EXPECT_EQ(t.ranges.at("y").max, 2.0f);
    }
    if (only.count("n") > 0) {
      EXPECT_EQ(t.ranges.at("n").min, -2.0f);
    }
  }
}

TEST(Calibrate, EntropyThresholdOfGaussianWithOutliers) {
  // Gaussian values (sigma 1) with outliers. The threshold is entropy_kept over the |x|
  // histogram, rescaled to values: TensorRT's KL threshold, floored at the mse one.
  // The rare noise: both criteria clip it. The few far values: KL still clips them, but
  // clipping costs 4 x 46^2 of squared error where keeping them costs 40000 x (50/127)^2 / 12:
  // the floor keeps them.
  for (const auto& [c, clipped] : {std::pair{kRareNoise, true}, std::pair{kFewFar, false}}) {
    PassReport report;
    std::vector<float> x;
    const CalibrationTable t = gaussian_with_outliers(c, CalibMethod::Entropy, report, x);
    const TensorRange& r = t.ranges.at("x");
    EXPECT_EQ(r.max, c.at);
    // The histogram in bins of the least power of two for which 2048 of them hold c.at, up to
    // its last non-empty bin (quant/calib/observer.h).
    const int e = histogram_exponent(c.at, 2048);
    EXPECT_EQ(e, c.at == 20.0f ? -6 : -5);  // 2048 / 64 = 32 > 20; 2048 / 32 = 64 > 50
    std::vector<uint64_t> hist(2048, 0);
    histogram_abs_pow2(x, e, hist, Device::Cpu);
    while (hist.back() == 0) hist.pop_back();
    const double width = std::ldexp(1.0, e);
    EXPECT_EQ(static_cast<double>(hist.size() - 1) * width,
              std::floor(static_cast<double>(c.at) / width) * width);
    const int64_t kept = entropy_kept(hist, Device::Cpu);
    EXPECT_EQ(r.amax, static_cast<float>(std::fmin(static_cast<double>(kept) * width, c.at)))
        << c.n;
    const int64_t kl = entropy_threshold(hist, 128, Device::Cpu).kept;
    EXPECT_LT(static_cast<double>(kl) * width, 8.0) << c.n;
    EXPECT_GT(r.amax, 3.0f) << c.n;  // the Gaussian's bulk is kept
    if (clipped) {
      EXPECT_LT(r.amax, 8.0f) << c.n;
    } else {
      EXPECT_GT(r.amax, 0.9f * c.at) << c.n;
    }
  }
}

// Percentile keeps its threshold, and warns where a wider threshold has under half its
// expected squared error: 4 values at 50 among 40000 of a Gaussian are 0.01% of them, so
// 99.99 clips them to the bulk's edge, at 4 x 46^2 of squared error, where keeping them costs
// 40000 x (50/127)^2 / 12 (the entropy case above). One outlier at 20 among a million is rare
// noise: a wider threshold lowers the ReLU's error by 8% at most, so no warning.
TEST(Calibrate, PercentileWarnsWhereItsSquaredErrorIsFarAboveTheLeast) {
  for (const auto& [c, warns] : {std::pair{kRareNoise, false}, std::pair{kFewFar, true}}) {
    PassReport report;
    std::vector<float> x;
    const CalibrationTable t = gaussian_with_outliers(c, CalibMethod::Percentile, report, x);
    EXPECT_LT(t.ranges.at("x").amax, 8.0f) << c.n;  // the percentile, unchanged
    if (!warns) {
      EXPECT_TRUE(report.warnings.empty()) << report.warnings.front();
      EXPECT_FALSE(report.stats.contains("percentile_costly_clips"));
      continue;
    }
    EXPECT_EQ(report.stats["percentile_costly_clips"], 2);  // x and its ReLU
    ASSERT_EQ(report.warnings.size(), 1u);
    const std::string& w = report.warnings.front();
    EXPECT_NE(w.find("2 of 2 activations clip at the percentile with over 2x the squared int8 "
                     "error of a wider threshold"),
              std::string::npos) << w;
    EXPECT_NE(w.find("(largest |x| 50)"), std::string::npos) << w;
    EXPECT_NE(w.find("--method entropy or mse"), std::string::npos) << w;
  }
}

TEST(Calibrate, NaNsAreLeftOutAndReported) {
  ScratchDir dir("calib_nan");
  const std::vector<float> x = {1.0f, std::nanf(""), -2.0f, 0.5f};
  write_file(dir / "d.npz", zip({{"x.npy", npy("<f4", {2, 2}, raw_bytes(x))}}, false));
  const Graph g = relu_graph(2);
  // Kept as read: what is tested is calibrate's handling of a NaN activation (one the model
  // computes); a data set refuses NaN in its own data (test_dataset_bad_samples.cpp).
  Dataset data(dir / "d.npz", calibration_inputs(g), 0, 1, "calibration data", BadSamples::Keep);
  CalibOptions o;
  o.method = CalibMethod::Percentile;
  o.device = Device::Cpu;
  PassReport report;
  const CalibrationTable t = calibrate(g, data, o, report);
  EXPECT_EQ(t.ranges.at("x").min, -2.0f);
  EXPECT_EQ(t.ranges.at("x").max, 1.0f);
  ASSERT_FALSE(report.warnings.empty());
  EXPECT_NE(report.warnings.front().find("'x' held 1 NaN"), std::string::npos);
}

// An additive attention mask carries -inf: such a tensor gets no range (its readers stay float)
// and a warning naming it, instead of failing the whole calibration.
TEST(Calibrate, InfinityLeavesTheTensorOutOfTheTable) {
  ScratchDir dir("calib_inf");
  const std::vector<float> x = {1.0f, -INFINITY};
  write_file(dir / "d.npz", zip({{"x.npy", npy("<f4", {1, 2}, raw_bytes(x))}}, false));
  const Graph g = relu_graph(2);
  Dataset data(dir / "d.npz", calibration_inputs(g), 0, 1, "calibration data", BadSamples::Keep);
  PassReport report;
  const CalibrationTable t = calibrate(g, data, CalibOptions{}, report);
  EXPECT_EQ(t.ranges.count("x"), 0u);
  EXPECT_EQ(t.ranges.size(), 1u);  // relu's output: max(x, 0) is finite
  EXPECT_EQ(report.stats["infinite"], 1);
  ASSERT_FALSE(report.warnings.empty());
  EXPECT_NE(report.warnings.front().find("'x' reaches infinity"), std::string::npos)
      << report.warnings.front();
}

TEST(Calibrate, OptionsOutOfRangeAreUsageErrors) {
  Dataset data(kSampleDir + "/calib.npz", calibration_inputs(sample_graph()), 0, 50);
  PassReport report;
  CalibOptions o;
  o.percentile = 0.0;
  EXPECT_THROW(calibrate(sample_graph(), data, o, report), Error);
  o = CalibOptions{};
  o.num_bins = 100;
  EXPECT_THROW(calibrate(sample_graph(), data, o, report), Error);
}

TEST(Calibrate, ProgressCountsOnePass) {
  Dataset data(kSampleDir + "/calib.npz", calibration_inputs(sample_graph()), 64, 16);
  std::vector<std::pair<int64_t, int64_t>> calls;
  CalibOptions o;
  o.device = Device::Cpu;
  o.progress = [&](int64_t done, int64_t total) { calls.emplace_back(done, total); };
  PassReport report;
  calibrate(sample_graph(), data, o, report);
  ASSERT_EQ(calls.size(), 4u);  // 4 batches, one pass (the histograms come with the ranges)
  EXPECT_EQ(calls.front(), (std::pair<int64_t, int64_t>{16, 64}));
  EXPECT_EQ(calls.back(), (std::pair<int64_t, int64_t>{64, 64}));
}
