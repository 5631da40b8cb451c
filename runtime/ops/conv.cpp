// Conv (any spatial rank, groups, dilations, pads, auto_pad) as a product with the weights: with
// the weights packed when the executor was built, a window of rank 1 or 2 reads its zero-padded
// input planes (strided: their phase planes) in place (no column matrix), others write columns
// straight into packed panels, both for kernels/packed_gemm.h; where the CPU has AVX-512, windows
// wider than one position and 1x1 windows on small planes run the lane product (output channels
// as the vector lanes, gemm_f32_lanes); otherwise im2col + sgemm, one product per image for
// large output planes, one wide product per chunk of images for small ones.
#include "runtime/ops/conv.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "kernels/gemm.h"
#include "runtime/op_registry.h"
#include "runtime/op_utils.h"
#include "runtime/ops/activation.h"
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

// Columns of images [nb] side by side written into `cols` (cin x taps rows, nb x osize
// columns; image i's output position o is column i * osize + o). A 1x1 window with stride 1 and
// no padding (`direct`) reads the input planes as they are. By blocks of channels whose column
// rows fit in L2: the block's rows are made (im2col), then written panel by panel, where they
// are one run of (rows x 16) floats.
void pack_columns(const OpContext& ctx, const Window& win, const float* x, int64_t nb,
                  int64_t cin, bool direct, PackedMatrix& cols) {
  constexpr int64_t kPanel = PackedMatrix::kPanel;
  constexpr int64_t kBlockFloats = int64_t{64} << 10;  // 256 KiB of column rows
  const int64_t ksize = win.kernel_size(), isize = win.in_size(), osize = win.out_size();
  // Blocks small enough that every thread gets two where the images are few (a copy: how the
  // channels are split changes no bits).
  const int64_t per_image = (2 * ctx.threads() + nb - 1) / nb;
  const int64_t per_block = std::clamp<int64_t>(kBlockFloats / (ksize * osize), 1,
                                                std::max<int64_t>(1, cin / per_image));
  const int64_t blocks = (cin + per_block - 1) / per_block;
  parallel_chunks(ctx.threads(), nb * blocks, 1, [&](int64_t begin, int64_t end) {
    PlaneColumns plane(win);
    std::unique_ptr<float[]> made;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t image = t / blocks, c0 = t % blocks * per_block;
      const int64_t c1 = std::min(cin, c0 + per_block), rows = (c1 - c0) * ksize;
      const float* src = x + (image * cin + c0) * isize;  // row r at src + r * osize
      if (!direct) {
        if (!made) made = std::make_unique_for_overwrite<float[]>(per_block * ksize * osize);
        for (int64_t c = c0; c < c1; ++c) {
          plane.fill(x + (image * cin + c) * isize, made.get() + (c - c0) * ksize * osize,
                     osize);
        }
        src = made.get();
      }
      // Output positions in pieces that end at a panel's edge.
      for (int64_t o = 0, j = image * osize; o < osize;) {
        const int64_t lane = j % kPanel, take = std::min(kPanel - lane, osize - o);
        float* dst = cols.mutable_panel(j / kPanel) + c0 * ksize * kPanel + lane;
        for (int64_t r = 0; r < rows; ++r, dst += kPanel) {
          if (take == kPanel) {  // a fixed size: vector moves, not a string copy
            std::memcpy(dst, src + r * osize + o, kPanel * sizeof(float));
          } else {
            std::copy_n(src + r * osize + o, take, dst);
          }
        }
        o += take;
        j += take;
      }
    }
  });
}

// Whether a 1x1 window with stride 1 and no padding reads its input planes where they lie
// instead of copying them into panels: where each image's plane is whole panels (the product
// reads every row up to n rounded up to 16, so no read passes the tensor's end) and the depth
// is at least kPlanesInPlaceDepth. Measured on ResNet-50 at batch 8 (bench/RESULTS.md): the
// 28 x 28 layers of 512 input channels 5.9-6.1 ms in place against 7.7-8.3 packed; the 56 x 56
// layers of 64 channels 10.1 ms packed against 11.0 in place at one thread on an Intel host,
// but on an AMD EPYC (Zen 4) 4.8-7.2 in place against 7.5-9.5 packed at two threads (the
// 64 -> 256 layers; 9.1-11.2 against 9.5-11.5 at one), the model 349-371 ms against 400-406.
// Either way the bits are the same.
constexpr int64_t kPlanesInPlaceDepth = 64;
bool reads_planes_in_place(int64_t cin, int64_t osize) {
  return osize % PackedMatrix::kPanel == 0 && cin >= kPlanesInPlaceDepth;
}

