// Conv and ConvTranspose: hand-computed cases for each attribute and naive references on
// random data with everything combined.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/packed_gemm.h"

#include "tests/unit/runtime/runtime_test_util.h"

using namespace qforge;
using namespace qforge::rt_test;

namespace {

const Tensor kX9 = f32({1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
const Tensor kOnes22 = f32({1, 1, 2, 2}, {1, 1, 1, 1});

struct Conv2d {
  int64_t group = 1, stride = 1, dil = 1, pad_t = 0, pad_l = 0, pad_b = 0, pad_r = 0;
  int64_t stride_w = 0, dil_w = 0;  // along the width; 0: as stride, dil
  int64_t sw() const { return stride_w != 0 ? stride_w : stride; }
  int64_t dw() const { return dil_w != 0 ? dil_w : dil; }
};

// Naive 2-D conv: x [N,C,H,W], w [M,C/g,KH,KW], b [M].
std::vector<float> naive_conv(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2d& p,
                              Shape& out_shape) {
  const auto& xs = x.shape();
  const auto& ws = w.shape();
  const int64_t n = xs[0], c = xs[1], h = xs[2], wd = xs[3], m = ws[0], kh = ws[2], kw = ws[3];
  const int64_t oh = (h + p.pad_t + p.pad_b - ((kh - 1) * p.dil + 1)) / p.stride + 1;
  const int64_t ow = (wd + p.pad_l + p.pad_r - ((kw - 1) * p.dw() + 1)) / p.sw() + 1;
  out_shape = {n, m, oh, ow};
  const int64_t cg = c / p.group, mg = m / p.group;
  const auto xv = x.data<float>(), wv = w.data<float>(), bv = b.data<float>();
  std::vector<float> y(static_cast<size_t>(n * m * oh * ow));
  for (int64_t in = 0; in < n; ++in)
    for (int64_t om = 0; om < m; ++om)
      for (int64_t y0 = 0; y0 < oh; ++y0)
        for (int64_t x0 = 0; x0 < ow; ++x0) {
          double s = bv[static_cast<size_t>(om)];
          const int64_t g = om / mg;
          for (int64_t ci = 0; ci < cg; ++ci)
            for (int64_t ky = 0; ky < kh; ++ky)
              for (int64_t kx = 0; kx < kw; ++kx) {
                const int64_t iy = y0 * p.stride - p.pad_t + ky * p.dil;
                const int64_t ix = x0 * p.sw() - p.pad_l + kx * p.dw();
                if (iy < 0 || iy >= h || ix < 0 || ix >= wd) continue;
                s += static_cast<double>(
                         xv[static_cast<size_t>(((in * c + g * cg + ci) * h + iy) * wd + ix)]) *
                     wv[static_cast<size_t>(((om * cg + ci) * kh + ky) * kw + kx)];
              }
          y[static_cast<size_t>(((in * m + om) * oh + y0) * ow + x0)] = static_cast<float>(s);
        }
  return y;
}

}  // namespace

TEST(Conv, PlainPaddedStridedDilated) {
  EXPECT_EQ(values<float>(run1({"Conv", {kX9, kOnes22}})), (std::vector<float>{12, 16, 24, 28}));
  EXPECT_EQ(values<float>(run1({"Conv", {kX9, kOnes22, f32({1}, {1})}})),
            (std::vector<float>{13, 17, 25, 29}));
  const Tensor ones33 = f32({1, 1, 3, 3}, std::vector<float>(9, 1));
  EXPECT_EQ(values<float>(run1({"Conv",
                                {kX9, ones33},
                                {attr_ints("pads", {1, 1, 1, 1}), attr_ints("strides", {2, 2})}})),
            (std::vector<float>{12, 16, 24, 28}));
  const Tensor y = run1({"Conv", {kX9, kOnes22}, {attr_ints("dilations", {2, 2})}});
  EXPECT_EQ(y.shape(), (Shape{1, 1, 1, 1}));
  EXPECT_EQ(values<float>(y), (std::vector<float>{20}));
}

TEST(Conv, AutoPadSameUpperAndLower) {
  EXPECT_EQ(values<float>(run1({"Conv", {kX9, kOnes22}, {attr_string("auto_pad", "SAME_UPPER")}})),
            (std::vector<float>{12, 16, 9, 24, 28, 15, 15, 17, 9}));
  EXPECT_EQ(values<float>(run1({"Conv", {kX9, kOnes22}, {attr_string("auto_pad", "SAME_LOWER")}})),
            (std::vector<float>{1, 3, 5, 5, 12, 16, 11, 24, 28}));
  EXPECT_EQ(run1({"Conv",
                  {kX9, kOnes22},
                  {attr_string("auto_pad", "VALID"), attr_ints("pads", {1, 1, 1, 1})}})
                .shape(),
            (Shape{1, 1, 2, 2}));
}

TEST(Conv, Groups) {
  const Tensor x = f32({1, 2, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  // 1x1 kernels take the direct (no im2col) path.
  EXPECT_EQ(values<float>(run1({"Conv", {x, f32({2, 1, 1, 1}, {2, 3})}, {attr_int("group", 2)}})),
            (std::vector<float>{2, 4, 6, 8, 15, 18, 21, 24}));
  EXPECT_EQ(
      values<float>(
          run1({"Conv", {x, f32({2, 1, 2, 2}, std::vector<float>(8, 1))}, {attr_int("group", 2)}})),
      (std::vector<float>{10, 26}));
  const auto e = catch_error([&] {
    run1({"Conv", {x, f32({2, 2, 1, 1}, {1, 1, 1, 1})}, {attr_int("group", 2)}});
  });
  EXPECT_EQ(e.category, ErrorCategory::InvalidInput);
}

TEST(Conv, RandomCasesMatchNaive) {
  const std::vector<Conv2d> cases = {
      {.group = 1, .stride = 1, .dil = 1, .pad_t = 1, .pad_l = 1, .pad_b = 1, .pad_r = 1},
      {.group = 2, .stride = 2, .dil = 1, .pad_t = 0, .pad_l = 1, .pad_b = 2, .pad_r = 0},
      {.group = 4, .stride = 1, .dil = 2, .pad_t = 2, .pad_l = 2, .pad_b = 2, .pad_r = 2},
      {.group = 1, .stride = 3, .dil = 1, .pad_t = 0, .pad_l = 0, .pad_b = 0, .pad_r = 0},
  };
  uint32_t seed = 100;
  for (const auto& p : cases) {
    const Tensor x = random_f32({3, 8, 11, 9}, seed++);
    const Tensor w = random_f32({12, 8 / p.group, 3, 3}, seed++);
    const Tensor b = random_f32({12}, seed++);
    Shape want_shape;
    const auto want = naive_conv(x, w, b, p, want_shape);
    const Tensor y = run1({"Conv",
                           {x, w, b},
                           {attr_int("group", p.group), attr_ints("strides", {p.stride, p.stride}),
                            attr_ints("dilations", {p.dil, p.dil}),
                            attr_ints("pads", {p.pad_t, p.pad_l, p.pad_b, p.pad_r})}});
    ASSERT_EQ(y.shape(), want_shape) << "group " << p.group << " stride " << p.stride;
    const auto got = values<float>(y);
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], 1e-4f)
          << "group " << p.group << " stride " << p.stride << " dil " << p.dil << " at " << i;
    }
  }
}

// Small output planes of a batch share one wide product (images side by side); large planes and a
// single image take one product per image. Both match the naive reference, with and without
// bias, and every image of a batch equals that image run alone within float rounding.
TEST(Conv, WideAndPerImageProductsMatchNaive) {
  struct Case {
    Shape x, w;
    Conv2d p;
    bool bias;
  };
  const std::vector<Case> cases = {
      {{5, 6, 9, 7}, {4, 3, 3, 3}, {.group = 2, .pad_t = 1, .pad_l = 1, .pad_b = 1, .pad_r = 1},
       true},
      {{3, 4, 12, 10}, {6, 4, 3, 2}, {.stride = 2, .dil = 1, .pad_t = 0, .pad_l = 1}, false},
      {{4, 8, 5, 5}, {16, 8, 1, 1}, {}, true},            // 1x1: no im2col on the per-image path
      {{2, 3, 40, 36}, {5, 3, 3, 3}, {.pad_t = 1, .pad_l = 1, .pad_b = 1, .pad_r = 1}, true},
  };
  uint32_t seed = 300;
  for (const auto& c : cases) {
    const Tensor x = random_f32(c.x, seed++);
    const Tensor w = random_f32(c.w, seed++);
    const Tensor b = c.bias ? random_f32({c.w[0]}, seed++)
                            : f32({c.w[0]}, std::vector<float>(static_cast<size_t>(c.w[0])));
    const std::vector<Attribute> attrs = {
        attr_int("group", c.p.group), attr_ints("strides", {c.p.stride, c.p.stride}),
        attr_ints("dilations", {c.p.dil, c.p.dil}),
        attr_ints("pads", {c.p.pad_t, c.p.pad_l, c.p.pad_b, c.p.pad_r})};
    Shape want_shape;
    const auto want = naive_conv(x, w, b, c.p, want_shape);
    const Tensor y = c.bias ? run1({"Conv", {x, w, b}, attrs}) : run1({"Conv", {x, w}, attrs});
    ASSERT_EQ(y.shape(), want_shape);
    const auto got = values<float>(y);
    for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-4f) << i;
    // Image 1 alone.
    const int64_t per_image = static_cast<int64_t>(x.numel()) / c.x[0];
    const auto xv = x.data<float>();
    Shape one_shape = c.x;
    one_shape[0] = 1;
    const Tensor x1 = f32(one_shape, std::vector<float>(xv.begin() + per_image,
                                                        xv.begin() + 2 * per_image));
    const Tensor y1 = c.bias ? run1({"Conv", {x1, w, b}, attrs}) : run1({"Conv", {x1, w}, attrs});
    const auto got1 = values<float>(y1);
    const size_t out_per_image = got.size() / static_cast<size_t>(c.x[0]);
    ASSERT_EQ(got1.size(), out_per_image);
    for (size_t i = 0; i < out_per_image; ++i) {
      ASSERT_NEAR(got1[i], got[out_per_image + i], 1e-5f * (1.0f + std::fabs(got1[i]))) << i;
    }
  }
}

