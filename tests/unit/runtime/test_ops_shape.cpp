// Shape, data-movement and constant ops against hand-computed values, including the
// attribute-to-input changes across opsets.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "ir/half.h"
#include "tests/unit/runtime/runtime_test_util.h"

using namespace qforge;
using namespace qforge::rt_test;

namespace {
Tensor iota(Shape shape) {
  Tensor t(DType::F32, shape);
  auto d = t.mutable_data<float>();
  for (size_t i = 0; i < d.size(); ++i) d[i] = static_cast<float>(i);
  return t;
}
}  // namespace

TEST(Reshape, ZeroMinusOneAndAllowZero) {
  const Tensor x = iota({2, 3, 4});
  Tensor y = run1({"Reshape", {x, i64({3}, {0, -1, 2})}});
  EXPECT_EQ(y.shape(), (Shape{2, 6, 2}));
  EXPECT_EQ(y.storage(), x.storage());  // a view
  EXPECT_EQ(run1({"Reshape", {x, i64({2}, {-1, 4})}}).shape(), (Shape{6, 4}));
  // allowzero=1 keeps 0 as a real zero dim.
  y = run1({"Reshape", {f32({0, 3}, {}), i64({2}, {3, 0})}, {attr_int("allowzero", 1)}});
  EXPECT_EQ(y.shape(), (Shape{3, 0}));
  const auto e = catch_error([&] { run1({"Reshape", {x, i64({2}, {5, -1})}}); });
  EXPECT_EQ(e.message, "op 'Reshape' (node 'n'): cannot reshape [2, 3, 4] to [5, -1]");
}