// Conv (group 1) on the packed kernel with the weights packed once (ctx.packed_rows): per chunk
// of images, their columns side by side in panels and one product, each image's outputs stored
// in its place in `po` (one image for large planes, enough for a wide product for small ones).
// Every output element is one FMA chain over (channel, tap) started at the bias, so its bits do
// not depend on the threads, the chunk or the batch; `addend` (laid out as `po`, or null) is
// added to it, then the Relu where `relu`.
void run_conv_packed(const OpContext& ctx, const PackedRows& w, const Window& win,
                     const ConvDims& d, bool direct, const float* px, const float* bias, bool relu,
                     const float* addend, float* po) {
  const int64_t isize = win.in_size(), osize = win.out_size();
  const int64_t depth = w.k();
  if (d.batch == 0 || osize == 0) return;  // an empty output
  // Column panels of a chunk: at most about 8 MiB, so that they are still in L3 when the
  // product reads them (a batch of 8 ResNet-50 images at 28 x 28 made 29 MiB).
  constexpr int64_t kColumnFloats = int64_t{8} << 20 >> 2;
  const int64_t chunk =
      osize >= kWideBelow ? 1
                          : std::clamp<int64_t>(kColumnFloats / std::max<int64_t>(1, depth * osize),
                                                1, d.batch);
  // Image i's column o is stored at i * cout * osize + o.
  const ColumnGrid grid{.row_len = osize,
                        .row_kept = osize,
                        .rows = 1,
                        .rows_kept = 1,
                        .image_stride = d.cout * osize};
  if (direct && reads_planes_in_place(d.cin, osize)) {
    // Each image's input planes are its column matrix, read where they lie.
    std::vector<int64_t> rows(static_cast<size_t>(d.cin));
    for (int64_t c = 0; c < d.cin; ++c) rows[static_cast<size_t>(c)] = c * isize;
    for (int64_t i = 0; i < d.batch; ++i) {
      const InPlaceColumns b{.data = px + i * d.cin * isize, .row_offset = rows, .n = osize};
      const int64_t at = i * d.cout * osize;
      gemm_f32_prepacked(ctx.threads(), w, b, grid, po + at, osize, bias, relu,
                         addend != nullptr ? addend + at : nullptr);
    }
    return;
  }
  for (int64_t n0 = 0; n0 < d.batch; n0 += chunk) {
    const int64_t nb = std::min(chunk, d.batch - n0), n = nb * osize;
    PackedMatrix cols(depth, n);
    pack_columns(ctx, win, px + n0 * d.cin * isize, nb, d.cin, direct, cols);
    const int64_t at = n0 * d.cout * osize;
    const float* add = addend != nullptr ? addend + at : nullptr;
    if (nb == 1) {
      gemm_f32_prepacked(ctx.threads(), w, cols, po + at, osize, bias, relu, add);
    } else {
      gemm_f32_prepacked(ctx.threads(), w, cols, grid, po + at, osize, bias, relu, add);
    }
  }
}

// The grids a window of rank 1 or 2 reads in place (run_conv_on_grid): each image's planes laid
// out as `rows` of `row_len` positions, output position (y, x) being grid position (y, x) and a
// tap reading the grid shifted. Both give:
//   image_floats()          floats one image takes in a channel's region
//   images_end(nb)          where nb images' planes end in a channel's region
//   tap_start(ty, tx, nb)   where tap (ty, tx) of output 0 reads, from the region's start
// and fill_grid lays a chunk of images out.

// A window of rank 1 or 2 seen as one of rank 2 (a rank-1 window: one row): what both grids read.
struct PlaneWindow {
  int64_t in_rows, in_len, out_rows, out_len;
  int64_t s_h, s_w, d_h, d_w, pad_top, pad_left;

  explicit PlaneWindow(const Window& win) {
    const size_t last = win.rank() - 1;
    const bool planes = win.rank() == 2;
    in_rows = planes ? win.in[0] : 1;
    in_len = win.in[last];
    out_rows = planes ? win.out[0] : 1;
    out_len = win.out[last];
    s_h = planes ? win.strides[0] : 1;
    s_w = win.strides[last];
    d_h = planes ? win.dilations[0] : 1;
    d_w = win.dilations[last];
    pad_top = planes ? win.pad_begin[0] : 0;
    pad_left = win.pad_begin[last];
  }
};

