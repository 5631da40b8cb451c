// The threshold searches against calib_reference.py, a NumPy implementation written from the
// contract in kernels/calib.h, on histograms of synthetic Gaussian tensors with outliers. Runs
// when QFORGE_PYTHON names a Python with numpy (scripts/test.sh sets it).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/calib.h"
#include "tests/unit/importers/dataset/dataset_test_util.h"

using namespace qforge;

namespace {

const std::string kScript =
    std::string(QFORGE_SOURCE_DIR) + "/tests/unit/quant/calib/calib_reference.py";

// A histogram of |x| for `n` Gaussian values (sigma 1), with `outliers` values at `far` sigma.
std::vector<uint64_t> gaussian_with_outliers(size_t n, size_t outliers, float far, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = gauss(rng);
  for (size_t i = 0; i < outliers; ++i)
    x[(i * 7919) % n] = (i % 2 ? -far : far) * (1.0f + 0.01f * i);
  float amax = 0;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  std::vector<uint64_t> hist(2048, 0);
  histogram_abs(x, amax, hist, Device::Cpu);
  return hist;
}

nlohmann::json run_reference(const std::vector<uint64_t>& hist, const test::ScratchDir& dir) {
  const char* python = std::getenv("QFORGE_PYTHON");
  {
    std::ofstream f(dir / "hist.txt");
    for (uint64_t v : hist) f << v << '\n';
  }
  const std::string cmd = std::string(python) + " " + kScript + " " + (dir / "hist.txt").string() +
                          " " + (dir / "out.json").string();
  if (std::system(cmd.c_str()) != 0) return nullptr;
  std::ifstream f(dir / "out.json");
  return nlohmann::json::parse(f);
}

void expect_scores(const std::vector<double>& got, const nlohmann::json& ref, const char* what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  for (size_t k = 0; k < got.size(); ++k) {
    if (ref[k].is_null()) {  // +inf
      EXPECT_TRUE(std::isinf(got[k]) && got[k] > 0) << what << " candidate " << k;
      continue;
    }
    const double r = ref[k].get<double>();
    EXPECT_NEAR(got[k], r, 1e-9 * std::max(std::fabs(r), 1e-9)) << what << " candidate " << k;
  }
}

}  // namespace

TEST(CalibPythonReference, SearchesAgreeWithNumpy) {
  if (std::getenv("QFORGE_PYTHON") == nullptr) {
    GTEST_SKIP() << "QFORGE_PYTHON not set: point it at a Python with numpy "
                    "(e.g. QFORGE_PYTHON=.venv/bin/python) to compare with calib_reference.py";
  }
  test::ScratchDir dir("calib_pyref");
  struct Case {
    size_t n, outliers;
    float far;
  };
  for (const Case& c : {Case{200000, 20, 40.0f}, Case{50000, 3, 12.0f}, Case{100000, 0, 0.0f}}) {
    const std::string what = "n=" + std::to_string(c.n) + " outliers=" + std::to_string(c.outliers);
    const auto hist = gaussian_with_outliers(c.n, c.outliers, c.far, static_cast<uint32_t>(c.n));
    const nlohmann::json ref = run_reference(hist, dir);
    ASSERT_FALSE(ref.is_null()) << "calib_reference.py failed for " << what;
    expect_scores(entropy_scores(hist, 128, Device::Cpu), ref["entropy_scores"], "entropy");
    expect_scores(mse_scores(hist, 127, Device::Cpu), ref["mse_scores"], "mse");
    EXPECT_EQ(entropy_threshold(hist, 128, Device::Cpu).kept, ref["entropy_kept"].get<int64_t>())
        << what;
    EXPECT_EQ(mse_threshold(hist, 127, Device::Cpu).kept, ref["mse_kept"].get<int64_t>()) << what;
    for (const auto& [p, t] : ref["percentile"].items()) {
      EXPECT_NEAR(percentile_threshold(hist, std::stod(p)), t.get<double>(), 1e-9)
          << what << " p" << p;
    }
    if (c.outliers > 0) {  // the outliers sit far out: entropy clips them
      EXPECT_LT(entropy_threshold(hist, 128, Device::Cpu).kept, 1024) << what;
    }
  }
}
