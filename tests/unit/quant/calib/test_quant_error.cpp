#include <gtest/gtest.h>

#include <cmath>
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
  ASSERT_TRUE(e.sqnr_db.has_value());
  EXPECT_NEAR(*e.sqnr_db, 10.0 * std::log10(25.0 / (0.25 + 0.0625)), 1e-12);
}

TEST(QuantError, ExactReconstructionHasNoSqnr) {
  const std::vector<float> v{1.0f, 0.0f, -2.0f};
  const QuantError e = measure_quant_error(v, v);
  EXPECT_EQ(e.max_abs, 0.0);
  EXPECT_FALSE(e.sqnr_db.has_value());
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
  ASSERT_TRUE(one.sqnr_db && two.sqnr_db);
  EXPECT_EQ(*one.sqnr_db, *two.sqnr_db) << "bitwise equal, not just close";
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