// A stride-1 window's grid: its data in the first in_rows x in_len positions of each plane and
// zeros in the rest. The zeros after one row serve as the padding before the next, and the rows
// of zeros after one image as the rows before the next, so the grid holds max(pad before, pad
// after) of padding per dimension rather than both: a tap that reads left of a row reads the
// zeros at the end of the row before it. (The sample CNN's 8 x 8 planes padded by 1 take 9 x 9
// positions, not 10 x 10; the product does 19% fewer multiply-adds.) A channel's region: `lead`
// zeros, then the images' planes.
struct PaddedGrid : PlaneWindow {
  int64_t rows, row_len;
  int64_t lead;  // zeros before the first image: a tap may read up to pad_top + 1 rows back

  explicit PaddedGrid(const Window& win) : PlaneWindow(win) {
    const size_t last = win.rank() - 1;
    const bool planes = win.rank() == 2;
    // Padding a window reads past the data's end: its last output's last tap.
    const int64_t pad_bottom = out_rows + (planes ? win.extent(0) : 1) - 1 - pad_top - in_rows;
    const int64_t pad_right = out_len + win.extent(last) - 1 - pad_left - in_len;
    rows = std::max(in_rows + std::max({pad_top, pad_bottom, int64_t{0}}), out_rows);
    row_len = std::max(in_len + std::max({pad_left, pad_right, int64_t{0}}), out_len);
    // A row of whole panels where padding both sides allows it (14 x 14 planes padded by 1:
    // rows of 16, not 15): each panel's outputs are then one run in C, which the kernel stores
    // faster than a panel's runs across rows of the grid (measured: 3-4% on such a layer).
    const int64_t whole = (row_len + 15) / 16 * 16;
    if (whole <= in_len + std::max<int64_t>(pad_left, 0) + std::max<int64_t>(pad_right, 0)) {
      row_len = whole;
    }
    lead = (pad_top + 1) * row_len;
  }
  int64_t plane() const { return rows * row_len; }
  int64_t image_floats() const { return plane(); }
  int64_t images_end(int64_t nb) const { return lead + nb * plane(); }
  int64_t tap_start(int64_t ty, int64_t tx, int64_t /*nb*/) const {
    return lead + (ty * d_h - pad_top) * row_len + tx * d_w - pad_left;
  }
};

// dst[0, n) = src[0, n), or 0 without src: short runs in 4-float steps inline (the sample CNN's
// rows are 8 floats, where a libc call per row cost more than the copy), long ones by libc.
inline void copy_or_zero(float* dst, const float* src, int64_t n) {
  if (n >= 64) {
    if (src != nullptr) {
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    } else {
      std::memset(dst, 0, static_cast<size_t>(n) * sizeof(float));
    }
    return;
  }
#if defined(__SSE2__)
  if (n >= 4) {
    const auto put = [&](int64_t i) {
      _mm_storeu_ps(dst + i, src != nullptr ? _mm_loadu_ps(src + i) : _mm_setzero_ps());
    };
    for (int64_t i = 0; i + 4 <= n; i += 4) put(i);
    put(n - 4);  // the last 4, overlapping where n is not a multiple of 4
    return;
  }
#endif
  for (int64_t i = 0; i < n; ++i) dst[i] = src != nullptr ? src[i] : 0.0f;
}

// Rows [0, rows) of a plane of in_len floats a row into rows of row_len >= in_len, zeros after
// the data: 16 lanes at a time under masks, one store for a short row's data and zeros.
#if defined(__x86_64__)
__attribute__((target("avx512f"))) void put_rows_avx512(float* dst, int64_t row_len,
                                                        const float* src, int64_t in_len,
                                                        int64_t rows) {
  const auto mask = [](int64_t n) {
    return static_cast<__mmask16>(n >= 16 ? 0xFFFFu : (1u << std::max<int64_t>(n, 0)) - 1u);
  };
  for (int64_t y = 0; y < rows; ++y, dst += row_len, src += in_len) {
    for (int64_t o = 0; o < row_len; o += 16) {
      _mm512_mask_storeu_ps(dst + o, mask(row_len - o),
                            _mm512_maskz_loadu_ps(mask(in_len - o), src + o));
    }
  }
}
#endif

#if defined(__x86_64__)
__attribute__((target("avx512f"))) void zero_avx512(float* dst, int64_t n) {
  for (int64_t o = 0; o < n; o += 16) {
    const int64_t left = n - o;
    const auto mask = static_cast<__mmask16>(left >= 16 ? 0xFFFFu : (1u << left) - 1u);
    _mm512_mask_storeu_ps(dst + o, mask, _mm512_setzero_ps());
  }
}
#endif

