#include "runtime/ops/window.h"

#include <algorithm>

#include "runtime/op_utils.h"

namespace qforge::ops {

int64_t Window::kernel_size() const { return dims_product(kernel, 0, kernel.size()); }
int64_t Window::in_size() const { return dims_product(in, 0, in.size()); }
int64_t Window::out_size() const { return dims_product(out, 0, out.size()); }

namespace {

std::vector<int64_t> ints_or(const OpContext& ctx, std::string_view name, size_t rank,
                             int64_t fallback, size_t expected) {
  auto v = ctx.attr_ints(name);
  // NOLINTNEXTLINE(modernize-return-braced-init-list): a count and a value, not a list
  if (!v || v->empty()) return std::vector<int64_t>(expected, fallback);
  if (v->size() != expected) {
    ctx.fail_invalid("attribute '" + std::string(name) + "' has " + std::to_string(v->size()) +
                     " values; expected " + std::to_string(expected) + " for " +
                     std::to_string(rank) + " spatial dims");
  }
  return *v;
}

}  // namespace

std::vector<int64_t> kernel_shape_attr(const OpContext& ctx, size_t spatial_rank) {
  const auto k = ctx.attr_ints("kernel_shape");
  if (!k) ctx.fail_invalid("attribute 'kernel_shape' is required");
  if (k->size() != spatial_rank) {
    ctx.fail_invalid("kernel_shape has " + std::to_string(k->size()) + " dims but the input has " +
                     std::to_string(spatial_rank) + " spatial dims");
  }
  for (int64_t d : *k) {
    if (d < 1) ctx.fail_invalid("kernel_shape holds " + std::to_string(d));
  }
  return *k;
}

Window forward_window(const OpContext& ctx, std::span<const int64_t> in,
                      std::span<const int64_t> kernel, bool ceil_mode) {
  const size_t r = in.size();
  Window w;
  w.in.assign(in.begin(), in.end());
  w.kernel.assign(kernel.begin(), kernel.end());
  w.strides = ints_or(ctx, "strides", r, 1, r);
  w.dilations = ints_or(ctx, "dilations", r, 1, r);
  const auto pads = ints_or(ctx, "pads", r, 0, 2 * r);
  for (size_t i = 0; i < r; ++i) {
    if (w.strides[i] < 1 || w.dilations[i] < 1)
      ctx.fail_invalid("strides and dilations must be >= 1");
    if (pads[i] < 0 || pads[r + i] < 0) ctx.fail_invalid("pads must be >= 0");
  }
  w.pad_begin.assign(pads.begin(), pads.begin() + static_cast<std::ptrdiff_t>(r));
  w.pad_end.assign(pads.begin() + static_cast<std::ptrdiff_t>(r), pads.end());
  const std::string auto_pad = ctx.attr_string("auto_pad", "NOTSET");
  w.out.resize(r);
  for (size_t i = 0; i < r; ++i) {
    const int64_t ext = w.extent(i);
    if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      w.out[i] = (in[i] + w.strides[i] - 1) / w.strides[i];
      const int64_t total = std::max<int64_t>(0, (w.out[i] - 1) * w.strides[i] + ext - in[i]);
      const int64_t small = total / 2;
      w.pad_begin[i] = auto_pad == "SAME_UPPER" ? small : total - small;
      w.pad_end[i] = total - w.pad_begin[i];
      continue;
    }
    if (auto_pad == "VALID") {
      w.pad_begin[i] = w.pad_end[i] = 0;
    } else if (auto_pad != "NOTSET") {
      ctx.fail_invalid("attribute 'auto_pad' is '" + auto_pad + "'");
    }
    const int64_t span = in[i] + w.pad_begin[i] + w.pad_end[i] - ext;
    if (span < 0) {
      ctx.fail_invalid("kernel extent " + std::to_string(ext) + " exceeds padded input size " +
                       std::to_string(in[i] + w.pad_begin[i] + w.pad_end[i]) + " in spatial dim " +
                       std::to_string(i));
    }
    w.out[i] = (ceil_mode ? (span + w.strides[i] - 1) / w.strides[i] : span / w.strides[i]) + 1;
    // A window may not start inside the end padding only.
    if (ceil_mode && (w.out[i] - 1) * w.strides[i] >= in[i] + w.pad_begin[i]) --w.out[i];
  }
  return w;
}