// Narrow outputs with stride 1 along the width take the padded-plane column copy; the others the
// per-row edge loops. Both against the naive reference, with strides and dilations that differ
// between the two axes, asymmetric pads, a kernel wider than the image, and pads wider than it.
TEST(Conv, NarrowPlanesWithMixedStridesPadsAndDilationsMatchNaive) {
  struct Case {
    Shape x, w;
    Conv2d p;
  };
  const std::vector<Case> cases = {
      {{3, 5, 9, 8}, {4, 5, 5, 3}, {.stride = 2, .pad_t = 2, .pad_l = 0, .pad_b = 1, .pad_r = 3,
                                    .stride_w = 1, .dil_w = 2}},
      {{2, 3, 6, 4}, {6, 3, 3, 7}, {.dil = 2, .pad_t = 1, .pad_l = 5, .pad_b = 3, .pad_r = 5}},
      {{4, 2, 5, 5}, {3, 2, 2, 2}, {.pad_t = 4, .pad_l = 6, .pad_b = 4, .pad_r = 6}},
      {{2, 4, 7, 33}, {5, 4, 3, 3}, {.pad_t = 1, .pad_l = 1, .pad_b = 1, .pad_r = 1}},  // 33 wide
      {{2, 4, 7, 10}, {5, 4, 3, 3}, {.stride = 1, .pad_l = 1, .pad_r = 1, .stride_w = 2}},
  };
  uint32_t seed = 700;
  for (const auto& c : cases) {
    const Tensor x = random_f32(c.x, seed++);
    const Tensor w = random_f32(c.w, seed++);
    const Tensor b = random_f32({c.w[0]}, seed++);
    Shape want_shape;
    const auto want = naive_conv(x, w, b, c.p, want_shape);
    const Tensor y = run1({"Conv",
                           {x, w, b},
                           {attr_ints("strides", {c.p.stride, c.p.sw()}),
                            attr_ints("dilations", {c.p.dil, c.p.dw()}),
                            attr_ints("pads", {c.p.pad_t, c.p.pad_l, c.p.pad_b, c.p.pad_r})}});
    ASSERT_EQ(y.shape(), want_shape) << shape_to_string(c.x);
    const auto got = values<float>(y);
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], 1e-4f) << shape_to_string(c.x) << " at " << i;
    }
  }
}

