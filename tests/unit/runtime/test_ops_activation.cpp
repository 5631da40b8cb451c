// Activations and softmax semantics against hand-computed values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tests/unit/runtime/runtime_test_util.h"

using namespace qforge;
using namespace qforge::rt_test;

TEST(Activation, PointwiseOps) {
  const Tensor x = f32({4}, {-2, -0.5f, 0, 3});
  EXPECT_EQ(values<float>(run1({"Relu", {x}})), (std::vector<float>{0, 0, 0, 3}));
  EXPECT_EQ(values<int32_t>(run1({"Relu", {i32({2}, {-3, 4})}})), (std::vector<int32_t>{0, 4}));
  expect_near_all(values<float>(run1({"LeakyRelu", {x}, {attr_float("alpha", 0.1f)}})),
                  {-0.2f, -0.05f, 0, 3});
  expect_near_all(values<float>(run1({"LeakyRelu", {x}})), {-0.02f, -0.005f, 0, 3});
  expect_near_all(values<float>(run1({"Sigmoid", {f32({3}, {0, 2, -100})}})),
                  {0.5f, 0.880797f, 0.0f});
  expect_near_all(values<float>(run1({"Tanh", {f32({2}, {0, 1})}})), {0.0f, 0.761594f});
  expect_near_all(values<float>(run1({"Erf", {f32({3}, {0, 0.5f, -1})}})),
                  {0.0f, 0.520500f, -0.842701f});
  expect_near_all(values<float>(run1({"PRelu", {x, f32({1}, {0.5f})}})), {-1, -0.25f, 0, 3});
  expect_near_all(values<float>(run1({"HardSigmoid", {f32({3}, {-5, 0, 1})}})), {0, 0.5f, 0.7f});
  expect_near_all(values<float>(run1({"Elu", {f32({2}, {-1, 2})}})), {std::exp(-1.0f) - 1, 2});
  expect_near_all(values<float>(run1({"Softplus", {f32({2}, {0, 1})}})),
                  {std::log(2.0f), 1.313262f});
}

TEST(Activation, GeluExactAndTanh) {
  const Tensor x = f32({3}, {-1, 0, 1});
  expect_near_all(values<float>(run1({"Gelu", {x}, {}, 1, 20})), {-0.158655f, 0, 0.841345f});
  expect_near_all(values<float>(run1({"Gelu", {x}, {attr_string("approximate", "tanh")}, 1, 20})),
                  {-0.158808f, 0, 0.841192f});
  EXPECT_EQ(catch_error([&] {
              run1({"Gelu", {x}, {attr_string("approximate", "fast")}, 1, 20});
            }).category,
            ErrorCategory::InvalidInput);
}

TEST(Softmax, Opset13ReducesOneAxis) {
  const Tensor x = f32({2, 2}, {1, 2, 3, 4});
  // axis 0: each column [1,3] and [2,4] is normalized on its own.
  expect_near_all(values<float>(run1({"Softmax", {x}, {attr_int("axis", 0)}, 1, 13})),
                  {0.119203f, 0.119203f, 0.880797f, 0.880797f});
  // default axis -1 on [1,2,2]: rows.
  expect_near_all(values<float>(run1({"Softmax", {f32({1, 2, 2}, {1, 2, 3, 4})}, {}, 1, 13})),
                  {0.268941f, 0.731059f, 0.268941f, 0.731059f});
}

TEST(Softmax, BeforeOpset13CoercesTo2D) {
  // Default axis 1 on [1,2,2] flattens to [1,4]: all four values share one softmax.
  const std::vector<float> all4 = {0.0320586f, 0.0871443f, 0.2368828f, 0.6439142f};
  expect_near_all(values<float>(run1({"Softmax", {f32({1, 2, 2}, {1, 2, 3, 4})}, {}, 1, 11})),
                  all4);
  expect_near_all(
      values<float>(run1({"Softmax", {f32({2, 2}, {1, 2, 3, 4})}, {attr_int("axis", 0)}, 1, 11})),
      all4);
  std::vector<float> logs;
  for (float v : all4) logs.push_back(std::log(v));
  expect_near_all(values<float>(run1({"LogSoftmax", {f32({1, 2, 2}, {1, 2, 3, 4})}, {}, 1, 11})),
                  logs);
}

