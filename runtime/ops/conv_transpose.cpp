// ConvTranspose: sgemm into columns (W^T X per group), then col2im scattered per output
// channel, so every output element sums its contributions in one fixed order.
#include "kernels/gemm.h"
#include "runtime/op_utils.h"
#include "runtime/ops/window.h"

namespace qforge::ops {

namespace {

// Output size, pads and strides per the ONNX ConvTranspose rules (output_shape wins over
// pads; auto_pad SAME_* aims at in * stride).
Window transpose_window(const OpContext& ctx, std::span<const int64_t> in,
                        std::span<const int64_t> kernel) {
  const size_t r = in.size();
  auto list = [&](std::string_view name, int64_t fallback, size_t n) {
    auto v = ctx.attr_ints(name);
    if (!v || v->empty()) return std::vector<int64_t>(n, fallback);
    if (v->size() != n) {
      ctx.fail_invalid("attribute '" + std::string(name) + "' has " + std::to_string(v->size()) +
                       " values; expected " + std::to_string(n));
    }
    return *v;
  };
  Window w;
  w.in.assign(in.begin(), in.end());
  w.kernel.assign(kernel.begin(), kernel.end());
  w.strides = list("strides", 1, r);
  w.dilations = list("dilations", 1, r);
  const auto pads = list("pads", 0, 2 * r);
  const auto out_pad = list("output_padding", 0, r);
  const auto out_shape_attr = ctx.attr_ints("output_shape");
  const std::string auto_pad = ctx.attr_string("auto_pad", "NOTSET");
  w.pad_begin.assign(pads.begin(), pads.begin() + static_cast<std::ptrdiff_t>(r));
  w.pad_end.assign(pads.begin() + static_cast<std::ptrdiff_t>(r), pads.end());
  w.out.resize(r);
  for (size_t i = 0; i < r; ++i) {
    if (w.strides[i] < 1 || w.dilations[i] < 1)
      ctx.fail_invalid("strides and dilations must be >= 1");
    const int64_t full = w.strides[i] * (in[i] - 1) + out_pad[i] + w.extent(i);
    int64_t target = -1;
    if (out_shape_attr && !out_shape_attr->empty()) {
      // output_shape may list all dims or the spatial ones only.
      const auto& os = *out_shape_attr;
      if (os.size() != r && os.size() != r + 2) ctx.fail_invalid("output_shape has the wrong rank");
      target = os[os.size() - r + i];
    } else if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      target = in[i] * w.strides[i];
    } else if (auto_pad == "VALID") {
      w.pad_begin[i] = w.pad_end[i] = 0;
    } else if (auto_pad != "NOTSET") {
      ctx.fail_invalid("attribute 'auto_pad' is '" + auto_pad + "'");
    }
    if (target >= 0) {
      // A target past the full output makes the total negative: the extra rows are zeros
      // (plus bias). Halves are floored, as the ONNX reference does.
      const int64_t total = full - target;
      const int64_t half = total >= 0 ? total / 2 : -((-total + 1) / 2);
      // SAME_UPPER puts the odd pad at the end; NOTSET and SAME_LOWER at the start (spec).
      w.pad_begin[i] = auto_pad == "SAME_UPPER" ? half : total - half;
      w.pad_end[i] = total - w.pad_begin[i];
    }
    w.out[i] = full - w.pad_begin[i] - w.pad_end[i];
    if (w.out[i] < 0) ctx.fail_invalid("pads exceed the output size");
  }
  return w;
}

}  // namespace

