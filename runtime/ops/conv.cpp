// Conv (any spatial rank, groups, dilations, pads, auto_pad) as im2col + sgemm: one product
// per image for large output planes, one wide product per chunk of images for small ones.
#include <memory>

#include "kernels/gemm.h"
#include "runtime/op_registry.h"
#include "runtime/op_utils.h"
#include "runtime/ops/window.h"

namespace qforge::ops {

void run_conv_transpose(OpContext& ctx);  // conv_transpose.cpp

namespace {

// Images per im2col batch: keeps the column buffer near 32 MiB. Depends on shapes only.
int64_t images_per_chunk(int64_t col_floats_per_image) {
  constexpr int64_t kColumnBudget = int64_t{32} << 20 >> 2;
  return std::max<int64_t>(1, kColumnBudget / std::max<int64_t>(1, col_floats_per_image));
}

// Output planes smaller than this many positions: the images of a chunk share one wide product
// per group (their columns side by side), so the weights are packed once per chunk instead of
// once per image, and a product has enough columns to keep OpenBLAS's kernel busy.
constexpr int64_t kWideBelow = 1024;

struct ConvDims {
  int64_t batch, cin, cout, group;
};

// Conv of small output planes: per chunk of images, im2col into [cin * k][images * out] (images
// side by side), one product per group into [cout][images * out], then each image's planes
// copied out with the bias added. Chunks and tiles follow the shapes only.
void run_conv_wide(const OpContext& ctx, const Window& win, const ConvDims& d, const float* px,
                   const float* pw, const float* bias, float* po) {
  const int64_t cg = d.cin / d.group, mg = d.cout / d.group;
  const int64_t ksize = win.kernel_size(), isize = win.in_size(), osize = win.out_size();
  // Chunks whose column matrix stays in L2 (about 256 KiB): it is written, then read by the
  // product while it is still there.
  constexpr int64_t kWideColumnFloats = int64_t{256} << 10 >> 2;
  const int64_t chunk = std::max<int64_t>(1, kWideColumnFloats / (d.cin * ksize * osize + 1));
  const int64_t first = std::min(chunk, d.batch);
  // Column rows padded by 16 floats: a power-of-two row length would put the rows an image
  // writes into the same cache sets.
  const auto col = std::make_unique_for_overwrite<float[]>(
      static_cast<size_t>(d.cin * ksize * (first * osize + 16)));
  const auto prod = std::make_unique_for_overwrite<float[]>(
      static_cast<size_t>(first * d.cout * osize));
  for (int64_t n0 = 0; n0 < d.batch; n0 += chunk) {
    const int64_t nb = std::min(chunk, d.batch - n0);
    const int64_t wide = nb * osize, ldb = wide + 16;
    im2col(ctx, win, px + n0 * d.cin * isize, nb, d.cin, col.get(), osize, ldb);
    const GemmShape g{
        .m = mg, .n = wide, .k = cg * ksize, .lda = cg * ksize, .ldb = ldb, .ldc = wide};
    std::vector<const float*> as, bs;
    std::vector<float*> cs;
    for (int64_t gi = 0; gi < d.group; ++gi) {
      as.push_back(pw + gi * mg * cg * ksize);
      bs.push_back(col.get() + gi * cg * ksize * ldb);
      cs.push_back(prod.get() + gi * mg * wide);
    }
    gemm_f32_batched(ctx.threads(), g, as, bs, cs);
    // prod [cout][nb][out] -> po [n0 + i][cout][out], plus the bias.
    parallel_chunks(ctx.threads(), nb * d.cout, grain_for(osize), [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) {
        const int64_t i = p / d.cout, m = p % d.cout;
        const float bv = bias != nullptr ? bias[m] : 0.0f;
        const float* src = prod.get() + m * wide + i * osize;
        float* dst = po + ((n0 + i) * d.cout + m) * osize;
        if (bias != nullptr) {
          for (int64_t o = 0; o < osize; ++o) dst[o] = src[o] + bv;
        } else {
          for (int64_t o = 0; o < osize; ++o) dst[o] = src[o];
        }
      }
    });
  }
}

void run_conv(OpContext& ctx) {
  const DType dt = float_dtype(ctx, 0);
  if (ctx.input(1).dtype() != dt) ctx.fail_dtype(1);
  const Tensor x = to_f32(ctx.input(0));
  const Tensor w = to_f32(ctx.input(1));
  if (x.rank() < 3 || w.rank() != x.rank()) {
    ctx.fail_invalid("X " + shape_to_string(x.shape()) + " and W " + shape_to_string(w.shape()) +
                     " must both be [N, C, spatial...] / [M, C/group, kernel...] of equal rank");
  }
  const size_t r = x.rank() - 2;
  const int64_t batch = x.shape()[0], cin = x.shape()[1], cout = w.shape()[0];
  const int64_t group = ctx.attr_int("group", 1);
  if (group < 1 || cin % group != 0 || cout % group != 0 || w.shape()[1] * group != cin) {
    ctx.fail_invalid("group " + std::to_string(group) + " does not fit X " +
                     shape_to_string(x.shape()) + " and W " + shape_to_string(w.shape()));
  }
  const std::vector<int64_t> wk(w.shape().begin() + 2, w.shape().end());
  if (auto k = ctx.attr_ints("kernel_shape"); k && *k != wk) {
    ctx.fail_invalid("kernel_shape " + shape_to_string(*k) + " disagrees with W " +
                     shape_to_string(w.shape()));
  }
  const Window win = forward_window(ctx, std::span(x.shape()).subspan(2), wk, /*ceil_mode=*/false);
  const float* bias = nullptr;
  Tensor b;
  if (ctx.has_input(2)) {
    if (ctx.input(2).dtype() != dt) ctx.fail_dtype(2);
    b = to_f32(ctx.input(2));
    if (b.numel() != static_cast<uint64_t>(cout)) {
      ctx.fail_invalid("bias " + shape_to_string(b.shape()) + " does not match " +
                       std::to_string(cout) + " output channels");
    }
    bias = b.data<float>().data();
  }

  Shape out_shape{batch, cout};
  out_shape.insert(out_shape.end(), win.out.begin(), win.out.end());
  Tensor out(DType::F32, out_shape);
  const int64_t cg = cin / group, mg = cout / group;
  const int64_t ksize = win.kernel_size(), isize = win.in_size(), osize = win.out_size();
  bool direct = true;  // 1x1, stride 1, no pad: X is already the column matrix
  for (size_t i = 0; i < r; ++i) {
    direct = direct && win.kernel[i] == 1 && win.strides[i] == 1 && win.pad_begin[i] == 0 &&
             win.pad_end[i] == 0;
  }
  const float* px = x.data<float>().data();
  const float* pw = w.data<float>().data();
  float* po = out.mutable_data<float>().data();
  if (batch > 1 && osize < kWideBelow) {
    run_conv_wide(ctx, win, {.batch = batch, .cin = cin, .cout = cout, .group = group}, px, pw,
                  bias, po);
    ctx.set_output(0, from_f32(out, dt));
    return;
  }
  const int64_t col_per_image = direct ? 0 : cin * ksize * osize;
  const int64_t chunk = images_per_chunk(col_per_image);
  const auto col = std::make_unique_for_overwrite<float[]>(
      static_cast<size_t>(std::min(chunk, batch) * col_per_image));
  // One product per image and group: a large output plane gives each product enough columns.
  const GemmShape g{
      .m = mg, .n = osize, .k = cg * ksize, .lda = cg * ksize, .ldb = osize, .ldc = osize};
  for (int64_t n0 = 0; n0 < batch; n0 += chunk) {
    const int64_t nb = std::min(chunk, batch - n0);
    const float* xs = px + n0 * cin * isize;
    if (!direct) im2col(ctx, win, xs, nb, cin, col.get(), col_per_image, osize);
    std::vector<const float*> as, bs;
    std::vector<float*> cs;
    for (int64_t i = 0; i < nb; ++i) {
      const float* img = xs + i * cin * isize;
      const float* colimg = direct ? nullptr : col.get() + i * col_per_image;
      for (int64_t gi = 0; gi < group; ++gi) {
        as.push_back(pw + gi * mg * cg * ksize);
        bs.push_back(direct ? img + gi * cg * isize : colimg + gi * cg * ksize * osize);
        cs.push_back(po + ((n0 + i) * cout + gi * mg) * osize);
      }
    }
    gemm_f32_batched(ctx.threads(), g, as, bs, cs);
  }
  if (bias != nullptr) {
    parallel_chunks(ctx.threads(), batch * cout, grain_for(osize), [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) {
        const float bv = bias[p % cout];
        float* plane = po + p * osize;
        for (int64_t i = 0; i < osize; ++i) plane[i] += bv;
      }
    });
  }
  ctx.set_output(0, from_f32(out, dt));
}

constexpr OpEntry kOps[] = {
    {"", "Conv", run_conv},
    {"", "ConvTranspose", run_conv_transpose},
};

}  // namespace

std::span<const OpEntry> conv_ops() { return kOps; }

}  // namespace qforge::ops