// dst[0, n) = 0. Short runs under masks where the AVX-512 kernel runs: GCC turns a loop of
// zero stores into an inline `rep stos`, which cost more than the zeros on a 9-float row.
void zero_floats(float* dst, int64_t n) {
#if defined(__x86_64__)
  if (n < 256 && packed_gemm_avx512()) return zero_avx512(dst, n);
#endif
  copy_or_zero(dst, nullptr, n);
}

// With the products' AVX-512 kernel (so a test that turns that off runs the other path too).
void put_rows(float* dst, int64_t row_len, const float* src, int64_t in_len, int64_t rows) {
#if defined(__x86_64__)
  if (packed_gemm_avx512()) return put_rows_avx512(dst, row_len, src, in_len, rows);
#endif
  for (int64_t y = 0; y < rows; ++y, dst += row_len, src += in_len) {
    copy_or_zero(dst, src, in_len);
    copy_or_zero(dst + in_len, nullptr, row_len - in_len);
  }
}

// Images [0, nb) of x into the grid, channel by channel with the images one after another:
// channel c's region [c * channel_stride, (c + 1) * channel_stride) holds grid.lead zeros, the
// nb images' planes, and zeros to its end.
void fill_grid(const OpContext& ctx, const PaddedGrid& grid, const float* x, int64_t nb,
               int64_t cin, int64_t channel_stride, float* out) {
  const int64_t plane = grid.plane(), isize = grid.in_rows * grid.in_len;
  parallel_chunks(ctx.threads(), cin * nb, grain_for(plane), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin, c = begin / nb, image = begin % nb; t < end; ++t) {
      const float* src = x + (image * cin + c) * isize;
      float* region = out + c * channel_stride;
      float* dst = region + grid.lead + image * plane;
      if (image == 0) zero_floats(region, grid.lead);
      put_rows(dst, grid.row_len, src, grid.in_len, grid.in_rows);
      float* after = dst + grid.in_rows * grid.row_len;
      // The image's rows of padding, and after the last image the rest of the region.
      zero_floats(after, (image == nb - 1 ? region + channel_stride : dst + plane) - after);
      if (++image == nb) {
        image = 0;
        ++c;
      }
    }
  });
}

// The planes a strided window (stride s_h x s_w, rank 1 or 2) reads in place: each channel's
// input split into s_h x s_w phase planes, phase (py, px) holding the zero-padded input's rows
// py, py + s_h, ... and columns px, px + s_w, ..., each as a grid of `rows` x `row_len`
// positions. Tap (ty, tx) of output (y, x) reads padded position (s_h y + ty d_h,
// s_w x + tx d_w): phase (ty d_h mod s_h, tx d_w mod s_w) at (y + ty d_h / s_h,
// x + tx d_w / s_w), so output position (y, x) is grid position (y, x) of every phase and a
// tap one phase plane shifted, as a stride-1 window reads its grid: no column matrix, where
// the packed path writes kernel_size() columns per output position.
struct PhaseGrid : PlaneWindow {
  int64_t rows, row_len;  // out + the largest shift a tap makes

  explicit PhaseGrid(const Window& win) : PlaneWindow(win) {
    const size_t last = win.rank() - 1;
    const bool planes = win.rank() == 2;
    const int64_t kh = planes ? win.kernel[0] : 1, kw = win.kernel[last];
    rows = out_rows + (kh - 1) * d_h / s_h;
    row_len = out_len + (kw - 1) * d_w / s_w;
  }
  int64_t plane() const { return rows * row_len; }
  int64_t phases() const { return s_h * s_w; }
  int64_t image_floats() const { return phases() * plane(); }
  // A channel's region: the phases one after another, each the nb images' planes.
  int64_t images_end(int64_t nb) const { return phases() * nb * plane(); }
  int64_t tap_start(int64_t ty, int64_t tx, int64_t nb) const {
    const int64_t phase = (ty * d_h % s_h) * s_w + tx * d_w % s_w;
    return phase * nb * plane() + ty * d_h / s_h * row_len + tx * d_w / s_w;
  }
};