TEST(Conv, OneDAndThreeDBatchesMatchTheirImages) {
  // 1-D and 3-D batches of small planes run as one wide product: each image equals the image
  // run alone (the rank-generic im2col with the wide layout).
  for (const Shape& xs : {Shape{3, 4, 17}, Shape{2, 3, 4, 5, 6}}) {
    Shape ws{5, xs[1]};
    for (size_t d = 2; d < xs.size(); ++d) ws.push_back(3);
    const Tensor x = random_f32(xs, 41);
    const Tensor w = random_f32(ws, 42);
    std::vector<int64_t> pads(2 * (xs.size() - 2), 1);
    const Tensor y = run1({"Conv", {x, w}, {attr_ints("pads", pads)}});
    const auto got = values<float>(y);
    const int64_t per_image = static_cast<int64_t>(x.numel()) / xs[0];
    const size_t out_per_image = got.size() / static_cast<size_t>(xs[0]);
    for (int64_t n = 0; n < xs[0]; ++n) {
      Shape one = xs;
      one[0] = 1;
      const auto xv = x.data<float>();
      const Tensor xn = f32(one, std::vector<float>(xv.begin() + n * per_image,
                                                    xv.begin() + (n + 1) * per_image));
      const auto alone = values<float>(run1({"Conv", {xn, w}, {attr_ints("pads", pads)}}));
      ASSERT_EQ(alone.size(), out_per_image);
      for (size_t i = 0; i < out_per_image; ++i) {
        ASSERT_NEAR(alone[i], got[static_cast<size_t>(n) * out_per_image + i],
                    1e-5f * (1.0f + std::fabs(alone[i])))
            << "rank " << xs.size() << " image " << n << " at " << i;
      }
    }
  }
}