namespace {

// The column-matrix rows of one channel plane of a 2-D window, tap by tap (kh, kw), every output
// position. Which output columns a kw reads inside the input ([lo, hi)) is precomputed per kw,
// so the loops divide nothing; they are plain loops, as the rows of small images are a few
// floats long, too short for memcpy/memset calls to pay.
struct Cols2d {
  std::vector<int64_t> lo, hi, shift;  // per kw
};

Cols2d cols_2d(const Window& w) {
  const auto ceil_div = [](int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : a / b; };
  Cols2d c;
  for (int64_t kw = 0; kw < w.kernel[1]; ++kw) {
    const int64_t shift = kw * w.dilations[1] - w.pad_begin[1];
    const int64_t lo = std::clamp<int64_t>(ceil_div(-shift, w.strides[1]), 0, w.out[1]);
    c.lo.push_back(lo);
    c.hi.push_back(std::clamp<int64_t>(ceil_div(w.in[1] - shift, w.strides[1]), lo, w.out[1]));
    c.shift.push_back(shift);
  }
  return c;
}

void im2col_plane_2d(const Window& w, const Cols2d& cols, const float* plane, float* dst,
                     int64_t row_stride) {
  const int64_t oh_n = w.out[0], ow_n = w.out[1], ih_n = w.in[0], iw_n = w.in[1];
  const int64_t sh = w.strides[0], sw = w.strides[1];
  for (int64_t kh = 0; kh < w.kernel[0]; ++kh) {
    const int64_t row_shift = kh * w.dilations[0] - w.pad_begin[0];
    for (int64_t kw = 0; kw < w.kernel[1]; ++kw, dst += row_stride) {
      const auto u = static_cast<size_t>(kw);
      const int64_t lo = cols.lo[u], hi = cols.hi[u];
      float* d = dst;
      for (int64_t oh = 0; oh < oh_n; ++oh, d += ow_n) {
        const int64_t ih = oh * sh + row_shift;
        if (ih < 0 || ih >= ih_n) {
          for (int64_t ow = 0; ow < ow_n; ++ow) d[ow] = 0.0f;
          continue;
        }
        const float* src = plane + ih * iw_n + cols.shift[u];
        for (int64_t ow = 0; ow < lo; ++ow) d[ow] = 0.0f;
        if (sw == 1) {
          for (int64_t ow = lo; ow < hi; ++ow) d[ow] = src[ow];
        } else {
          for (int64_t ow = lo; ow < hi; ++ow) d[ow] = src[ow * sw];
        }
        for (int64_t ow = hi; ow < ow_n; ++ow) d[ow] = 0.0f;
      }
    }
  }
}

// im2col_plane_2d for stride 1 along the width and narrow outputs (the rows there are a few
// floats, and the edge handling per row costs more than the copy): the plane is first copied
// into `padded`, zeros around it, so that every tap's row is one plain copy. The same bytes:
// a tap reads the plane's value or a zero where it reads padding, as above.
void im2col_plane_2d_padded(const Window& w, const float* plane, float* dst, int64_t row_stride,
                            std::vector<float>& padded) {
  const int64_t oh_n = w.out[0], ow_n = w.out[1], ih_n = w.in[0], iw_n = w.in[1];
  const int64_t sh = w.strides[0];
  const int64_t top = w.pad_begin[0], left = w.pad_begin[1];
  // Rows and columns any tap reads, counted from the padding's start (a pool's ceil mode may
  // read past the end padding: zeros too).
  const int64_t rows = std::max(ih_n + top, (oh_n - 1) * sh + w.extent(0));
  const int64_t cols = std::max(iw_n + left, ow_n - 1 + w.extent(1));
  padded.assign(static_cast<size_t>(rows * cols), 0.0f);
  for (int64_t ih = 0; ih < ih_n; ++ih) {
    std::copy(plane + ih * iw_n, plane + (ih + 1) * iw_n, padded.data() + (ih + top) * cols + left);
  }
  for (int64_t kh = 0; kh < w.kernel[0]; ++kh) {
    for (int64_t kw = 0; kw < w.kernel[1]; ++kw, dst += row_stride) {
      const float* src = padded.data() + kh * w.dilations[0] * cols + kw * w.dilations[1];
      float* d = dst;
      for (int64_t oh = 0; oh < oh_n; ++oh, d += ow_n) {
        const float* s = src + oh * sh * cols;
        for (int64_t ow = 0; ow < ow_n; ++ow) d[ow] = s[ow];
      }
    }
  }
}

constexpr int64_t kPaddedPlaneMaxWidth = 32;  // output widths the padded copy is used for

// Row `tap` of a channel plane's column matrix for any spatial rank: out_size floats at dst.
// `istr` holds contiguous_strides(w.in); kidx and oidx are scratch.
void im2col_row(const Window& w, std::span<const int64_t> istr, const float* xc, int64_t tap,
                float* dst, std::vector<int64_t>& kidx, std::vector<int64_t>& oidx) {
  const size_t r = w.rank();
  const size_t last = r - 1;
  const int64_t olast = w.out[last], ilast = w.in[last];
  const int64_t s = w.strides[last], pad = w.pad_begin[last];
  const int64_t outer = olast == 0 ? 0 : w.out_size() / olast;
  const auto ceil_div = [](int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : a / b; };
  kidx.resize(r);
  oidx.assign(r, 0);
  int64_t rem = tap;
  for (size_t j = r; j-- > 0;) {
    kidx[j] = rem % w.kernel[j];
    rem /= w.kernel[j];
  }
  // Output columns whose tap lands inside the input along the last dim.
  const int64_t shift = kidx[last] * w.dilations[last] - pad;
  const int64_t lo = std::clamp<int64_t>(ceil_div(-shift, s), 0, olast);
  const int64_t hi = std::clamp<int64_t>(ceil_div(ilast - shift, s), lo, olast);
  for (int64_t o = 0; o < outer; ++o) {
    int64_t off = 0;
    bool inside = true;
    for (size_t j = 0; j < last; ++j) {
      const int64_t ij = oidx[j] * w.strides[j] - w.pad_begin[j] + kidx[j] * w.dilations[j];
      inside = inside && ij >= 0 && ij < w.in[j];
      off += ij * istr[j];
    }
    float* d = dst + o * olast;
    if (!inside) {
      std::fill(d, d + olast, 0.0f);
    } else {
      std::fill(d, d + lo, 0.0f);
      const float* src = xc + off + shift;
      if (s == 1) {
        std::copy(src + lo, src + hi, d + lo);
      } else {
        for (int64_t ol = lo; ol < hi; ++ol) d[ol] = src[ol * s];
      }
      std::fill(d + hi, d + olast, 0.0f);
    }
    for (size_t j = last; j-- > 0;) {  // next output row
      if (++oidx[j] < w.out[j]) break;
      oidx[j] = 0;
    }
  }
}

}  // namespace