#if defined(__x86_64__)
// dst[j] = row[first + 2 j] where 0 <= first + 2 j < len, else 0, for j in [0, n): one phase of
// a row at stride 2, sixteen at a time from two loads under masks (positions outside the row
// are neither read nor faulted on) split into their even columns.
__attribute__((target("avx512f"))) void every_other_avx512(const float* row, int64_t len,
                                                           int64_t first, int64_t n,
                                                           float* dst) {
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  // Lanes l of 16 whose column at + l lies in [0, len).
  const auto inside = [len](int64_t at) {
    const int64_t lo = std::clamp<int64_t>(-at, 0, 16), hi = std::clamp<int64_t>(len - at, 0, 16);
    return static_cast<__mmask16>(hi > lo ? ((1u << hi) - 1u) & ~((1u << lo) - 1u) : 0u);
  };
  for (int64_t j = 0; j < n; j += 16) {
    const int64_t at = first + 2 * j;
    const __m512 lo = _mm512_maskz_loadu_ps(inside(at), row + at);
    const __m512 hi = _mm512_maskz_loadu_ps(inside(at + 16), row + at + 16);
    const int64_t left = n - j;
    const auto keep = static_cast<__mmask16>(left >= 16 ? 0xFFFFu : (1u << left) - 1u);
    _mm512_mask_storeu_ps(dst + j, keep, _mm512_permutex2var_ps(lo, even, hi));
  }
}
#endif

// Images [0, nb) of x into their phase planes, channel c's at out + c * channel_stride (the
// phases, each the nb images' planes, then zeros to the region's end).
void fill_grid(const OpContext& ctx, const PhaseGrid& g, const float* x, int64_t nb,
               int64_t cin, int64_t channel_stride, float* out) {
  const int64_t plane = g.plane(), isize = g.in_rows * g.in_len;
  parallel_chunks(ctx.threads(), cin * nb, grain_for(plane * g.phases()),
                  [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t c = t / nb, image = t % nb;
      const float* src = x + (image * cin + c) * isize;
      float* region = out + c * channel_stride;
      for (int64_t py = 0; py < g.s_h; ++py) {
        for (int64_t px = 0; px < g.s_w; ++px) {
          float* dst = region + ((py * g.s_w + px) * nb + image) * plane;
          for (int64_t i = 0; i < g.rows; ++i, dst += g.row_len) {
            const int64_t sy = g.s_h * i + py - g.pad_top;
            if (sy < 0 || sy >= g.in_rows) {
              zero_floats(dst, g.row_len);
              continue;
            }
            const float* row = src + sy * g.in_len;
#if defined(__x86_64__)
            if (g.s_w == 2 && packed_gemm_avx512()) {
              every_other_avx512(row, g.in_len, px - g.pad_left, g.row_len, dst);
              continue;
            }
#endif
            for (int64_t j = 0; j < g.row_len; ++j) {
              const int64_t sx = g.s_w * j + px - g.pad_left;
              dst[j] = sx >= 0 && sx < g.in_len ? row[sx] : 0.0f;
            }
          }
        }
      }
      if (image == nb - 1) {  // the region's tail, read (never stored) by the last panels
        float* tail = region + g.phases() * nb * plane;
        zero_floats(tail, region + channel_stride - tail);
      }
    }
  });
}