TEST(Conv, OneDAndThreeD) {
  // 1-D: [1,1,4] * [1,1,2] ones.
  EXPECT_EQ(values<float>(run1({"Conv", {f32({1, 1, 4}, {1, 2, 3, 4}), f32({1, 1, 2}, {1, 1})}})),
            (std::vector<float>{3, 5, 7}));
  // 3-D: a 2x2x2 cube summed by a 2x2x2 kernel of ones.
  const Tensor y = run1({"Conv",
                         {f32({1, 1, 2, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8}),
                          f32({1, 1, 2, 2, 2}, std::vector<float>(8, 1))}});
  EXPECT_EQ(y.shape(), (Shape{1, 1, 1, 1, 1}));
  EXPECT_EQ(values<float>(y), (std::vector<float>{36}));
}

// Constant weights (initializers), which the executor packs once: the columns go straight into
// packed panels (kernels/packed_gemm.h).
namespace {

struct PackedCase {
  Shape x, w;
  std::vector<int64_t> strides, dilations, pads;  // pads: begins then ends
  bool bias = true;
};

// Every output element as the packed product computes it: one FMA chain over (channel, tap) in
// order, taps in row-major kernel order, a tap on padding contributing 0 * w, started at the
// bias (or 0).
std::vector<float> fma_conv(const Tensor& x, const Tensor& w, const std::vector<float>& bias,
                            const PackedCase& c, Shape& out_shape) {
  const size_t r = c.x.size() - 2;
  const int64_t n = c.x[0], cin = c.x[1], m = c.w[0];
  std::vector<int64_t> in(c.x.begin() + 2, c.x.end()), k(c.w.begin() + 2, c.w.end()), out(r);
  out_shape = {n, m};
  for (size_t i = 0; i < r; ++i) {
    const int64_t ext = (k[i] - 1) * c.dilations[i] + 1;
    out[i] = (in[i] + c.pads[i] + c.pads[r + i] - ext) / c.strides[i] + 1;
    out_shape.push_back(out[i]);
  }
  const auto count = [](const std::vector<int64_t>& d) {
    int64_t p = 1;
    for (int64_t v : d) p *= v;
    return p;
  };
  const int64_t isize = count(in), ksize = count(k), osize = count(out);
  const auto xv = x.data<float>(), wv = w.data<float>();
  std::vector<float> y(static_cast<size_t>(n * m * osize));
  for (int64_t img = 0; img < n; ++img) {
    for (int64_t om = 0; om < m; ++om) {
      for (int64_t o = 0; o < osize; ++o) {
        float acc = bias.empty() ? 0.0f : bias[static_cast<size_t>(om)];
        for (int64_t ci = 0; ci < cin; ++ci) {
          for (int64_t t = 0; t < ksize; ++t) {
            int64_t orem = o, trem = t, off = 0, stride = 1;
            bool inside = true;
            for (size_t j = r; j-- > 0;) {
              const int64_t oj = orem % out[j], tj = trem % k[j];
              orem /= out[j];
              trem /= k[j];
              const int64_t ij = oj * c.strides[j] - c.pads[j] + tj * c.dilations[j];
              inside = inside && ij >= 0 && ij < in[j];
              off += ij * stride;
              stride *= in[j];
            }
            const float v = inside ? xv[static_cast<size_t>((img * cin + ci) * isize + off)] : 0.0f;
            acc = std::fma(v, wv[static_cast<size_t>((om * cin + ci) * ksize + t)], acc);
          }
        }
        y[static_cast<size_t>((img * m + om) * osize + o)] = acc;
      }
    }
  }
  return y;
}

// With `avx2_after_build`, the executor is built (its weights packed) on the widest kernel and
// run on the AVX2 one.
Tensor run_conv_graph(const PackedCase& c, const Tensor& x, const Tensor& w, const Tensor& b,
                      int threads, bool pack, bool lanes_off_after_build = false) {
  Graph g;
  g.set_opset("", 21);
  g.inputs.push_back({.name = "x", .dtype = DType::F32});
  g.set_initializer("w", w);
  Node node;
  node.name = "conv";
  node.op_type = "Conv";
  node.inputs = {"x", "w"};
  if (c.bias) {
    g.set_initializer("b", b);
    node.inputs.push_back("b");
  }
  node.attributes = {attr_ints("strides", c.strides), attr_ints("dilations", c.dilations),
                     attr_ints("pads", c.pads)};
  node.outputs = {"y"};
  g.nodes.push_back(std::move(node));
  g.outputs.push_back({.name = "y"});
  const Executor ex(g, {.device = Device::Cpu, .threads = threads, .pack_weights = pack});
  if (!lanes_off_after_build) return ex.run({{"x", x}}).at(0);
  lane_gemm_use(false);
  Tensor y = ex.run({{"x", x}}).at(0);
  lane_gemm_use(true);
  return y;
}

}  // namespace

