// Arithmetic, logic and broadcasting against hand-computed values.
#include <gtest/gtest.h>

#include <cmath>

#include "ir/half.h"
#include "tests/unit/runtime/runtime_test_util.h"

using namespace qforge;
using namespace qforge::rt_test;

TEST(Broadcast, RowColumnAndScalar) {
  // [2,1] + [3] -> [2,3]
  Tensor y = run1({"Add", {f32({2, 1}, {10, 20}), f32({3}, {1, 2, 3})}});
  EXPECT_EQ(y.shape(), (Shape{2, 3}));
  EXPECT_EQ(values<float>(y), (std::vector<float>{11, 12, 13, 21, 22, 23}));
  // scalar * [2,2]
  y = run1({"Mul", {f32({}, {3}), f32({2, 2}, {1, 2, 3, 4})}});
  EXPECT_EQ(values<float>(y), (std::vector<float>{3, 6, 9, 12}));
}

TEST(Broadcast, MiddleAxisAndHigherRank) {
  // [2,1,2] - [1,3,1] -> [2,3,2]
  Tensor y = run1({"Sub", {f32({2, 1, 2}, {1, 2, 3, 4}), f32({1, 3, 1}, {0, 10, 100})}});
  EXPECT_EQ(y.shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(values<float>(y), (std::vector<float>{1, 2, -9, -8, -99, -98, 3, 4, -7, -6, -97, -96}));
  // [4] / [2,3,1,1]... broadcast to [2,3,1,4] with a zero-size-free rank jump
  y = run1({"Div", {f32({4}, {2, 4, 6, 8}), f32({2, 1, 1}, {2, 1})}});
  EXPECT_EQ(y.shape(), (Shape{2, 1, 4}));
  EXPECT_EQ(values<float>(y), (std::vector<float>{1, 2, 3, 4, 2, 4, 6, 8}));
}

TEST(Broadcast, EmptyAndMismatch) {
  Tensor y = run1({"Add", {f32({0, 3}, {}), f32({3}, {1, 2, 3})}});
  EXPECT_EQ(y.shape(), (Shape{0, 3}));
  const auto e = catch_error([] {
    run1({"Add", {f32({2, 3}, std::vector<float>(6)), f32({2}, {1, 2})}});
  });
  EXPECT_EQ(e.category, ErrorCategory::InvalidInput);
  EXPECT_EQ(e.message, "op 'Add' (node 'n'): shapes [2, 3] and [2] do not broadcast");
}

TEST(Arithmetic, IntegerOps) {
  EXPECT_EQ(values<int64_t>(run1({"Add", {i64({3}, {1, 2, 3}), i64({1}, {-5})}})),
            (std::vector<int64_t>{-4, -3, -2}));
  // Integer Div truncates toward zero.
  EXPECT_EQ(values<int32_t>(run1({"Div", {i32({4}, {7, -7, 7, -7}), i32({4}, {2, 2, -2, -2})}})),
            (std::vector<int32_t>{3, -3, -3, 3}));
  const auto e = catch_error([] { run1({"Div", {i64({1}, {1}), i64({1}, {0})}}); });
  EXPECT_EQ(e.message, "op 'Div' (node 'n'): integer division by zero");
  EXPECT_EQ(values<int64_t>(run1({"Neg", {i64({2}, {3, -4})}})), (std::vector<int64_t>{-3, 4}));
  EXPECT_EQ(values<int64_t>(run1({"Abs", {i64({2}, {3, -4})}})), (std::vector<int64_t>{3, 4}));
}

TEST(Arithmetic, MixedDtypesAreRejected) {
  const auto e = catch_error([] { run1({"Add", {f32({1}, {1}), i64({1}, {1})}}); });
  EXPECT_EQ(e.category, ErrorCategory::InvalidInput);
  EXPECT_EQ(e.message, "op 'Add' (node 'n'): inputs have different dtypes (f32 and i64)");
}

TEST(Arithmetic, UnsupportedDtypeNamesOpNodeAndDtype) {
  const auto e = catch_error([] { run1({"Sqrt", {i64({1}, {4})}}); });
  EXPECT_EQ(e.category, ErrorCategory::Unsupported);
  EXPECT_EQ(e.message,
            "op 'Sqrt' (node 'n'): input 0 'in0' has dtype i64, which the qforge runtime does not "
            "support for this op");
}

TEST(Arithmetic, PowWithMixedExponentTypes) {
  EXPECT_EQ(values<float>(run1({"Pow", {f32({3}, {2, 3, 4}), f32({1}, {2})}})),
            (std::vector<float>{4, 9, 16}));
  expect_near_all(values<float>(run1({"Pow", {f32({2}, {4, 9}), f32({2}, {0.5f, -1})}})),
                  {2.0f, 1.0f / 9.0f});
  EXPECT_EQ(values<float>(run1({"Pow", {f32({2}, {2, 3}), i64({2}, {3, 2})}})),
            (std::vector<float>{8, 9}));
  EXPECT_EQ(values<int64_t>(run1({"Pow", {i64({2}, {2, 3}), i64({2}, {10, 3})}})),
            (std::vector<int64_t>{1024, 27}));
}

TEST(Arithmetic, UnaryFloatOps) {
  const Tensor x = f32({3}, {0.25f, 1.0f, 4.0f});
  expect_near_all(values<float>(run1({"Sqrt", {x}})), {0.5f, 1.0f, 2.0f});
  expect_near_all(values<float>(run1({"Exp", {x}})),
                  {std::exp(0.25f), std::exp(1.0f), std::exp(4.0f)});
  expect_near_all(values<float>(run1({"Log", {x}})), {std::log(0.25f), 0.0f, std::log(4.0f)});
  expect_near_all(values<float>(run1({"Reciprocal", {x}})), {4.0f, 1.0f, 0.25f});
  EXPECT_EQ(values<float>(run1({"Round", {f32({4}, {0.5f, 1.5f, 2.5f, -0.5f})}})),
            (std::vector<float>{0, 2, 2, -0}));
}

TEST(Arithmetic, SinAndCos) {
  const float pi = 3.14159265358979f;
  const Tensor x = f32({5}, {0.0f, pi / 6, pi / 2, -pi, 10.0f});
  expect_near_all(values<float>(run1({"Sin", {x}})), {0.0f, 0.5f, 1.0f, 0.0f, std::sin(10.0f)},
                  1e-6f);
  expect_near_all(values<float>(run1({"Cos", {x}})),
                  {1.0f, std::sqrt(3.0f) / 2, 0.0f, -1.0f, std::cos(10.0f)}, 1e-6f);
  const Tensor d = make(DType::F64, {2}, std::vector<double>{1.0, -2.5});
  EXPECT_EQ(values<double>(run1({"Sin", {d}})),
            (std::vector<double>{std::sin(1.0), std::sin(-2.5)}));
  const auto e = catch_error([] { run1({"Cos", {i64({1}, {4})}}); });
  EXPECT_EQ(e.category, ErrorCategory::Unsupported);
}

TEST(Arithmetic, Float16IsComputedInF32AndRoundedBack) {
  Tensor a(DType::F16, {2});
  auto d = a.mutable_data<uint16_t>();
  d[0] = f32_to_f16(1.5f);
  d[1] = f32_to_f16(-2.0f);
  const Tensor y = run1({"Mul", {a, a}});
  ASSERT_EQ(y.dtype(), DType::F16);
  EXPECT_EQ(y.to_f32(), (std::vector<float>{2.25f, 4.0f}));
}

TEST(Arithmetic, VariadicMaxMinSumMean) {
  const Tensor a = f32({3}, {1, 5, 3}), b = f32({3}, {4, 2, 6}), c = f32({1}, {3});
  EXPECT_EQ(values<float>(run1({"Max", {a, b, c}})), (std::vector<float>{4, 5, 6}));
  EXPECT_EQ(values<float>(run1({"Min", {a, b, c}})), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(values<float>(run1({"Sum", {a, b, c}})), (std::vector<float>{8, 10, 12}));
  expect_near_all(values<float>(run1({"Mean", {a, b}})), {2.5f, 3.5f, 4.5f});
  EXPECT_EQ(values<float>(run1({"Max", {a}})), values<float>(a));
}

TEST(Clip, AttributesBeforeOpset11InputsAfter) {
  const Tensor x = f32({4}, {-2, -0.5f, 0.5f, 2});
  EXPECT_EQ(values<float>(run1({"Clip", {x}, {attr_float("min", -1), attr_float("max", 1)}, 1, 6})),
            (std::vector<float>{-1, -0.5f, 0.5f, 1}));
  EXPECT_EQ(values<float>(run1({"Clip", {x, f32({}, {0}), f32({}, {1})}, {}, 1, 13})),
            (std::vector<float>{0, 0, 0.5f, 1}));
  // Only max given (min absent).
  EXPECT_EQ(values<float>(run1({"Clip", {x, Tensor(), f32({}, {0})}, {}, 1, 13})),
            (std::vector<float>{-2, -0.5f, 0, 0}));
  EXPECT_EQ(values<int64_t>(run1({"Clip", {i64({3}, {-5, 0, 5}), i64({}, {-1}), i64({}, {1})}})),
            (std::vector<int64_t>{-1, 0, 1}));
}

TEST(Logic, ComparisonsGiveBool) {
  const Tensor a = f32({3}, {1, 2, 3}), b = f32({1}, {2});
  Tensor y = run1({"Equal", {a, b}});
  EXPECT_EQ(y.dtype(), DType::Bool);
  EXPECT_EQ(values<uint8_t>(y), (std::vector<uint8_t>{0, 1, 0}));
  EXPECT_EQ(values<uint8_t>(run1({"Greater", {a, b}})), (std::vector<uint8_t>{0, 0, 1}));
  EXPECT_EQ(values<uint8_t>(run1({"GreaterOrEqual", {a, b}})), (std::vector<uint8_t>{0, 1, 1}));
  EXPECT_EQ(values<uint8_t>(run1({"Less", {a, b}})), (std::vector<uint8_t>{1, 0, 0}));
  EXPECT_EQ(values<uint8_t>(run1({"LessOrEqual", {a, b}})), (std::vector<uint8_t>{1, 1, 0}));
  EXPECT_EQ(values<uint8_t>(run1({"Equal", {i64({2}, {7, 8}), i64({2}, {7, 9})}})),
            (std::vector<uint8_t>{1, 0}));
}

TEST(Logic, BoolOpsAndPredicates) {
  const Tensor p = boolean({4}, {0, 0, 1, 1}), q = boolean({4}, {0, 1, 0, 1});
  EXPECT_EQ(values<uint8_t>(run1({"And", {p, q}})), (std::vector<uint8_t>{0, 0, 0, 1}));
  EXPECT_EQ(values<uint8_t>(run1({"Or", {p, q}})), (std::vector<uint8_t>{0, 1, 1, 1}));
  EXPECT_EQ(values<uint8_t>(run1({"Xor", {p, q}})), (std::vector<uint8_t>{0, 1, 1, 0}));
  EXPECT_EQ(values<uint8_t>(run1({"Not", {p}})), (std::vector<uint8_t>{1, 1, 0, 0}));
  const float inf = INFINITY;
  const Tensor x = f32({4}, {NAN, inf, -inf, 1});
  EXPECT_EQ(values<uint8_t>(run1({"IsNaN", {x}})), (std::vector<uint8_t>{1, 0, 0, 0}));
  EXPECT_EQ(values<uint8_t>(run1({"IsInf", {x}})), (std::vector<uint8_t>{0, 1, 1, 0}));
  EXPECT_EQ(values<uint8_t>(run1({"IsInf", {x}, {attr_int("detect_negative", 0)}})),
            (std::vector<uint8_t>{0, 1, 0, 0}));
  EXPECT_EQ(catch_error([] {
              run1({"Not", {f32({1}, {1})}});
            }).category,
            ErrorCategory::Unsupported);
}

TEST(Logic, WhereBroadcastsAllThree) {
  const Tensor c = boolean({2, 1}, {1, 0});
  const Tensor x = f32({3}, {1, 2, 3});
  const Tensor y = f32({}, {-1});
  const Tensor out = run1({"Where", {c, x, y}});
  EXPECT_EQ(out.shape(), (Shape{2, 3}));
  EXPECT_EQ(values<float>(out), (std::vector<float>{1, 2, 3, -1, -1, -1}));
  EXPECT_EQ(
      values<int64_t>(run1({"Where", {boolean({2}, {0, 1}), i64({2}, {1, 2}), i64({2}, {3, 4})}})),
      (std::vector<int64_t>{3, 2}));
}