TEST(Softmax, LogSoftmaxIsStableForLargeInputs) {
  const Tensor y = run1({"LogSoftmax", {f32({2}, {1000, 1001})}, {}, 1, 13});
  expect_near_all(values<float>(y), {-1.313262f, -0.313262f});
  const Tensor s = run1({"Softmax", {f32({2}, {1000, 1001})}, {}, 1, 13});
  expect_near_all(values<float>(s), {0.268941f, 0.731059f});
}

// Erf and exact Gelu run through the array kernel (kernels/cpu/vmath_cpu.h) in chunks among the
// threads: the same bits with 1 and 2 threads, and within 2.5e-7 of the exact values.
TEST(Activation, ErfAndGeluSameBitsForEveryThreadCount) {
  std::vector<float> v(70001);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (float& e : v) e = normal(rng);
  const Tensor x = f32({static_cast<int64_t>(v.size())}, v);
  for (const char* op : {"Erf", "Gelu"}) {
    const OneNode spec{op, {x}, {}, 1, 20};
    const std::vector<float> one = values<float>(run_node(spec, 1).at(0));
    const std::vector<float> two = values<float>(run_node(spec, 2).at(0));
    ASSERT_EQ(one.size(), v.size());
    EXPECT_EQ(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)), 0) << op;
    for (size_t i = 0; i < v.size(); i += 97) {
      const double d = v[i];
      const double exact = std::string(op) == "Erf" ? std::erf(d)
                                                     : 0.5 * d * (1 + std::erf(d / std::sqrt(2.0)));
      EXPECT_NEAR(one[i], exact, 2.5e-7 * std::max(1.0, std::fabs(exact))) << op << " " << d;
    }
  }
}

// Softmax over the last axis takes exp from the vector kernel: the same bits with 1 and 2
// threads, and within 1e-5 of a double-precision softmax (f32 sums of 333 terms).
TEST(Activation, SoftmaxLastAxisSameBitsForEveryThreadCount) {
  const int64_t rows = 64, n = 333;
  std::vector<float> v(static_cast<size_t>(rows * n));
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  for (float& e : v) e = normal(rng);
  v[5] = -std::numeric_limits<float>::infinity();  // a masked position
  const Tensor x = f32({rows, n}, v);
  for (const char* op : {"Softmax", "LogSoftmax"}) {
    const OneNode spec{op, {x}, {}, 1, 20};
    const std::vector<float> one = values<float>(run_node(spec, 1).at(0));
    const std::vector<float> two = values<float>(run_node(spec, 2).at(0));
    ASSERT_EQ(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)), 0) << op;
    const bool log = std::string(op) == "LogSoftmax";
    for (int64_t r = 0; r < rows; ++r) {
      double mx = -INFINITY, sum = 0;
      for (int64_t i = 0; i < n; ++i) mx = std::max(mx, double(v[size_t(r * n + i)]));
      for (int64_t i = 0; i < n; ++i) sum += std::exp(double(v[size_t(r * n + i)]) - mx);
      for (int64_t i = 0; i < n; ++i) {
        const double d = double(v[size_t(r * n + i)]) - mx;
        const double want = log ? d - std::log(sum) : std::exp(d) / sum;
        const float got = one[size_t(r * n + i)];
        if (std::isinf(want)) {
          EXPECT_TRUE(std::isinf(got)) << op;
        } else {
          EXPECT_NEAR(got, want, 1e-5 * std::max(1.0, std::fabs(want))) << op << " " << r;
        }
      }
    }
  }
}