// Each output element is one FMA chain from the bias, bit for bit, at 1, 2 and 3 threads; an
// image alone gives its slice of the batch; without packing, the same within rounding. Cases:
// small planes (images side by side, positions crossing panel edges), a 1x1 window read as is,
// strides, dilations, asymmetric pads, a large plane (one image per product) whose channels
// take several blocks, 1-D and 3-D windows, a batch in several chunks, stride-1 windows whose
// products read the padded planes in place, and 1x1 windows of many channels whose products
// read the input planes in place; on both kernels where the CPU has AVX-512.
TEST(Conv, ConstantWeightsRunPackedAsFmaChainsFromTheBias) {
  if (!packed_gemm_supported()) GTEST_SKIP() << "this CPU lacks AVX2/FMA, the packed kernel's";
  const std::vector<PackedCase> cases = {
      {{5, 6, 7, 9}, {10, 6, 3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}},
      {{3, 8, 5, 5}, {17, 8, 1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}},
      {{4, 3, 12, 10}, {7, 3, 3, 2}, {2, 3}, {1, 2}, {0, 1, 2, 0}, false},
      {{2, 8, 40, 36}, {9, 8, 3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}},
      {{3, 4, 50}, {6, 4, 5}, {2}, {1}, {2, 1}},
      {{2, 3, 4, 5, 6}, {5, 3, 2, 3, 2}, {1, 2, 1}, {1, 1, 2}, {1, 0, 1, 0, 1, 1}},
      // Small planes in chunks of three images, then two (8 MiB of column panels a chunk).
      {{5, 64, 30, 30}, {8, 64, 3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}},
      // Stride 1, read in place from padded grids: dilation and asymmetric pads (grid rows of
      // 6 keeping 4, panels across rows and images), pads wider than the window (rows of
      // padding only), a 1-D window, and many output channels on a small plane (packed
      // columns instead: the padded grid would cost more than it saves).
      {{3, 5, 6, 4}, {40, 5, 2, 3}, {1, 1}, {2, 1}, {1, 0, 0, 2}},
      {{1, 2, 4, 5}, {3, 2, 3, 3}, {1, 1}, {1, 1}, {3, 0, 2, 4}, false},
      {{2, 3, 30}, {6, 3, 4}, {1}, {2}, {3, 1}},
      // More padding after the data than before (the grid's rows of zeros between images are
      // the larger of the two).
      {{3, 4, 6, 5}, {5, 4, 3, 3}, {1, 1}, {1, 1}, {0, 1, 2, 1}},
      // Strided windows read from their phase planes in place: 3 x 3 at stride 2, 7 x 7 at
      // stride 2 padded by 3 (ResNet-50's first layer's shape), a dilated one at strides 3 x 2,
      // a 1-D window at stride 2; a strided 1 x 1 window packs its columns instead.
      {{2, 5, 13, 11}, {6, 5, 3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}},
      {{2, 3, 20, 18}, {8, 3, 7, 7}, {2, 2}, {1, 1}, {3, 3, 3, 3}},
      {{3, 2, 14, 12}, {4, 2, 3, 2}, {3, 2}, {2, 1}, {2, 0, 1, 1}},
      {{2, 3, 31}, {5, 3, 5}, {2}, {1}, {2, 2}},
      {{2, 6, 9, 9}, {4, 6, 1, 1}, {2, 2}, {1, 1}, {0, 0, 0, 0}},
      {{2, 16, 5, 5}, {200, 16, 3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}},
      // On the lane product's AVX2 kernel, tiles of 6 positions that run on into the next
      // output row (7 x 7 planes; a 6 x 7 plane at stride 2), reading B past the padding.
      {{2, 8, 7, 7}, {24, 8, 3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}},
      {{2, 8, 11, 13}, {10, 8, 3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}},
      // 1 x 1 windows on planes of up to 256 positions: on the lane product where it runs,
      // the input planes read in place (several passes over 130 and 140 channels).
      {{2, 128, 4, 8}, {20, 128, 1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}},
      {{3, 130, 4, 4}, {7, 130, 1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}, false},
      {{2, 140, 5, 5}, {9, 140, 1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}},
      {{1, 200, 1, 7}, {33, 200, 1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}},
      // 1 x 1 windows of at least 64 channels on larger planes of whole panels (16 x 17): each
      // image's planes read in place by the panels; 17 x 17 planes (not whole panels) and 63
      // channels pack their columns.
      {{2, 128, 16, 17}, {20, 128, 1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}},
      {{2, 64, 16, 17}, {20, 64, 1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}},
      {{2, 63, 16, 17}, {12, 63, 1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}},
      {{2, 140, 17, 17}, {9, 140, 1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}},
  };
  uint32_t seed = 900;
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const PackedCase& c = cases[ci];
    const std::string what = "case " + std::to_string(ci);
    const Tensor x = random_f32(c.x, seed++), w = random_f32(c.w, seed++);
    const Tensor b = random_f32({c.w[0]}, seed++);
    const std::vector<float> bias = c.bias ? values<float>(b) : std::vector<float>{};
    Shape shape;
    const auto want = fma_conv(x, w, bias, c, shape);
    // The widest kernel this CPU has, then the AVX2 one.
    for (const bool avx2 : {false, true}) {
      packed_gemm_use_avx2_only(avx2);
      for (int threads : {1, 2, 3}) {
        const Tensor y = run_conv_graph(c, x, w, b, threads, true);
        ASSERT_EQ(y.shape(), shape) << what;
        expect_same_bits(values<float>(y), want,
                         what + ", " + std::to_string(threads) + " threads, avx2 " +
                             std::to_string(avx2));
      }
    }
    packed_gemm_use_avx2_only(false);
    // The last image alone.
    const auto xv = values<float>(x);
    const auto per_image = static_cast<int64_t>(x.numel()) / c.x[0];
    Shape one = c.x;
    one[0] = 1;
    const Tensor x1 = f32(one, std::vector<float>(xv.end() - per_image, xv.end()));
    const auto per_out = static_cast<int64_t>(want.size()) / c.x[0];
    expect_same_bits(values<float>(run_conv_graph(c, x1, w, b, 2, true)),
                std::vector<float>(want.end() - per_out, want.end()), what + ", image alone");
    const auto plain = values<float>(run_conv_graph(c, x, w, b, 2, false));
    for (size_t i = 0; i < plain.size(); ++i) ASSERT_NEAR(plain[i], want[i], 1e-4f) << what;
  }
}

