// The vector erf, exp and sigmoid against the exact ones (in f64): erf within 2.5 ulp over a
// sweep of every float, four and eight lanes the same bits, odd symmetry to the bit, the special
// values, and the same bits whatever an element's position in the array (the runtime splits
// arrays among threads at any point).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/vmath_cpu.h"

namespace qforge {
namespace {

double ulp_error(float got, double exact) {
  const float rounded = std::fabs(static_cast<float>(exact));
  const double ulp = std::nextafter(rounded, std::numeric_limits<float>::infinity()) - rounded;
  return std::fabs(static_cast<double>(got) - exact) / ulp;
}

TEST(ErfCpu, WithinTwoAndAHalfUlpOverEveryFloatOnAStride) {
  std::vector<float> x;
  for (uint64_t u = 0; u <= 0x7f800000u; u += 61) x.push_back(std::bit_cast<float>(uint32_t(u)));
  std::vector<float> y(x.size()), minus(x.size()), y_minus(x.size());
  erf_f32(x.data(), y.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) minus[i] = -x[i];
  erf_f32(minus.data(), y_minus.data(), static_cast<int64_t>(x.size()));
  double worst = 0;
  float worst_x = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(y_minus[i]), std::bit_cast<uint32_t>(-y[i])) << x[i];
    const double e = ulp_error(y[i], std::erf(static_cast<double>(x[i])));
    if (e > worst) worst = e, worst_x = x[i];
  }
  EXPECT_LE(worst, 2.5) << "at x = " << worst_x;
  EXPECT_GT(x.size(), 30'000'000u);
  // Four lanes (the SSE2 baseline) and eight (AVX2) give the same bits as the run-time choice
  // (AVX-512 or AVX2 here when the CPU has it), for erf and Gelu.
  std::vector<float> other(x.size());
  for (const VmathLanes lanes : {VmathLanes::Four, VmathLanes::Eight}) {
    erf_f32(x.data(), other.data(), static_cast<int64_t>(x.size()), lanes);
    EXPECT_EQ(std::memcmp(other.data(), y.data(), y.size() * sizeof(float)), 0);
  }
  gelu_erf_f32(x.data(), y.data(), static_cast<int64_t>(x.size()));
  for (const VmathLanes lanes : {VmathLanes::Four, VmathLanes::Eight}) {
    gelu_erf_f32(x.data(), other.data(), static_cast<int64_t>(x.size()), lanes);
    EXPECT_EQ(std::memcmp(other.data(), y.data(), y.size() * sizeof(float)), 0);
  }
}