// A Conv of spatial rank 1 or 2 (group 1) on the packed kernel with no column matrix: each chunk
// of images is laid out in `grid` once (about 2 MiB a chunk, one image for large planes), and
// the product reads B where it lies (kernels/packed_gemm.h, InPlaceColumns), row (channel, tap)
// being the grid shifted by the tap, storing only the grid positions that are output
// positions. Every output element is the FMA chain run_conv_packed computes (the grid's zeros
// where it reads padding), so the bits are the same. Weights packed as lanes run the product
// with output channels as the lanes (gemm_f32_lanes), which computes the output positions only.
template <typename Grid>
void run_conv_on_grid(const OpContext& ctx, const PackedRows& w, const Window& win,
                      const ConvDims& d, const Grid& grid, const float* px, const float* bias,
                      bool relu, const float* addend, float* po) {
  const int64_t osize = grid.out_rows * grid.out_len, isize = win.in_size();
  if (d.batch == 0 || osize == 0) return;  // an empty output
  const size_t last = win.rank() - 1;
  const int64_t kh = win.rank() == 2 ? win.kernel[0] : 1, kw = win.kernel[last];
  const int64_t plane = grid.plane();
  constexpr int64_t kChunkFloats = int64_t{2} << 20 >> 2;
  const int64_t per_image = std::max<int64_t>(1, d.cin * grid.image_floats());
  const int64_t chunk =
      osize >= kWideBelow ? 1 : std::clamp<int64_t>(kChunkFloats / per_image, 1, d.batch);
  const auto columns = [&](int64_t nb) {
    return (nb - 1) * plane + (grid.out_rows - 1) * grid.row_len + grid.out_len;
  };
  // A channel's region: the images' planes, and what the last panel reads past the last column
  // (up to 15 floats) at the tap that reads furthest; 64-byte aligned. What is read past a
  // channel's planes is never stored; fill_grid sets it to 0 all the same, so that those lanes
  // never do slow (subnormal) arithmetic.
  const auto channel_floats = [&](int64_t nb) {
    int64_t used = grid.images_end(nb);
    for (int64_t ty = 0; ty < kh; ++ty) {
      for (int64_t tx = 0; tx < kw; ++tx) {
        used = std::max(used, grid.tap_start(ty, tx, nb) + columns(nb) + PackedMatrix::kPanel);
      }
    }
    return (used + 15) / 16 * 16;
  };
  // The calling thread's, reused by later calls; it only grows (a resize that grows it again
  // would zero what it adds: 170 KiB a run of the sample CNN, whose first Conv needs less).
  // 16 floats more, to align the start.
  thread_local std::vector<float> planes;
  const auto floats = static_cast<size_t>(d.cin * channel_floats(std::min(chunk, d.batch))) + 16;
  if (planes.size() < floats) planes.resize(floats);
  float* base = planes.data() + (-(reinterpret_cast<uintptr_t>(planes.data()) / 4)) % 16;
  std::vector<int64_t> row_offset(static_cast<size_t>(w.k()));
  for (int64_t n0 = 0; n0 < d.batch; n0 += chunk) {
    const int64_t nb = std::min(chunk, d.batch - n0);
    const int64_t channel_stride = channel_floats(nb);
    fill_grid(ctx, grid, px + n0 * d.cin * isize, nb, d.cin, channel_stride, base);
    for (int64_t c = 0, kk = 0; c < d.cin; ++c) {
      for (int64_t ty = 0; ty < kh; ++ty) {
        for (int64_t tx = 0; tx < kw; ++tx) {
          row_offset[static_cast<size_t>(kk++)] = c * channel_stride + grid.tap_start(ty, tx, nb);
        }
      }
    }
    const InPlaceColumns b{.data = base, .row_offset = row_offset, .n = columns(nb)};
    const ColumnGrid cgrid{.row_len = grid.row_len,
                           .row_kept = grid.out_len,
                           .rows = grid.rows,
                           .rows_kept = grid.out_rows,
                           .image_stride = d.cout * osize};
    const int64_t at = n0 * d.cout * osize;
    const float* add = addend != nullptr ? addend + at : nullptr;
    if (w.layout() == RowLayout::Lanes) {
      gemm_f32_lanes(ctx.threads(), w, b, cgrid, po + at, osize, bias, relu, add);
    } else {
      gemm_f32_prepacked(ctx.threads(), w, b, cgrid, po + at, osize, bias, relu, add);
    }
  }
}

// Output planes of at most this many positions run a 1x1 window (stride 1, no padding) on the
// lane product. Measured on ResNet-50's 1x1 layers alone (bench/RESULTS.md): 14 x 14 planes
// (196) 11-17% faster and 7 x 7 4-25% faster than on the panels; 28 x 28 (784) 1-8% slower,
// 56 x 56 about even. Either way the bits are the same.
constexpr int64_t kLanePlanesUpTo = 256;

// The lane product's AVX2 kernel (16 rows times up to 6 positions a call, where AVX-512's takes
// 32 times 14) pays on fewer convolutions: windows wider than one position over at least this
// many input channels (alone, ResNet-50's 3 x 3 layers ran 1-27% faster than on the panels, a
// 7 x 7 window over 16 channels 25%), not its 7 x 7 stem over 3 channels (9% slower) nor 1x1
// windows on small planes (14 x 14: 10% slower). The same bits either way.
constexpr int64_t kLaneAvx2MinChannels = 8;
bool lane_window(int64_t cin, bool wider_than_one) {
  return lane_gemm_supported() && wider_than_one &&
         (packed_gemm_avx512() || cin >= kLaneAvx2MinChannels);
}

// A 1x1 window at stride 1 without padding on the lane product: the input planes are B, read
// where they lie, image i's output position (y, x) its column y * out_len + x, the images cin
// planes apart.
void run_conv_direct_lanes(const OpContext& ctx, const PackedRows& w, const Window& win,
                           const ConvDims& d, const float* px, const float* bias, bool relu,
                           const float* addend, float* po) {
  const int64_t isize = win.in_size(), osize = win.out_size();
  if (d.batch == 0 || osize == 0) return;
  const PlaneWindow plane(win);
  std::vector<int64_t> rows(static_cast<size_t>(d.cin));
  for (int64_t c = 0; c < d.cin; ++c) rows[static_cast<size_t>(c)] = c * isize;
  const ColumnGrid grid{.row_len = plane.out_len,
                        .row_kept = plane.out_len,
                        .rows = plane.out_rows,
                        .rows_kept = plane.out_rows,
                        .image_stride = d.cout * osize};
  const InPlaceColumns b{.data = px, .row_offset = rows, .n = d.batch * osize};
  gemm_f32_lanes(ctx.threads(), w, b, grid, po, osize, bias, relu, addend, d.cin * isize);
}

