// Reductions (axes attribute vs input by opset, keepdims, noop_with_empty_axes) and
// QuantizeLinear/DequantizeLinear (rounding, saturation, per-axis, int4, blocked).
#include <gtest/gtest.h>

#include <cmath>

#include "tests/unit/runtime/runtime_test_util.h"

using namespace qforge;
using namespace qforge::rt_test;

namespace {
const Tensor kX23 = f32({2, 3}, {1, 2, 3, 4, 5, 6});
}

TEST(Reduce, SumAxesAttributeBefore13InputAfter) {
  Tensor y = run1({"ReduceSum", {kX23}, {attr_ints("axes", {1})}, 1, 11});
  EXPECT_EQ(y.shape(), (Shape{2, 1}));
  EXPECT_EQ(values<float>(y), (std::vector<float>{6, 15}));
  y = run1({"ReduceSum", {kX23, i64({1}, {0})}, {attr_int("keepdims", 0)}, 1, 13});
  EXPECT_EQ(y.shape(), (Shape{3}));
  EXPECT_EQ(values<float>(y), (std::vector<float>{5, 7, 9}));
  y = run1({"ReduceSum", {kX23}, {}, 1, 13});  // no axes: everything
  EXPECT_EQ(y.shape(), (Shape{1, 1}));
  EXPECT_EQ(values<float>(y), (std::vector<float>{21}));
  y = run1({"ReduceSum", {kX23}, {attr_int("noop_with_empty_axes", 1)}, 1, 13});
  EXPECT_TRUE(y.equals(kX23));
}