TEST(Transpose, DefaultAndPerm) {
  const Tensor x = iota({2, 3});
  EXPECT_EQ(values<float>(run1({"Transpose", {x}})), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  const Tensor y = run1({"Transpose", {iota({2, 3, 4})}, {attr_ints("perm", {1, 2, 0})}});
  EXPECT_EQ(y.shape(), (Shape{3, 4, 2}));
  const auto v = values<float>(y);
  // y[i][j][k] = x[k][i][j] = k*12 + i*4 + j
  EXPECT_EQ(v[(1 * 4 + 2) * 2 + 1], 12 + 4 + 2);
  EXPECT_EQ(v[(2 * 4 + 3) * 2 + 0], 8 + 3);
  EXPECT_EQ(values<int64_t>(run1({"Transpose", {i64({2, 2}, {1, 2, 3, 4})}})),
            (std::vector<int64_t>{1, 3, 2, 4}));
}

// Every permutation of a rank-4 tensor, against the definition element by element: large
// enough (536,616 elements) that two and three threads split the rows at odd places (each
// chunk's first row found by division, the rest stepped), with 1-, 2-, 4- and 8-byte elements.
TEST(Transpose, EveryPermutationAtAnyThreadCountEqualsTheDefinition) {
  const Shape shape = {8, 9, 29, 257};
  const Tensor x = iota(shape);
  std::vector<int64_t> perm = {0, 1, 2, 3};
  do {
    Shape os;
    for (int64_t p : perm) os.push_back(shape[static_cast<size_t>(p)]);
    // want[o] = the index into x of output element o.
    std::vector<int64_t> want;
    want.reserve(x.numel());
    int64_t idx[4];
    for (idx[0] = 0; idx[0] < os[0]; ++idx[0]) {
      for (idx[1] = 0; idx[1] < os[1]; ++idx[1]) {
        for (idx[2] = 0; idx[2] < os[2]; ++idx[2]) {
          for (idx[3] = 0; idx[3] < os[3]; ++idx[3]) {
            int64_t xi[4];
            for (size_t d = 0; d < 4; ++d) xi[perm[d]] = idx[d];
            want.push_back(((xi[0] * shape[1] + xi[1]) * shape[2] + xi[2]) * shape[3] + xi[3]);
          }
        }
      }
    }
    for (const DType dt : {DType::F32, DType::U8, DType::F16, DType::I64}) {
      const size_t size = dtype_storage_bytes(dt, 1).value();
      Tensor in(dt, shape);
      auto* bytes = reinterpret_cast<uint8_t*>(in.mutable_bytes().data());
      for (size_t e = 0; e < x.numel(); ++e) {  // distinct bytes in every element
        for (size_t b = 0; b < size; ++b) bytes[e * size + b] = static_cast<uint8_t>(e * 7 + b);
      }
      std::vector<uint8_t> expected(x.numel() * size);
      for (size_t o = 0; o < want.size(); ++o) {
        std::memcpy(&expected[o * size], bytes + static_cast<size_t>(want[o]) * size, size);
      }
      for (const int threads : {1, 2, 3}) {
        const Tensor y =
            run_node({"Transpose", {in}, {attr_ints("perm", perm)}}, threads).at(0);
        ASSERT_EQ(y.shape(), os);
        ASSERT_EQ(std::memcmp(y.bytes().data(), expected.data(), expected.size()), 0)
            << "perm " << perm[0] << perm[1] << perm[2] << perm[3] << ", " << size
            << "-byte elements, " << threads << " thread(s)";
      }
    }
  } while (std::next_permutation(perm.begin(), perm.end()));
}

TEST(Flatten, Axes) {
  const Tensor x = iota({2, 3, 4});
  EXPECT_EQ(run1({"Flatten", {x}}).shape(), (Shape{2, 12}));
  EXPECT_EQ(run1({"Flatten", {x}, {attr_int("axis", 0)}}).shape(), (Shape{1, 24}));
  EXPECT_EQ(run1({"Flatten", {x}, {attr_int("axis", -1)}}).shape(), (Shape{6, 4}));
  EXPECT_EQ(run1({"Flatten", {x}, {attr_int("axis", 3)}}).shape(), (Shape{24, 1}));
}

TEST(SqueezeUnsqueeze, AxesAsAttributeBefore13AndInputAfter) {
  const Tensor x = iota({1, 3, 1});
  EXPECT_EQ(run1({"Squeeze", {x}, {}, 1, 13}).shape(), (Shape{3}));
  EXPECT_EQ(run1({"Squeeze", {x, i64({1}, {-1})}, {}, 1, 13}).shape(), (Shape{1, 3}));
  EXPECT_EQ(run1({"Squeeze", {x}, {attr_ints("axes", {0})}, 1, 11}).shape(), (Shape{3, 1}));
  EXPECT_EQ(catch_error([&] {
              run1({"Squeeze", {x, i64({1}, {1})}, {}, 1, 13});
            }).category,
            ErrorCategory::InvalidInput);
  EXPECT_EQ(run1({"Unsqueeze", {iota({3}), i64({2}, {0, -1})}, {}, 1, 13}).shape(),
            (Shape{1, 3, 1}));
  EXPECT_EQ(run1({"Unsqueeze", {iota({3})}, {attr_ints("axes", {1})}, 1, 11}).shape(),
            (Shape{3, 1}));
}

TEST(Concat, AlongAxesWithEmptyInputs) {
  const Tensor a = iota({2, 2}), b = f32({2, 1}, {10, 11}), e = f32({2, 0}, {});
  EXPECT_EQ(values<float>(run1({"Concat", {a, e, b}, {attr_int("axis", 1)}})),
            (std::vector<float>{0, 1, 10, 2, 3, 11}));
  EXPECT_EQ(values<float>(run1({"Concat", {a, f32({1, 2}, {7, 8})}, {attr_int("axis", -2)}})),
            (std::vector<float>{0, 1, 2, 3, 7, 8}));
  const auto err = catch_error([&] { run1({"Concat", {a, b}, {attr_int("axis", 0)}}); });
  EXPECT_EQ(err.message,
            "op 'Concat' (node 'n'): input 1 [2, 1] does not match input 0 [2, 2] outside axis 0");
}

TEST(Split, SizesAttributeInputAndNumOutputs) {
  const Tensor x = iota({5});
  auto out = run_node({"Split", {x}, {attr_ints("split", {2, 3})}, 2, 11});
  EXPECT_EQ(values<float>(out[0]), (std::vector<float>{0, 1}));
  EXPECT_EQ(values<float>(out[1]), (std::vector<float>{2, 3, 4}));
  out = run_node({"Split", {x, i64({2}, {4, 1})}, {}, 2, 13});
  EXPECT_EQ(values<float>(out[1]), (std::vector<float>{4}));
  // Opset 18 num_outputs: ceil(5/3)=2 -> 2, 2, 1.
  out = run_node({"Split", {x}, {attr_int("num_outputs", 3)}, 3, 18});
  EXPECT_EQ(values<float>(out[2]), (std::vector<float>{4}));
  // Equal split along axis 1 of [2,4].
  out = run_node({"Split", {iota({2, 4})}, {attr_int("axis", 1)}, 2, 13});
  EXPECT_EQ(values<float>(out[1]), (std::vector<float>{2, 3, 6, 7}));
  EXPECT_EQ(catch_error([&] {
              run_node({"Split", {x}, {}, 2, 13});
            }).category,
            ErrorCategory::InvalidInput);
}

TEST(Slice, StepsNegativesAndClamping) {
  const Tensor x = iota({3, 4});
  // rows 0..2 step 2, cols from -1 backwards step -2
  Tensor y = run1(
      {"Slice", {x, i64({2}, {0, -1}), i64({2}, {3, -100}), i64({2}, {0, 1}), i64({2}, {2, -2})}});
  EXPECT_EQ(y.shape(), (Shape{2, 2}));
  EXPECT_EQ(values<float>(y), (std::vector<float>{3, 1, 11, 9}));
  y = run1({"Slice", {x, i64({1}, {1}), i64({1}, {1000})}});
  EXPECT_EQ(y.shape(), (Shape{2, 4}));
  EXPECT_EQ(run1({"Slice", {x, i64({1}, {2}), i64({1}, {1})}}).shape(), (Shape{0, 4}));
  // Opset 1: attributes.
  y = run1({"Slice",
            {x},
            {attr_ints("starts", {1}), attr_ints("ends", {3}), attr_ints("axes", {1})},
            1,
            9});
  EXPECT_EQ(values<float>(y), (std::vector<float>{1, 2, 5, 6, 9, 10}));
}

TEST(Gather, AxesAndNegativeIndices) {
  const Tensor x = iota({3, 2});
  Tensor y = run1({"Gather", {x, i64({2, 2}, {0, -1, 1, 0})}});
  EXPECT_EQ(y.shape(), (Shape{2, 2, 2}));
  EXPECT_EQ(values<float>(y), (std::vector<float>{0, 1, 4, 5, 2, 3, 0, 1}));
  y = run1({"Gather", {x, i32({}, {1})}, {attr_int("axis", 1)}});
  EXPECT_EQ(y.shape(), (Shape{3}));
  EXPECT_EQ(values<float>(y), (std::vector<float>{1, 3, 5}));
  const auto e = catch_error([&] { run1({"Gather", {x, i64({1}, {3})}}); });
  EXPECT_EQ(e.message, "op 'Gather' (node 'n'): index 3 is out of range for dim 0 of size 3");
}

TEST(Expand, BidirectionalBroadcast) {
  // [3,1] with shape [1,2] -> [3,2]; the target may also be smaller than the input.
  Tensor y = run1({"Expand", {f32({3, 1}, {1, 2, 3}), i64({2}, {1, 2})}});
  EXPECT_EQ(y.shape(), (Shape{3, 2}));
  EXPECT_EQ(values<float>(y), (std::vector<float>{1, 1, 2, 2, 3, 3}));
  y = run1({"Expand", {f32({2, 1}, {1, 2}), i64({3}, {2, 1, 3})}});
  EXPECT_EQ(y.shape(), (Shape{2, 2, 3}));
  EXPECT_EQ(values<float>(y), (std::vector<float>{1, 1, 1, 2, 2, 2, 1, 1, 1, 2, 2, 2}));
  EXPECT_EQ(catch_error([] {
              run1({"Expand", {f32({3}, {1, 2, 3}), i64({1}, {2})}});
            }).category,
            ErrorCategory::InvalidInput);
}

TEST(ShapeOps, ShapeStartEndSizeIdentityDropout) {
  const Tensor x = iota({2, 3, 4});
  EXPECT_EQ(values<int64_t>(run1({"Shape", {x}})), (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(values<int64_t>(run1({"Shape", {x}, {attr_int("start", -2)}})),
            (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(values<int64_t>(run1({"Shape", {x}, {attr_int("start", 1), attr_int("end", -1)}})),
            (std::vector<int64_t>{3}));
  EXPECT_EQ(values<int64_t>(run1({"Size", {x}})), (std::vector<int64_t>{24}));
  EXPECT_TRUE(run1({"Identity", {x}}).equals(x));
  auto d = run_node({"Dropout", {x, f32({}, {0.5f})}, {}, 2, 13});
  EXPECT_TRUE(d[0].equals(x));
  EXPECT_EQ(d[1].dtype(), DType::Bool);
  EXPECT_EQ(values<uint8_t>(d[1]), std::vector<uint8_t>(24, 1));
  EXPECT_EQ(catch_error([&] {
              run1({"Dropout", {x, f32({}, {0.5f}), boolean({}, {1})}, {}, 1, 13});
            }).category,
            ErrorCategory::Unsupported);
}

TEST(Constants, ConstantConstantOfShapeRange) {
  Attribute v;
  v.name = "value";
  v.type = AttrType::Tensor;
  v.t = i32({2}, {4, 5});
  EXPECT_EQ(values<int32_t>(run1({"Constant", {}, {v}})), (std::vector<int32_t>{4, 5}));
  EXPECT_EQ(values<float>(run1({"Constant", {}, {attr_float("value_float", 2.5f)}})),
            (std::vector<float>{2.5f}));
  EXPECT_EQ(values<int64_t>(run1({"Constant", {}, {attr_ints("value_ints", {1, 2, 3})}})),
            (std::vector<int64_t>{1, 2, 3}));
  Tensor c = run1({"ConstantOfShape", {i64({2}, {2, 2})}});
  EXPECT_EQ(c.dtype(), DType::F32);
  EXPECT_EQ(values<float>(c), (std::vector<float>{0, 0, 0, 0}));
  v.t = i64({1}, {7});
  c = run1({"ConstantOfShape", {i64({1}, {3})}, {v}});
  EXPECT_EQ(values<int64_t>(c), (std::vector<int64_t>{7, 7, 7}));
  EXPECT_EQ(values<int64_t>(run1({"Range", {i64({}, {10}), i64({}, {4}), i64({}, {-3})}})),
            (std::vector<int64_t>{10, 7}));
  expect_near_all(values<float>(run1({"Range", {f32({}, {0}), f32({}, {1}), f32({}, {0.25f})}})),
                  {0, 0.25f, 0.5f, 0.75f});
  EXPECT_EQ(run1({"Range", {i32({}, {5}), i32({}, {1}), i32({}, {1})}}).numel(), 0u);
}

TEST(Cast, BetweenFloatIntBoolAndHalf) {
  const Tensor x = f32({5}, {-1.7f, 0.0f, 2.9f, 300.0f, NAN});
  EXPECT_EQ(values<int64_t>(run1({"Cast", {x}, {attr_int("to", 7)}})),
            (std::vector<int64_t>{-1, 0, 2, 300, 0}));
  EXPECT_EQ(values<uint8_t>(run1({"Cast", {x}, {attr_int("to", 9)}})),
            (std::vector<uint8_t>{1, 0, 1, 1, 1}));
  const Tensor h = run1({"Cast", {f32({2}, {1.0f / 3.0f, 65504.0f})}, {attr_int("to", 10)}});
  EXPECT_EQ(h.dtype(), DType::F16);
  EXPECT_EQ(values<uint16_t>(h),
            (std::vector<uint16_t>{f32_to_f16(1.0f / 3.0f), f32_to_f16(65504.0f)}));
  EXPECT_EQ(values<float>(run1({"Cast", {boolean({2}, {1, 0})}, {attr_int("to", 1)}})),
            (std::vector<float>{1, 0}));
  EXPECT_EQ(
      values<int32_t>(run1({"Cast", {i64({2}, {-1, int64_t{1} << 33})}, {attr_int("to", 6)}})),
      (std::vector<int32_t>{-1, 0}));  // wraps like numpy
  EXPECT_EQ(values<int64_t>(run1({"CastLike", {f32({1}, {3.5f}), i64({1}, {0})}})),
            (std::vector<int64_t>{3}));
}