// Weights packed for the lane product (a 3 x 3 window, strided and not; a 1x1 window on a
// small plane where the AVX-512 kernel runs) by an executor built with it, run with it turned
// off: packed in row groups for the call, the same FMA chains, bit for bit.
TEST(Conv, LanePackedWeightsRunOnThePanelsWhenTheLaneProductIsOff) {
  if (!lane_gemm_supported()) GTEST_SKIP() << "this CPU lacks AVX2/FMA, the lane product's";
  const std::vector<PackedCase> cases = {
      {{2, 8, 9, 11}, {40, 8, 3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}},
      {{2, 9, 13, 11}, {6, 9, 3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}},
      {{3, 20, 5, 4}, {18, 20, 1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}},
  };
  uint32_t seed = 970;
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const PackedCase& c = cases[ci];
    const Tensor x = random_f32(c.x, seed++), w = random_f32(c.w, seed++);
    const Tensor b = random_f32({c.w[0]}, seed++);
    Shape shape;
    const auto want = fma_conv(x, w, values<float>(b), c, shape);
    for (int threads : {1, 2}) {
      const Tensor y = run_conv_graph(c, x, w, b, threads, true, true);
      ASSERT_EQ(y.shape(), shape);
      expect_same_bits(values<float>(y), want,
                       "case " + std::to_string(ci) + ", " + std::to_string(threads) + " threads");
    }
  }
}