void run_conv_transpose(OpContext& ctx) {
  const DType dt = float_dtype(ctx, 0);
  if (ctx.input(1).dtype() != dt) ctx.fail_dtype(1);
  const Tensor x = to_f32(ctx.input(0));
  const Tensor w = to_f32(ctx.input(1));
  if (x.rank() < 3 || w.rank() != x.rank()) {
    ctx.fail_invalid("X " + shape_to_string(x.shape()) + " and W " + shape_to_string(w.shape()) +
                     " must both be [N, C, spatial...] / [C, M/group, kernel...] of equal rank");
  }
  const size_t r = x.rank() - 2;
  const int64_t batch = x.shape()[0], cin = x.shape()[1];
  const int64_t group = ctx.attr_int("group", 1);
  if (group < 1 || cin % group != 0 || w.shape()[0] != cin) {
    ctx.fail_invalid("group " + std::to_string(group) + " does not fit X " +
                     shape_to_string(x.shape()) + " and W " + shape_to_string(w.shape()));
  }
  const int64_t mg = w.shape()[1], cout = mg * group, cg = cin / group;
  const std::vector<int64_t> wk(w.shape().begin() + 2, w.shape().end());
  const Window win = transpose_window(ctx, std::span(x.shape()).subspan(2), wk);
  Tensor b;
  if (ctx.has_input(2)) {
    if (ctx.input(2).dtype() != dt) ctx.fail_dtype(2);
    b = to_f32(ctx.input(2));
    if (b.numel() != static_cast<uint64_t>(cout)) ctx.fail_invalid("bias does not match M");
  }
  Shape out_shape{batch, cout};
  out_shape.insert(out_shape.end(), win.out.begin(), win.out.end());
  Tensor out(DType::F32, out_shape);
  const int64_t ksize = win.kernel_size(), isize = win.in_size(), osize = win.out_size();
  const float* px = x.data<float>().data();
  const float* pw = w.data<float>().data();
  float* po = out.mutable_data<float>().data();
  // col[g] [mg * ksize, isize] = W_g^T [mg * ksize, cg] @ X_g [cg, isize]
  std::vector<float> col(static_cast<size_t>(group * mg * ksize * isize));
  const GemmShape g{.trans_a = true,
                    .m = mg * ksize,
                    .n = isize,
                    .k = cg,
                    .lda = mg * ksize,
                    .ldb = isize,
                    .ldc = isize};
  const auto ostr = contiguous_strides(win.out);
  for (int64_t n = 0; n < batch; ++n) {
    std::vector<const float*> as, bs;
    std::vector<float*> cs;
    for (int64_t gi = 0; gi < group; ++gi) {
      as.push_back(pw + gi * cg * mg * ksize);
      bs.push_back(px + (n * cin + gi * cg) * isize);
      cs.push_back(col.data() + gi * mg * ksize * isize);
    }
    gemm_f32_batched(ctx.threads(), g, as, bs, cs);
    float* on = po + n * cout * osize;
    parallel_chunks(ctx.threads(), cout, 1, [&](int64_t begin, int64_t end) {
      std::vector<int64_t> kidx(r), iidx(r);
      for (int64_t m = begin; m < end; ++m) {
        float* plane = on + m * osize;
        if (!b.empty()) std::fill(plane, plane + osize, b.data<float>()[static_cast<size_t>(m)]);
        for (int64_t kk = 0; kk < ksize; ++kk) {
          int64_t rem = kk;
          for (size_t j = r; j-- > 0;) {
            kidx[j] = rem % win.kernel[j];
            rem /= win.kernel[j];
          }
          const float* src = col.data() + (m * ksize + kk) * isize;
          for (int64_t i = 0; i < isize; ++i) {
            int64_t irem = i, off = 0;
            bool inside = true;
            for (size_t j = r; j-- > 0;) {
              iidx[j] = irem % win.in[j];
              irem /= win.in[j];
              const int64_t o =
                  iidx[j] * win.strides[j] - win.pad_begin[j] + kidx[j] * win.dilations[j];
              inside = inside && o >= 0 && o < win.out[j];
              off += o * ostr[j];
            }
            if (inside) plane[off] += src[i];
          }
        }
      }
    });
  }
  ctx.set_output(0, from_f32(out, dt));
}

}  // namespace qforge::ops
