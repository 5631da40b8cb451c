// Pools and normalizations against hand-computed values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>

#include "kernels/packed_gemm.h"
#include "runtime/op_registry.h"
#include "tests/unit/runtime/runtime_test_util.h"

using namespace qforge;
using namespace qforge::rt_test;

namespace {
const Tensor kX9 = f32({1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
Tensor iota16() {
  std::vector<float> v(16);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  return f32({1, 1, 4, 4}, v);
}
}  // namespace

TEST(MaxPool, ValuesAndIndicesInBothStorageOrders) {
  const std::vector<Attribute> a = {attr_ints("kernel_shape", {2, 2}),
                                    attr_ints("strides", {2, 2})};
  auto out = run_node({"MaxPool", {iota16()}, a, 2});
  EXPECT_EQ(values<float>(out[0]), (std::vector<float>{5, 7, 13, 15}));
  EXPECT_EQ(out[1].dtype(), DType::I64);
  EXPECT_EQ(values<int64_t>(out[1]), (std::vector<int64_t>{5, 7, 13, 15}));
  auto col = a;
  col.push_back(attr_int("storage_order", 1));
  out = run_node({"MaxPool", {iota16()}, col, 2});
  EXPECT_EQ(values<int64_t>(out[1]), (std::vector<int64_t>{5, 13, 7, 15}));
}

TEST(MaxPool, CeilModePadsAndDilations) {
  const std::vector<Attribute> k2s2 = {attr_ints("kernel_shape", {2, 2}),
                                       attr_ints("strides", {2, 2})};
  EXPECT_EQ(values<float>(run1({"MaxPool", {kX9}, k2s2})), (std::vector<float>{5}));
  auto ceil = k2s2;
  ceil.push_back(attr_int("ceil_mode", 1));
  EXPECT_EQ(values<float>(run1({"MaxPool", {kX9}, ceil})), (std::vector<float>{5, 6, 8, 9}));
  EXPECT_EQ(
      values<float>(run1(
          {"MaxPool", {kX9}, {attr_ints("kernel_shape", {2, 2}), attr_ints("dilations", {2, 2})}})),
      (std::vector<float>{9}));
  // Padding never wins a max, even over negative values.
  EXPECT_EQ(
      values<float>(run1({"MaxPool",
                          {f32({1, 1, 1, 2}, {-3, -4})},
                          {attr_ints("kernel_shape", {1, 2}), attr_ints("pads", {0, 1, 0, 1})}})),
      (std::vector<float>{-3, -3, -4}));
}

// MaxPool over two dims without Indices runs a 2-D loop; other ranks the rank-generic one. The
// same pool as 3-D over [N, C, 1, H, W] (generic) gives the same bits on random data, NaNs
// included, for pads, strides, dilations and ceil_mode together.
TEST(MaxPool, TwoDimensionalLoopEqualsTheGenericOne) {
  // 11 x 13 planes, and 10 x 18 ones (exactly twice a 2x2, stride-2 pool's output: the rows of
  // the whole tensor in turn, four windows at a time and one alone), and 9 x 75 ones (stride-2
  // windows 2 or 3 wide, sixteen at a time where the AVX-512 kernels run: two blocks and the
  // rest one by one), each with the AVX-512 kernels and without; and planes twice a 2x2 pool's
  // output of rows shorter than 16 (8 x 8, 10 x 4, 18 x 2, 8 x 16: blocks of 16 outputs where
  // the AVX-512 kernels run, the rows left over one by one).
  const bool avx512 = packed_gemm_avx512();
  const std::tuple<int64_t, int64_t, bool> planes[] = {
      {11, 13, false}, {10, 18, false}, {9, 75, false}, {9, 75, true}, {8, 8, false},
      {10, 4, false},  {18, 2, false},  {8, 16, false}, {8, 8, true}};
  for (const auto& [h, wd, avx2_only] : planes) {
    packed_gemm_use_avx2_only(avx2_only);
    std::vector<float> v = values<float>(random_f32({2, 3, h, wd}, 17));
    if (wd == 75) {  // in the sixteen-wide blocks: -0 then +0 in one window, a NaN in others
      v[3 * wd + 21] = -0.0f;
      v[3 * wd + 22] = 0.0f;
      v[4 * wd + 21] = -1.0f;
      v[4 * wd + 22] = -1.0f;
      v[5 * wd + 30] = std::nanf("");
      v[wd * h + 2 * wd + 33] = std::nanf("");
      v[wd * h + 2 * wd + 34] = 1e30f;
    }
    v[5] = std::nanf("");
    v[200] = std::nanf("");
    // One 2x2 window (rows 2-3, columns 4-5) of -0, +0 / -0, -1: the first zero stays.
    v[2 * wd + 4] = -0.0f;
    v[2 * wd + 5] = 0.0f;
    v[3 * wd + 4] = -0.0f;
    v[3 * wd + 5] = -1.0f;
    v[4 * wd + 4] = std::nanf("");  // a NaN first in a 2x2 window (row 4, column 4)
    for (auto i = static_cast<size_t>(h * wd + 2 * wd); i < static_cast<size_t>(h * wd + 3 * wd);
         ++i) {
      v[i] = -1e30f * static_cast<float>(i % 3);
    }
    const Tensor x2 = f32({2, 3, h, wd}, v);
    const Tensor x3 = f32({2, 3, 1, h, wd}, v);
    struct Case {
      std::vector<int64_t> kernel, strides, dilations, pads;
      int64_t ceil;
    };
    for (const Case& c : {Case{{3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, 0},
                          Case{{2, 3}, {2, 3}, {1, 2}, {0, 1, 1, 2}, 1},
                          Case{{3, 2}, {2, 2}, {2, 1}, {2, 0, 0, 1}, 1},
                          Case{{1, 1}, {3, 2}, {1, 1}, {0, 0, 0, 0}, 0},
                          // 2x2 at stride 2 without padding before: four windows at a time
                          Case{{2, 2}, {2, 2}, {1, 1}, {0, 0, 0, 0}, 0},
                          Case{{2, 2}, {2, 2}, {1, 1}, {0, 0, 0, 0}, 1},
                          Case{{2, 2}, {2, 2}, {1, 1}, {0, 0, 1, 1}, 0},
                          // stride 2 across: ResNet's 3x3 with padding, dilated rows, 2 wide
                          // with padding before (not the 2x2 path), ceil mode
                          Case{{3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}, 0},
                          Case{{3, 3}, {2, 2}, {2, 1}, {1, 1, 1, 1}, 1},
                          Case{{2, 3}, {1, 2}, {1, 1}, {0, 0, 1, 0}, 1},
                          Case{{3, 2}, {2, 2}, {1, 1}, {1, 1, 0, 0}, 0},
                          Case{{1, 2}, {1, 2}, {1, 1}, {0, 1, 0, 1}, 1}}) {
      // Rows of 2 (one output of a 2x2 window each) take the 2x2 windows alone.
      if (wd < 4 && c.kernel != std::vector<int64_t>{2, 2}) continue;
      const auto attrs = [&](int64_t lead_kernel) {
        const bool three = lead_kernel > 0;
        auto with = [&](std::vector<int64_t> a, int64_t lead) {
          if (three) a.insert(a.begin(), lead);
          return a;
        };
        std::vector<int64_t> pads = c.pads;
        if (three) {
          pads.insert(pads.begin() + 2, 0);
          pads.insert(pads.begin(), 0);
        }
        return std::vector<Attribute>{
            attr_ints("kernel_shape", with(c.kernel, 1)), attr_ints("strides", with(c.strides, 1)),
            attr_ints("dilations", with(c.dilations, 1)), attr_ints("pads", pads),
            attr_int("ceil_mode", c.ceil)};
      };
      const Tensor fast = run1({"MaxPool", {x2}, attrs(0)});
      const Tensor generic = run1({"MaxPool", {x3}, attrs(1)});
      ASSERT_EQ(generic.numel(), fast.numel());
      ASSERT_EQ(0, std::memcmp(fast.bytes().data(), generic.bytes().data(), fast.nbytes()))
          << "kernel " << c.kernel[0] << "x" << c.kernel[1] << ", planes " << h << " x " << wd
          << (avx2_only ? " (no AVX-512)" : avx512 ? " (AVX-512)" : "");
    }
  }
  packed_gemm_use_avx2_only(false);
}

TEST(AveragePool, CountIncludePadAndCeilMode) {
  const std::vector<Attribute> a = {attr_ints("kernel_shape", {3, 3}),
                                    attr_ints("pads", {1, 1, 1, 1})};
  const auto ex = values<float>(run1({"AveragePool", {kX9}, a}));
  EXPECT_FLOAT_EQ(ex[0], 3.0f);  // (1+2+4+5)/4
  EXPECT_FLOAT_EQ(ex[4], 5.0f);
  auto inc = a;
  inc.push_back(attr_int("count_include_pad", 1));
  const auto in = values<float>(run1({"AveragePool", {kX9}, inc}));
  EXPECT_FLOAT_EQ(in[0], 12.0f / 9.0f);
  EXPECT_FLOAT_EQ(in[4], 5.0f);
  const std::vector<Attribute> ceil = {attr_ints("kernel_shape", {2, 2}),
                                       attr_ints("strides", {2, 2}), attr_int("ceil_mode", 1)};
  EXPECT_EQ(values<float>(run1({"AveragePool", {kX9}, ceil})),
            (std::vector<float>{3, 4.5f, 7.5f, 9}));
}

TEST(GlobalPool, AverageAndMax) {
  const Tensor x = f32({1, 2, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 9});
  Tensor y = run1({"GlobalAveragePool", {x}});
  EXPECT_EQ(y.shape(), (Shape{1, 2, 1, 1}));
  EXPECT_EQ(values<float>(y), (std::vector<float>{2.5f, 6.75f}));
  EXPECT_EQ(values<float>(run1({"GlobalMaxPool", {x}})), (std::vector<float>{4, 9}));
}

// GlobalAveragePool's planes summed eight at a time: each plane's value is AveragePool's over
// the whole plane bit for bit (its double sum in element order), for 26 planes (three blocks
// of eight and two alone, split between threads), values of mixed magnitudes, f32 and f64.
TEST(GlobalPool, AverageEqualsAveragePoolOverThePlane) {
  std::vector<float> v = values<float>(random_f32({2, 13, 7, 9}, 31));
  for (size_t i = 0; i < v.size(); i += 5) v[i] *= 1e7f;
  for (const DType dt : {DType::F32, DType::F64}) {
    Tensor x(dt, {2, 13, 7, 9});
    for (size_t i = 0; i < v.size(); ++i) {
      if (dt == DType::F32) x.mutable_data<float>()[i] = v[i];
      if (dt == DType::F64) x.mutable_data<double>()[i] = v[i] + 1e-9 * static_cast<double>(i);
    }
    const Tensor whole = run1({"AveragePool", {x}, {attr_ints("kernel_shape", {7, 9})}});
    for (const int threads : {1, 2, 3}) {
      const Tensor y = run_node({"GlobalAveragePool", {x}}, threads).at(0);
      ASSERT_EQ(y.shape(), (Shape{2, 13, 1, 1}));
      ASSERT_EQ(y.nbytes(), whole.nbytes());
      EXPECT_EQ(0, std::memcmp(y.bytes().data(), whole.bytes().data(), y.nbytes()))
          << dtype_name(dt) << ", " << threads << " threads";
    }
  }
}

TEST(BatchNormalization, Inference) {
  const Tensor x = f32({1, 2, 1, 2}, {1, 2, 3, 4});
  const Tensor y =
      run1({"BatchNormalization",
            {x, f32({2}, {1, 2}), f32({2}, {0, 1}), f32({2}, {1, 3}), f32({2}, {4, 1})},
            {attr_float("epsilon", 0)}});
  EXPECT_EQ(values<float>(y), (std::vector<float>{0, 0.5f, 1, 3}));
  const auto e = catch_error([&] {
    run1({"BatchNormalization",
          {x, f32({2}, {1, 2}), f32({2}, {0, 1}), f32({2}, {1, 3}), f32({2}, {4, 1})},
          {attr_int("training_mode", 1)}});
  });
  EXPECT_EQ(e.category, ErrorCategory::Unsupported);
  EXPECT_EQ(e.message,
            "op 'BatchNormalization' (node 'n'): training_mode=1 is not supported; the runtime "
            "does inference only");
}

TEST(LayerNormalization, LastAxisWithStatistics) {
  const Tensor x = f32({2, 2}, {1, 3, 2, 6});
  auto out = run_node({"LayerNormalization",
                       {x, f32({2}, {2, 3}), f32({2}, {1, 0})},
                       {attr_float("epsilon", 0)},
                       3,
                       17});
  expect_near_all(values<float>(out[0]), {-1, 3, -1, 3});
  EXPECT_EQ(out[1].shape(), (Shape{2, 1}));
  expect_near_all(values<float>(out[1]), {2, 4});
  expect_near_all(values<float>(out[2]), {1, 0.5f});
}

TEST(LayerNormalization, AxisZeroNormalizesEverything) {
  const Tensor x = f32({2, 2}, {1, 3, 2, 6});
  const Tensor y = run1({"LayerNormalization",
                         {x, f32({2, 2}, {1, 1, 1, 1})},
                         {attr_int("axis", 0), attr_float("epsilon", 0)},
                         1,
                         17});
  const float inv = 1.0f / std::sqrt(3.5f);
  expect_near_all(values<float>(y), {-2 * inv, 0, -1 * inv, 3 * inv});
}

// Where the AVX-512 kernels run, LayerNormalization's sums and its normalizing loop, and
// RmsNorm's sum of squares, take eight doubles at a time: the same bits as the 2-lane loops, on
// rows of every tail length (1-17) and MiniLM's 384 (+1), offset far from 0 (the centered sum
// matters), with a per-row and a per-element scale, with and without a bias, a NaN and an inf
// in rows of their own, a row whose sums lose a 1 in one order and not in another, and outputs
// 1 and 2.
TEST(LayerNormalization, WideLoopsGiveTheBitsOfTheNarrowOnes) {
  if (!packed_gemm_avx512()) GTEST_SKIP() << "this CPU lacks AVX-512F: one loop runs here";
  const auto bits = [](const Tensor& t) {
    const auto b = t.bytes();
    return std::vector<std::byte>(b.begin(), b.end());
  };
  for (const int64_t n : {1, 2, 7, 8, 9, 15, 16, 17, 384, 385}) {
    std::vector<float> x = values<float>(random_f32({5, n}, static_cast<uint32_t>(n), -3, 3));
    for (size_t i = 0; i < static_cast<size_t>(n); ++i) x[i] += 1000.0f;  // row 0 far from 0
    x[static_cast<size_t>(2 * n)] = std::numeric_limits<float>::quiet_NaN();  // row 2
    x[static_cast<size_t>(3 * n + n / 2)] = std::numeric_limits<float>::infinity();  // row 3
    if (n >= 3) {  // row 4: sums whose order shows (1e17 + 1 is 1e17 in double)
      x[static_cast<size_t>(4 * n)] = 1e17f;
      x[static_cast<size_t>(4 * n + 1)] = 1.0f;
      x[static_cast<size_t>(4 * n + 2)] = -1e17f;
    }
    const Tensor xt = f32({5, n}, x);
    const Tensor scale = random_f32({n}, 7, 0.5f, 2.0f);
    const Tensor full_scale = random_f32({5, n}, 8, 0.5f, 2.0f);
    const Tensor bias = random_f32({n}, 9);
    const std::vector<OneNode> nodes = {
        {"LayerNormalization", {xt, scale, bias}, {attr_float("epsilon", 1e-5f)}, 3, 17},
        {"LayerNormalization", {xt, full_scale}, {attr_float("epsilon", 1e-5f)}, 3, 17},
        {"RmsNorm", {xt, scale}, {attr_float("epsilon", 1e-6f)}, 1, 1, ops::kInternalDomain},
        {"RmsNorm", {xt}, {attr_float("epsilon", 1e-6f)}, 1, 1, ops::kInternalDomain},
    };
    for (const OneNode& node : nodes) {
      packed_gemm_use_avx2_only(false);
      const std::vector<Tensor> wide = run_node(node);
      packed_gemm_use_avx2_only(true);
      const std::vector<Tensor> narrow = run_node(node);
      packed_gemm_use_avx2_only(false);
      ASSERT_EQ(wide.size(), narrow.size());
      for (size_t o = 0; o < wide.size(); ++o) {
        EXPECT_EQ(bits(wide[o]), bits(narrow[o]))
            << node.op << " with " << node.inputs.size() << " inputs, rows of " << n
            << ", output " << o;
      }
    }
  }
}

TEST(InstanceNormalization, PerChannel) {
  const Tensor y = run1({"InstanceNormalization",
                         {f32({1, 1, 1, 4}, {1, 2, 3, 4}), f32({1}, {1}), f32({1}, {0})},
                         {attr_float("epsilon", 0)}});
  const float s = 1.0f / std::sqrt(1.25f);
  expect_near_all(values<float>(y), {-1.5f * s, -0.5f * s, 0.5f * s, 1.5f * s});
}