// An empty batch through packed weights: an empty output of the right shape.
TEST(Conv, EmptyBatchWithConstantWeights) {
  const PackedCase c{{0, 3, 6, 6}, {4, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}};
  const Tensor y = run_conv_graph(c, Tensor(DType::F32, {0, 3, 6, 6}), random_f32(c.w, 960),
                                  random_f32({4}, 961), 2, true);
  EXPECT_EQ(y.shape(), (Shape{0, 4, 6, 6}));
  EXPECT_EQ(y.numel(), 0u);
}

// A grouped Conv's weights are not packed: it runs im2col and sgemm per group, as before.
TEST(Conv, GroupedConstantWeightsMatchNaive) {
  const PackedCase c{{3, 8, 6, 6}, {6, 4, 3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}};
  const Tensor x = random_f32(c.x, 950), w = random_f32(c.w, 951), b = random_f32({6}, 952);
  Graph g;
  g.set_opset("", 21);
  g.inputs.push_back({.name = "x", .dtype = DType::F32});
  g.set_initializer("w", w);
  g.set_initializer("b", b);
  Node node;
  node.name = "conv";
  node.op_type = "Conv";
  node.inputs = {"x", "w", "b"};
  node.attributes = {attr_int("group", 2), attr_ints("pads", {1, 1, 1, 1})};
  node.outputs = {"y"};
  g.nodes.push_back(std::move(node));
  g.outputs.push_back({.name = "y"});
  const Executor ex(g, {.device = Device::Cpu, .threads = 2});
  const auto got = values<float>(ex.run({{"x", x}}).at(0));
  Shape shape;
  const auto want = naive_conv(x, w, b, {.group = 2, .pad_t = 1, .pad_l = 1, .pad_b = 1,
                                         .pad_r = 1}, shape);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-4f) << i;
}