// A stride other than 1 in some spatial dim.
bool strided(const Window& win) {
  return std::any_of(win.strides.begin(), win.strides.end(), [](int64_t s) { return s != 1; });
}

// Whether a group-1 Conv on packed weights reads its input in place (run_conv_on_grid, on a
// PaddedGrid at stride 1 and a PhaseGrid otherwise): spatial rank 1 or 2, a window wider than
// one position (a 1x1 window's columns are its input planes, copied into panels at memory speed,
// and the kernel reads packed panels faster than rows a plane apart), and a grid whose extra
// positions cost less than the column matrix they save: the product does cout x (grid -
// output) more multiply-adds per channel and tap, the packing writes
// and reads one column of that size per output position. Measured on ResNet-50's and the sample
// CNN's layers (bench/RESULTS.md): 14 x 14 planes with 256 output channels gain, 7 x 7 planes
// with 512 lose; ResNet-50's first layer (7 x 7 at stride 2, 3 channels) reads its phase planes
// in 1.65 ms against 3.1 with its columns packed. Either way the bits are the same; this picks
// the faster.
bool reads_in_place(const Window& win, int64_t cout, bool direct) {
  if (direct || win.rank() > 2) return false;
  // A strided 1 x 1 window reads one phase of its input: its columns are copied at memory
  // speed either way.
  if (strided(win) && win.kernel_size() == 1) return false;
  const int64_t grid = strided(win) ? PhaseGrid(win).plane() : PaddedGrid(win).plane();
  constexpr int64_t kPackingPerMultiplyAdd = 96;
  return cout * (grid - win.out_size()) <= kPackingPerMultiplyAdd * win.out_size();
}

