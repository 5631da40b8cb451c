// f16/bf16 execution: every float op computes in f32 and rounds its output once, so running an
// op on 16-bit inputs must give exactly the f32 result (on the same, exactly representable
// values) rounded to the 16-bit type. Cast converts between all float types.
#include <gtest/gtest.h>

#include <cmath>

#include "ir/half.h"
#include "runtime/op_utils.h"
#include "tests/unit/runtime/runtime_test_util.h"

using namespace qforge;
using namespace qforge::rt_test;

namespace {

// Random values in [lo, hi] that the 16-bit type holds exactly, as f32.
Tensor representable(Shape shape, uint32_t seed, DType low, float lo = 0.1f, float hi = 2.0f) {
  Tensor t = random_f32(std::move(shape), seed, lo, hi);
  for (float& v : t.mutable_data<float>())
    v = low == DType::F16 ? f16_to_f32(f32_to_f16(v)) : bf16_to_f32(f32_to_bf16(v));
  return t;
}

Tensor narrow(const Tensor& t, DType low) {
  return Tensor::from_f32(t.to_f32(), t.shape(), low);  // round to nearest even
}

struct HalfCase {
  std::string op;
  std::vector<Shape> inputs;
  std::vector<Attribute> attrs = {};
};

std::string case_name(const HalfCase& c) { return c.op; }

const std::vector<HalfCase> kCases = {
    {"Add", {{4, 8}, {8}}},
    {"Sub", {{4, 8}, {4, 8}}},
    {"Mul", {{4, 8}, {1, 8}}},
    {"Div", {{4, 8}, {4, 8}}},
    {"Pow", {{4, 8}, {4, 8}}},
    {"Max", {{4, 8}, {4, 8}}},
    {"Min", {{4, 8}, {4, 8}}},
    {"Sqrt", {{4, 8}}},
    {"Exp", {{4, 8}}},
    {"Log", {{4, 8}}},
    {"Sin", {{4, 8}}},
    {"Cos", {{4, 8}}},
    {"Reciprocal", {{4, 8}}},
    {"Neg", {{4, 8}}},
    {"Abs", {{4, 8}}},
    {"Relu", {{4, 8}}},
    {"Sigmoid", {{4, 8}}},
    {"Tanh", {{4, 8}}},
    {"Erf", {{4, 8}}},
    {"Gelu", {{4, 8}}},
    {"Softmax", {{4, 8}}, {attr_int("axis", -1)}},
    {"LayerNormalization", {{4, 8}, {8}, {8}}, {attr_int("axis", -1)}},
    {"MatMul", {{2, 4, 16}, {16, 8}}},
    {"Gemm", {{4, 16}, {8, 16}, {8}}, {attr_int("transB", 1)}},
    {"ReduceSum", {{4, 8}}, {attr_int("keepdims", 1)}},
    {"ReduceMean", {{4, 8}}, {attr_ints("axes", {1})}},
    {"Transpose", {{4, 8}}, {attr_ints("perm", {1, 0})}},
    {"Sum", {{4, 8}, {4, 8}, {8}}},
    {"Mean", {{4, 8}, {4, 8}, {4, 8}}},
    {"Clip", {{4, 8}}},
    {"LeakyRelu", {{4, 8}}},
    {"Elu", {{4, 8}}},
    {"Softplus", {{4, 8}}},
    {"HardSigmoid", {{4, 8}}},
    {"LogSoftmax", {{4, 8}}, {attr_int("axis", 1)}},
    {"ReduceMax", {{4, 8}}},
    {"ReduceProd", {{4, 8}}},
    {"ReduceL1", {{4, 8}}},
    {"ReduceLogSum", {{4, 8}}},
    {"Conv", {{1, 2, 6, 6}, {3, 2, 3, 3}, {3}}},
    {"AveragePool", {{1, 2, 6, 6}}, {attr_ints("kernel_shape", {2, 2})}},
    {"MaxPool", {{1, 2, 6, 6}}, {attr_ints("kernel_shape", {2, 2})}},
    {"GlobalAveragePool", {{1, 2, 6, 6}}},
    {"BatchNormalization", {{1, 2, 4, 4}, {2}, {2}, {2}, {2}}},
    {"InstanceNormalization", {{1, 2, 4, 4}, {2}, {2}}},
};

class HalfOp : public ::testing::TestWithParam<HalfCase> {};

TEST_P(HalfOp, F16AndBf16RoundTheF32ResultOnce) {
  const HalfCase& c = GetParam();
  for (const DType low : {DType::F16, DType::BF16}) {
    OneNode f32_spec{.op = c.op, .inputs = {}, .attrs = c.attrs, .opset = 17};
    OneNode low_spec = f32_spec;
    for (size_t i = 0; i < c.inputs.size(); ++i) {
      const Tensor x = representable(c.inputs[i], 100 + static_cast<uint32_t>(i), low);
      f32_spec.inputs.push_back(x);
      low_spec.inputs.push_back(narrow(x, low));
    }
    const Tensor want = narrow(run1(f32_spec), low);
    const Tensor got = run1(low_spec);
    ASSERT_EQ(got.dtype(), low) << c.op;
    ASSERT_EQ(got.shape(), want.shape()) << c.op;
    const auto g = values<uint16_t>(got), w = values<uint16_t>(want);
    for (size_t i = 0; i < g.size(); ++i)
      ASSERT_EQ(g[i], w[i]) << c.op << " " << dtype_name(low) << " element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, HalfOp, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return case_name(info.param); });

Tensor cast(const Tensor& x, DType to) {
  return run1({.op = "Cast", .inputs = {x}, .attrs = {attr_int("to", dtype_to_onnx(to))}});
}

}  // namespace

TEST(HalfCast, BetweenAllFloatTypes) {
  const std::vector<float> v = {0.0f, -1.5f, 3.14159265f, 65504.0f, 70000.0f, 1e-6f, -2.5e-8f};
  const Tensor x = f32({7}, v);
  const Tensor h = cast(x, DType::F16);
  const Tensor b = cast(x, DType::BF16);
  for (size_t i = 0; i < v.size(); ++i) {
    EXPECT_EQ(h.data<uint16_t>()[i], f32_to_f16(v[i])) << i;
    EXPECT_EQ(b.data<uint16_t>()[i], f32_to_bf16(v[i])) << i;
  }
  EXPECT_TRUE(std::isinf(cast(h, DType::F32).to_f32()[4]));  // 70000 overflows fp16
  // f16 -> bf16 and back through f32 values; f16 -> f64 exact.
  const Tensor hb = cast(h, DType::BF16);
  const Tensor hd = cast(h, DType::F64);
  for (size_t i = 0; i < v.size(); ++i) {
    const float hv = f16_to_f32(h.data<uint16_t>()[i]);
    EXPECT_EQ(hb.data<uint16_t>()[i], f32_to_bf16(hv)) << i;
    EXPECT_EQ(hd.data<double>()[i], static_cast<double>(hv)) << i;
  }
  const Tensor bh = cast(b, DType::F16);
  for (size_t i = 0; i < v.size(); ++i)
    EXPECT_EQ(bh.data<uint16_t>()[i], f32_to_f16(bf16_to_f32(b.data<uint16_t>()[i]))) << i;
  // Integers both ways: truncation toward zero, exact small integers.
  const Tensor hi = cast(cast(f32({3}, {2.75f, -2.75f, 100.0f}), DType::F16), DType::I32);
  EXPECT_EQ(values<int32_t>(hi), (std::vector<int32_t>{2, -2, 100}));
  const Tensor ib = cast(i64({2}, {7, -300}), DType::BF16);
  EXPECT_EQ(ib.to_f32(), (std::vector<float>{7.0f, -300.0f}));
}

TEST(HalfExecutor, SameBitsForAnyThreadCount) {
  const Tensor a = narrow(random_f32({64, 256}, 3), DType::F16);
  const Tensor w = narrow(random_f32({256, 128}, 4), DType::F16);
  const OneNode spec{.op = "MatMul", .inputs = {a, w}};
  const Tensor one = run_node(spec, 1).at(0);
  const Tensor four = run_node(spec, 4).at(0);
  EXPECT_TRUE(one.equals(four));
}

TEST(HalfCast, WideningTableCoversEveryBitPattern) {
  Tensor h(DType::F16, {1 << 16});
  auto bits = h.mutable_data<uint16_t>();
  for (size_t i = 0; i < bits.size(); ++i) bits[i] = static_cast<uint16_t>(i);
  const Tensor f = ops::to_f32(h);
  const auto v = f.data<uint32_t>();
  for (size_t i = 0; i < bits.size(); ++i)
    ASSERT_EQ(v[i], std::bit_cast<uint32_t>(f16_to_f32(bits[i]))) << "pattern " << i;
}