TEST(Reduce, OtherKindsAttributeBefore18InputAfter) {
  EXPECT_EQ(values<float>(run1({"ReduceMean", {kX23}, {attr_ints("axes", {1})}, 1, 17})),
            (std::vector<float>{2, 5}));
  EXPECT_EQ(values<float>(run1({"ReduceMean", {kX23, i64({1}, {-1})}, {}, 1, 18})),
            (std::vector<float>{2, 5}));
  EXPECT_EQ(values<float>(run1({"ReduceMax", {kX23, i64({1}, {1})}, {}, 1, 18})),
            (std::vector<float>{3, 6}));
  EXPECT_EQ(values<float>(run1({"ReduceMin", {kX23}, {attr_ints("axes", {0})}, 1, 13})),
            (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(values<float>(run1({"ReduceProd", {kX23, i64({1}, {1})}, {}, 1, 18})),
            (std::vector<float>{6, 120}));
  EXPECT_EQ(values<float>(run1({"ReduceSumSquare", {kX23, i64({1}, {1})}, {}, 1, 18})),
            (std::vector<float>{14, 77}));
  expect_near_all(values<float>(run1({"ReduceL2", {kX23, i64({1}, {1})}, {}, 1, 18})),
                  {std::sqrt(14.0f), std::sqrt(77.0f)});
  expect_near_all(
      values<float>(
          run1({"ReduceLogSumExp", {f32({2}, {1000, 1000})}, {attr_int("keepdims", 0)}, 1, 18})),
      {1000 + std::log(2.0f)});
  EXPECT_EQ(values<int64_t>(
                run1({"ReduceMax", {i64({3}, {4, -9, 7})}, {attr_int("keepdims", 0)}, 1, 18})),
            (std::vector<int64_t>{7}));
  // Reducing an empty axis gives the identity of the reduction.
  const Tensor empty = f32({2, 0}, {});
  EXPECT_EQ(values<float>(run1({"ReduceSum", {empty, i64({1}, {1})}, {}, 1, 18})),
            (std::vector<float>{0, 0}));
  EXPECT_EQ(values<float>(run1({"ReduceMax", {empty, i64({1}, {1})}, {}, 1, 18}))[0], -INFINITY);
}

TEST(Reduce, MeanOverTwoAxesAnd3D) {
  const Tensor x = f32({2, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  const Tensor y = run1({"ReduceMean", {x, i64({2}, {0, 2})}, {attr_int("keepdims", 0)}, 1, 18});
  EXPECT_EQ(values<float>(y), (std::vector<float>{(1 + 2 + 5 + 6) / 4.0f, (3 + 4 + 7 + 8) / 4.0f}));
}

TEST(QuantizeLinear, RoundsHalfToEvenAndSaturates) {
  const Tensor x = f32({7}, {0.5f, 1.5f, 2.5f, -0.5f, -1.5f, 300, -300});
  Tensor q =
      run1({"QuantizeLinear", {x, f32({}, {1}), make<int8_t>(DType::I8, {}, {0})}, {}, 1, 13});
  EXPECT_EQ(q.dtype(), DType::I8);
  EXPECT_EQ(values<int8_t>(q), (std::vector<int8_t>{0, 2, 2, 0, -2, 127, -128}));
  q = run1({"QuantizeLinear", {x, f32({}, {1}), make<uint8_t>(DType::U8, {}, {128})}, {}, 1, 13});
  EXPECT_EQ(values<uint8_t>(q), (std::vector<uint8_t>{128, 130, 130, 128, 126, 255, 0}));
  // No zero point: uint8 with zero point 0.
  q = run1({"QuantizeLinear", {f32({2}, {-1, 3}), f32({}, {2})}, {}, 1, 13});
  EXPECT_EQ(q.dtype(), DType::U8);
  EXPECT_EQ(values<uint8_t>(q), (std::vector<uint8_t>{0, 2}));  // 1.5 -> 2
}

TEST(QuantizeLinear, PerAxisInt4AndBlocked) {
  const Tensor x = f32({2, 2}, {1, 2, 3, 4});
  Tensor q = run1(
      {"QuantizeLinear", {x, f32({2}, {1, 2}), make<int8_t>(DType::I8, {2}, {0, 1})}, {}, 1, 13});
  EXPECT_EQ(values<int8_t>(q), (std::vector<int8_t>{1, 2, 3, 3}));
  q = run1({"QuantizeLinear",
            {x, f32({2}, {1, 2}), make<int8_t>(DType::I8, {2}, {0, 0})},
            {attr_int("axis", 0)},
            1,
            13});
  EXPECT_EQ(values<int8_t>(q), (std::vector<int8_t>{1, 2, 2, 2}));  // 1.5 -> 2, 2 -> 2
  // int4: saturate to [-8, 7], two per byte, low nibble first.
  Tensor zp4(DType::I4, {});
  q = run1({"QuantizeLinear", {f32({5}, {-9, -8, 7, 8, 1}), f32({}, {1}), zp4}, {}, 1, 21});
  EXPECT_EQ(q.dtype(), DType::I4);
  EXPECT_EQ(values<uint8_t>(q), (std::vector<uint8_t>{0x88, 0x77, 0x01}));
  // Blocked along axis 1 with block_size 2: one scale per pair.
  q = run1(
      {"QuantizeLinear",
       {f32({1, 4}, {1, 2, 3, 4}), f32({1, 2}, {1, 2}), make<int8_t>(DType::I8, {1, 2}, {0, 0})},
       {attr_int("axis", 1), attr_int("block_size", 2)},
       1,
       21});
  EXPECT_EQ(values<int8_t>(q), (std::vector<int8_t>{1, 2, 2, 2}));
  const auto e = catch_error([&] {
    run1({"QuantizeLinear",
          {x, f32({3}, {1, 2, 3}), make<int8_t>(DType::I8, {3}, {0, 0, 0})},
          {},
          1,
          13});
  });
  EXPECT_EQ(
      e.message,
      "op 'QuantizeLinear' (node 'n'): per-axis scale [3] needs 2 values for axis 1 of [2, 2]");
}

TEST(DequantizeLinear, Int8Int32Int4PerAxis) {
  Tensor y = run1({"DequantizeLinear",
                   {make<int8_t>(DType::I8, {3}, {-128, 0, 127}), f32({}, {0.5f}),
                    make<int8_t>(DType::I8, {}, {-1})},
                   {},
                   1,
                   13});
  EXPECT_EQ(values<float>(y), (std::vector<float>{-63.5f, 0.5f, 64}));
  y = run1({"DequantizeLinear", {i32({2}, {1000000, -3}), f32({}, {0.001f})}, {}, 1, 13});
  expect_near_all(values<float>(y), {1000.0f, -0.003f}, 1e-3f);
  Tensor q4(DType::U4, {3});
  q4.mutable_data<uint8_t>()[0] = 0xf1;  // 1, 15
  q4.mutable_data<uint8_t>()[1] = 0x08;  // 8
  y = run1({"DequantizeLinear", {q4, f32({}, {2}), Tensor(DType::U4, {})}, {}, 1, 21});
  EXPECT_EQ(values<float>(y), (std::vector<float>{2, 30, 16}));
  y = run1({"DequantizeLinear",
            {make<uint8_t>(DType::U8, {2, 2}, {10, 20, 30, 40}), f32({2}, {1, 0.1f}),
             make<uint8_t>(DType::U8, {2}, {10, 0})},
            {attr_int("axis", 0)},
            1,
            13});
  expect_near_all(values<float>(y), {0, 10, 3, 4});
}

TEST(QuantizeDequantize, RoundTripWithinHalfAStep) {
  const Tensor x = random_f32({4, 33}, 5, -3, 3);
  const Tensor scale = f32({}, {6.0f / 255});
  const Tensor zp = make<uint8_t>(DType::U8, {}, {128});
  const Tensor q = run1({"QuantizeLinear", {x, scale, zp}, {}, 1, 13});
  const Tensor back = run1({"DequantizeLinear", {q, scale, zp}, {}, 1, 13});
  const auto a = values<float>(x), b = values<float>(back);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_LE(std::fabs(a[i] - b[i]), 3.0f / 255 + 1e-6f) << i;
}

// CumSum against the values ONNX's operator documentation gives (test_cumsum_1d*) and against a
// naive running sum over every axis of a 3-D input.
TEST(CumSum, OneDimensionalAsOnnxDocuments) {
  const Tensor x = f32({5}, {1, 2, 3, 4, 5});
  const Tensor axis = i64({}, {0});
  EXPECT_EQ(values<float>(run1({"CumSum", {x, axis}, {}, 1, 14})),
            (std::vector<float>{1, 3, 6, 10, 15}));
  EXPECT_EQ(values<float>(run1({"CumSum", {x, axis}, {attr_int("exclusive", 1)}, 1, 14})),
            (std::vector<float>{0, 1, 3, 6, 10}));
  EXPECT_EQ(values<float>(run1({"CumSum", {x, axis}, {attr_int("reverse", 1)}, 1, 14})),
            (std::vector<float>{15, 14, 12, 9, 5}));
  EXPECT_EQ(values<float>(run1({"CumSum", {x, axis},
                                {attr_int("reverse", 1), attr_int("exclusive", 1)}, 1, 14})),
            (std::vector<float>{14, 12, 9, 5, 0}));
}

TEST(CumSum, EveryAxisOf3DMatchesANaiveRunningSum) {
  const Shape shape = {2, 3, 4};
  std::vector<int64_t> xs(24);
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = static_cast<int64_t>((i * 7) % 5) - 2;
  const Tensor x = i64(shape, xs);
  for (int64_t axis = -3; axis < 3; ++axis) {
    const int64_t a = axis < 0 ? axis + 3 : axis;
    for (int exclusive = 0; exclusive < 2; ++exclusive) {
      for (int reverse = 0; reverse < 2; ++reverse) {
        const Tensor y = run1({"CumSum",
                               {x, i32({1}, {static_cast<int32_t>(axis)})},
                               {attr_int("exclusive", exclusive), attr_int("reverse", reverse)},
                               1,
                               14});
        ASSERT_EQ(y.dtype(), DType::I64);
        ASSERT_EQ(y.shape(), shape);
        const std::vector<int64_t> got = values<int64_t>(y);
        for (int64_t i = 0; i < 2; ++i)
          for (int64_t j = 0; j < 3; ++j)
            for (int64_t k = 0; k < 4; ++k) {
              const int64_t idx[3] = {i, j, k};
              int64_t want = 0;
              for (int64_t m = 0; m < shape[static_cast<size_t>(a)]; ++m) {
                const int64_t at = idx[a];
                const bool in = reverse ? (exclusive ? m > at : m >= at)
                                        : (exclusive ? m < at : m <= at);
                if (!in) continue;
                int64_t src[3] = {i, j, k};
                src[a] = m;
                want += xs[static_cast<size_t>((src[0] * 3 + src[1]) * 4 + src[2])];
              }
              EXPECT_EQ(got[static_cast<size_t>((i * 3 + j) * 4 + k)], want)
                  << "axis " << axis << " exclusive " << exclusive << " reverse " << reverse;
            }
      }
    }
  }
}

TEST(CumSum, RefusesAnAxisOutOfRangeOrOfSeveralValues) {
  const Tensor x = f32({2, 2}, {1, 2, 3, 4});
  EXPECT_THROW(run1({"CumSum", {x, i64({}, {2})}, {}, 1, 14}), Error);
  EXPECT_THROW(run1({"CumSum", {x, i64({2}, {0, 1})}, {}, 1, 14}), Error);
}