TEST(ConvTranspose, StridesPadsAndOutputShape) {
  const Tensor x = f32({1, 1, 2, 2}, {1, 2, 3, 4});
  EXPECT_EQ(values<float>(run1({"ConvTranspose", {x, kOnes22}})),
            (std::vector<float>{1, 3, 2, 4, 10, 6, 3, 7, 4}));
  EXPECT_EQ(values<float>(run1({"ConvTranspose", {x, kOnes22}, {attr_ints("strides", {2, 2})}})),
            (std::vector<float>{1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4}));
  EXPECT_EQ(values<float>(run1(
                {"ConvTranspose", {x, kOnes22, f32({1}, {1})}, {attr_ints("pads", {1, 1, 1, 1})}})),
            (std::vector<float>{11}));
  // output_padding adds a row/col at the end; output_shape picks pads to reach a size.
  EXPECT_EQ(run1({"ConvTranspose",
                  {x, kOnes22},
                  {attr_ints("strides", {2, 2}), attr_ints("output_padding", {1, 1})}})
                .shape(),
            (Shape{1, 1, 5, 5}));
  const Tensor y = run1({"ConvTranspose", {x, kOnes22}, {attr_ints("output_shape", {2, 2})}});
  EXPECT_EQ(values<float>(y), (std::vector<float>{10, 6, 7, 4}));  // the odd pad goes first
}

TEST(ConvTranspose, GroupsAndDilationMatchScatterDefinition) {
  const Tensor x = random_f32({2, 4, 3, 5}, 7);
  const Tensor w = random_f32({4, 3, 2, 3}, 8);  // C=4, M/g=3, g=2 -> M=6
  const int64_t s = 2, d = 2, pt = 1, pl = 0, pb = 0, pr = 2;
  const Tensor y = run1({"ConvTranspose",
                         {x, w},
                         {attr_int("group", 2), attr_ints("strides", {s, s}),
                          attr_ints("dilations", {d, d}), attr_ints("pads", {pt, pl, pb, pr})}});
  const int64_t oh = s * 2 + (1 * d + 1) - pt - pb, ow = s * 4 + (2 * d + 1) - pl - pr;
  ASSERT_EQ(y.shape(), (Shape{2, 6, oh, ow}));
  std::vector<double> want(static_cast<size_t>(2 * 6 * oh * ow), 0.0);
  const auto xv = x.data<float>(), wv = w.data<float>();
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t c = 0; c < 4; ++c)
      for (int64_t iy = 0; iy < 3; ++iy)
        for (int64_t ix = 0; ix < 5; ++ix)
          for (int64_t mo = 0; mo < 3; ++mo)
            for (int64_t ky = 0; ky < 2; ++ky)
              for (int64_t kx = 0; kx < 3; ++kx) {
                const int64_t oy = iy * s - pt + ky * d, ox = ix * s - pl + kx * d;
                if (oy < 0 || oy >= oh || ox < 0 || ox >= ow) continue;
                const int64_t m = (c / 2) * 3 + mo;
                want[static_cast<size_t>(((n * 6 + m) * oh + oy) * ow + ox)] +=
                    static_cast<double>(xv[static_cast<size_t>(((n * 4 + c) * 3 + iy) * 5 + ix)]) *
                    wv[static_cast<size_t>(((c * 3 + mo) * 2 + ky) * 3 + kx)];
              }
  const auto got = values<float>(y);
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5) << i;
}