TEST(ErfCpu, SpecialValues) {
  EXPECT_TRUE(std::isnan(erf_f32(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(erf_f32(std::numeric_limits<float>::infinity()), 1.0f);
  EXPECT_EQ(erf_f32(-std::numeric_limits<float>::infinity()), -1.0f);
  EXPECT_EQ(erf_f32(100.0f), 1.0f);
  EXPECT_EQ(erf_f32(3.925f), 1.0f);
  EXPECT_EQ(std::bit_cast<uint32_t>(erf_f32(0.0f)), 0u);
  EXPECT_TRUE(std::signbit(erf_f32(-0.0f)));
  EXPECT_EQ(erf_f32(0.0f), 0.0f);
  const float tiny = std::numeric_limits<float>::denorm_min();
  EXPECT_EQ(erf_f32(tiny * 1000), static_cast<float>(std::erf(double(tiny) * 1000)));
  EXPECT_NEAR(erf_f32(0.5f), 0.5204998778f, 1e-7);
  EXPECT_NEAR(erf_f32(-1.0f), -0.8427007929f, 1e-7);
}

TEST(ErfCpu, EveryPositionAndLengthGivesTheSameBits) {
  std::vector<float> x(37);
  for (size_t i = 0; i < x.size(); ++i) x[i] = -4.0f + 0.23f * static_cast<float>(i);
  x[5] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> whole(x.size());
  erf_f32(x.data(), whole.data(), static_cast<int64_t>(x.size()));
  for (int64_t start = 0; start < 9; ++start) {
    for (int64_t len = 0; start + len <= static_cast<int64_t>(x.size()); len += 5) {
      std::vector<float> part(static_cast<size_t>(len), -7.0f);
      erf_f32(x.data() + start, part.data(), len);
      for (int64_t i = 0; i < len; ++i) {
        ASSERT_EQ(std::bit_cast<uint32_t>(part[size_t(i)]),
                  std::bit_cast<uint32_t>(whole[size_t(start + i)]))
            << "start " << start << " length " << len;
      }
    }
    EXPECT_EQ(std::bit_cast<uint32_t>(erf_f32(x[size_t(start)])),
              std::bit_cast<uint32_t>(whole[size_t(start)]));
  }
  // In place.
  std::vector<float> same = x;
  erf_f32(same.data(), same.data(), static_cast<int64_t>(same.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(std::bit_cast<uint32_t>(same[i]), std::bit_cast<uint32_t>(whole[i]));
  }
}

TEST(ErfCpu, GeluMatchesTheExactFormula) {
  std::vector<float> x;
  for (float v = -12.0f; v <= 12.0f; v += 0.0137f) x.push_back(v);
  std::vector<float> y(x.size());
  gelu_erf_f32(x.data(), y.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = x[i];
    const double exact = 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
    EXPECT_NEAR(y[i], exact, 4e-7 * std::max(1.0, std::fabs(exact))) << v;
  }
}

}  // namespace
}  // namespace qforge

namespace qforge {
namespace {

TEST(ExpCpu, WithinTwoUlpWhereNormalAndGradualBelow) {
  std::vector<float> x;
  for (uint64_t u = 0; u <= 0x7f800000u; u += 157) {
    const float v = std::bit_cast<float>(uint32_t(u));
    if (v <= 110.0f) {
      x.push_back(v);
      x.push_back(-v);
    }
  }
  std::vector<float> y(x.size()), four(x.size());
  exp_shifted_f32(x.data(), y.data(), static_cast<int64_t>(x.size()), 0.0f);
  for (const VmathLanes lanes : {VmathLanes::Four, VmathLanes::Eight}) {
    exp_shifted_f32(x.data(), four.data(), static_cast<int64_t>(x.size()), 0.0f, lanes);
    EXPECT_EQ(std::memcmp(four.data(), y.data(), y.size() * sizeof(float)), 0);
  }
  double worst = 0;
  float worst_x = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double exact = std::exp(static_cast<double>(x[i]));
    if (exact >= 3.4028234663852886e38) {
      ASSERT_TRUE(std::isinf(y[i])) << x[i];
    } else if (exact >= 1.1754943508222875e-38) {  // normal
      const double e = ulp_error(y[i], exact);
      if (e > worst) worst = e, worst_x = x[i];
    } else {  // gradual underflow: within a few subnormal steps, never negative
      ASSERT_GE(y[i], 0.0f) << x[i];
      ASSERT_NEAR(y[i], exact, 4 * 1.401298464324817e-45) << x[i];
    }
  }
  EXPECT_LE(worst, 2.0) << "at x = " << worst_x;
}

TEST(ExpCpu, ShiftSpecialValuesAndPositions) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x = {0.0f, -inf, inf, std::numeric_limits<float>::quiet_NaN(), 3.0f, 2.5f,
                          -200.0f, 1.0f, 2.0f};
  std::vector<float> y(x.size());
  exp_shifted_f32(x.data(), y.data(), static_cast<int64_t>(x.size()), 3.0f);
  EXPECT_FLOAT_EQ(y[0], std::exp(-3.0f));
  EXPECT_EQ(y[1], 0.0f);
  EXPECT_TRUE(std::isinf(y[2]));
  EXPECT_TRUE(std::isnan(y[3]));
  EXPECT_EQ(y[4], 1.0f);
  EXPECT_FLOAT_EQ(y[5], std::exp(-0.5f));
  EXPECT_EQ(y[6], 0.0f);
  for (size_t start = 0; start < x.size(); ++start) {  // every start and length, same bits
    for (size_t len = 0; start + len <= x.size(); ++len) {
      std::vector<float> part(len);
      exp_shifted_f32(x.data() + start, part.data(), static_cast<int64_t>(len), 3.0f);
      for (size_t i = 0; i < len; ++i) {
        ASSERT_EQ(std::bit_cast<uint32_t>(part[i]), std::bit_cast<uint32_t>(y[start + i]));
      }
    }
  }
}

}  // namespace
}  // namespace qforge

namespace qforge {
namespace {

TEST(SigmoidCpu, NearTheExactLogisticWithItsSpecialValues) {
  std::vector<float> x;
  for (float v = -120.0f; v <= 120.0f; v += 0.00731f) x.push_back(v);
  const float inf = std::numeric_limits<float>::infinity();
  x.insert(x.end(), {inf, -inf, 0.0f, -0.0f, std::numeric_limits<float>::quiet_NaN()});
  std::vector<float> y(x.size()), four(x.size());
  sigmoid_f32(x.data(), y.data(), static_cast<int64_t>(x.size()));
  for (const VmathLanes lanes : {VmathLanes::Four, VmathLanes::Eight}) {
    sigmoid_f32(x.data(), four.data(), static_cast<int64_t>(x.size()), lanes);
    EXPECT_EQ(std::memcmp(four.data(), y.data(), y.size() * sizeof(float)), 0);
  }
  double worst = 0;
  for (size_t i = 0; i + 5 < x.size(); ++i) {
    const double exact = 1.0 / (1.0 + std::exp(-static_cast<double>(x[i])));
    if (exact < 1.1754943508222875e-38) {
      EXPECT_NEAR(y[i], exact, 1e-44) << x[i];
      continue;
    }
    worst = std::max(worst, ulp_error(y[i], exact));
  }
  EXPECT_LE(worst, 4.0);
  const size_t s = x.size() - 5;
  EXPECT_EQ(y[s], 1.0f);
  EXPECT_EQ(y[s + 1], 0.0f);
  EXPECT_EQ(y[s + 2], 0.5f);
  EXPECT_EQ(y[s + 3], 0.5f);
  EXPECT_TRUE(std::isnan(y[s + 4]));
}

}  // namespace
}  // namespace qforge