struct PlaneColumns::State {
  const Window& w;
  Cols2d cols;
  bool padded_copy = false;
  std::vector<float> padded;
  std::vector<int64_t> istr, kidx, oidx;
};

PlaneColumns::PlaneColumns(const Window& w) : s_(std::make_unique<State>(State{.w = w})) {
  if (w.rank() == 2) {
    s_->cols = cols_2d(w);
    s_->padded_copy = w.strides[1] == 1 && w.out[1] <= kPaddedPlaneMaxWidth;
  }
  s_->istr = contiguous_strides(w.in);
}

PlaneColumns::~PlaneColumns() = default;

void PlaneColumns::fill(const float* plane, float* dst, int64_t row_stride) {
  const Window& w = s_->w;
  if (w.rank() == 2 && s_->padded_copy) {
    im2col_plane_2d_padded(w, plane, dst, row_stride, s_->padded);
  } else if (w.rank() == 2) {
    im2col_plane_2d(w, s_->cols, plane, dst, row_stride);
  } else {
    for (int64_t tap = 0; tap < w.kernel_size(); ++tap) {
      im2col_row(w, s_->istr, plane, tap, dst + tap * row_stride, s_->kidx, s_->oidx);
    }
  }
}

void im2col(const OpContext& ctx, const Window& w, const float* x, int64_t images, int64_t channels,
            float* col, int64_t image_stride, int64_t row_stride) {
  const int64_t ksize = w.kernel_size(), osize = w.out_size(), isize = w.in_size();
  if (w.rank() == 2) {  // by channel plane; the same bytes as the rank-generic loop below
    parallel_chunks(ctx.threads(), images * channels, grain_for(ksize * osize),
                    [&](int64_t begin, int64_t end) {
      PlaneColumns plane(w);
      for (int64_t c = begin; c < end; ++c) {
        const int64_t image = c / channels;
        plane.fill(x + c * isize,
                   col + image * image_stride + (c - image * channels) * ksize * row_stride,
                   row_stride);
      }
    });
    return;
  }
  const int64_t rows_per_image = channels * ksize;
  const auto istr = contiguous_strides(w.in);
  parallel_chunks(ctx.threads(), images * rows_per_image, grain_for(osize),
                  [&](int64_t begin, int64_t end) {
    std::vector<int64_t> kidx, oidx;
    for (int64_t row = begin; row < end; ++row) {
      const int64_t image = row / rows_per_image;
      im2col_row(w, istr, x + row / ksize * isize, row % ksize,
                 col + image * image_stride + (row - image * rows_per_image) * row_stride, kidx,
                 oidx);
    }
  });
}

}  // namespace qforge::ops