// Conv, ConvRelu with `relu`, ConvAddRelu with `relu` and `add`.
void conv(OpContext& ctx, bool relu, bool add) {
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
  const bool packed = ctx.packed_rows != nullptr && group == 1 && ctx.packed_rows->m() == cout &&
                      ctx.packed_rows->k() == cin * win.kernel_size();
  bool direct = true;  // 1x1, stride 1, no pad: X is already the column matrix
  for (size_t i = 0; i < r; ++i) {
    direct = direct && win.kernel[i] == 1 && win.strides[i] == 1 && win.pad_begin[i] == 0 &&
             win.pad_end[i] == 0;
  }
  // Weights packed as lanes (pack_conv_weight) run on the lane product, and so does a 1x1
  // window on small planes on the AVX-512 kernel (its weights packed as lanes too when it first
  // meets them); where the lane product does not run (a test turned it off after the executor
  // was built), the weights are packed in row groups for this call.
  const PackedRows* rows = packed ? ctx.packed_rows : nullptr;
  const int64_t depth = cin * win.kernel_size();
  const bool lane_planes = direct && win.out_size() <= kLanePlanesUpTo && packed_gemm_avx512();
  const bool lanes = rows != nullptr && lane_gemm_supported() && r <= 2 &&
                     (rows->layout() == RowLayout::Lanes || lane_planes);
  if (lanes) rows = &rows->as_lanes(w.data<float>().data(), depth);
  std::unique_ptr<PackedRows> regrouped;
  if (rows != nullptr && rows->layout() == RowLayout::Lanes && !lanes) {
    regrouped = std::make_unique<PackedRows>(w.data<float>().data(), cout, depth, depth);
    rows = regrouped.get();
  }
  // ConvAddRelu's addend Z: the packed product adds it to its finished sums where it is f32
  // with the output's shape (the layout the product stores); otherwise Add and Relu follow the
  // convolution as AddRelu runs them (broadcasting, 16-bit types).
  const Tensor* z = add ? &ctx.input(3) : nullptr;
  const bool fold = z != nullptr && packed && dt == DType::F32 && z->dtype() == DType::F32 &&
                    z->shape() == out_shape;
  const bool late = z != nullptr && !fold;
  if (late) relu = false;
  const auto emit = [&](const Tensor& y) {
    ctx.set_output(0, late ? add_relu(ctx, from_f32(y, dt), *z) : from_f32(y, dt));
  };
  float* po = nullptr;  // every path below writes every element
  // The output over Z where nothing reads Z afterwards and the product reads each element of Z
  // just before it stores that element of the output (the lane product always; the panel
  // product where it takes one pass): one tensor's traffic, not two (ResNet-50's 1x1 layers of
  // 64 and 128 input channels at batch 8: 10.3-11.0 ms -> 6.9-7.6 and 7.8 -> 6.6).
  Tensor* z_alone = fold ? ctx.consumed_input(3) : nullptr;
  const bool z_read_first = lanes || gemm_prepacked_one_pass(depth);
  std::byte* z_bytes =
      z_alone != nullptr && z_read_first ? sole_writable_bytes(*z_alone) : nullptr;
  Tensor out = z_bytes != nullptr ? *z_alone : unset_tensor(DType::F32, out_shape, &po);
  if (z_bytes != nullptr) po = reinterpret_cast<float*>(z_bytes);
  const int64_t cg = cin / group, mg = cout / group;
  const int64_t ksize = win.kernel_size(), isize = win.in_size(), osize = win.out_size();
  const float* px = x.data<float>().data();
  const float* pw = w.data<float>().data();
  const ConvDims dims{.batch = batch, .cin = cin, .cout = cout, .group = group};
  if (packed) {
    const float* addend = fold ? z->data<float>().data() : nullptr;
    if (lanes && direct) {
      run_conv_direct_lanes(ctx, *rows, win, dims, px, bias, relu, addend, po);
    } else if (!lanes && !reads_in_place(win, cout, direct)) {
      run_conv_packed(ctx, *rows, win, dims, direct, px, bias, relu, addend, po);
    } else if (strided(win)) {
      run_conv_on_grid(ctx, *rows, win, dims, PhaseGrid(win), px, bias, relu, addend, po);
    } else {
      run_conv_on_grid(ctx, *rows, win, dims, PaddedGrid(win), px, bias, relu, addend, po);
    }
    emit(out);
    return;
  }
  // Relu(v) = v > 0 ? v : 0 over the finished output.
  const auto finish = [&] {
    if (relu) {
      parallel_chunks(ctx.threads(), static_cast<int64_t>(out.numel()), grain_for(1),
                      [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) po[i] = po[i] > 0 ? po[i] : 0.0f;
      });
    }
    emit(out);
  };
  if (batch > 1 && osize < kWideBelow) {
    run_conv_wide(ctx, win, dims, px, pw, bias, po);
    finish();
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
  finish();
}

void run_conv(OpContext& ctx) { conv(ctx, false, false); }
void run_conv_relu(OpContext& ctx) { conv(ctx, true, false); }
void run_conv_add_relu(OpContext& ctx) { conv(ctx, true, true); }

constexpr OpEntry kOps[] = {
    {"", "Conv", run_conv},
    {"", "ConvTranspose", run_conv_transpose},
    {kInternalDomain, kConvReluOp, run_conv_relu},
    {kInternalDomain, kConvAddReluOp, run_conv_add_relu},
};

}  // namespace

std::span<const OpEntry> conv_ops() { return kOps; }

std::shared_ptr<const PackedRows> pack_conv_weight(const OpContext& ctx, const Tensor& weight) {
  const Node& node = ctx.node();
  if (!packed_gemm_supported() || weight.rank() < 3 || weight.numel() == 0) return nullptr;
  const bool conv = (node.domain.empty() || node.domain == "ai.onnx") && node.op_type == "Conv";
  const bool fused = node.domain == kInternalDomain &&
                     (node.op_type == kConvReluOp || node.op_type == kConvAddReluOp);
  if (!conv && !fused) return nullptr;
  if (ctx.attr_int("group", 1) != 1) return nullptr;
  if (weight.dtype() != DType::F32 && !is_half(weight.dtype())) return nullptr;
  const Tensor w = to_f32(weight);
  const int64_t m = w.shape()[0];
  const auto k = static_cast<int64_t>(w.numel()) / m;
  // A window wider than one position of spatial rank 1 or 2 reads its input in place on the
  // lane product where it runs (a 1x1 window's columns are its input planes, on the panels).
  const bool lanes = weight.rank() <= 4 && lane_window(w.shape()[1], k > w.shape()[1]);
  return std::make_shared<const PackedRows>(w.data<float>().data(), m, k, k,
                                            lanes ? RowLayout::Lanes : RowLayout::Groups);
}

}  // namespace qforge::ops
