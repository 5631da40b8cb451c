// Pools over any spatial rank: MaxPool (Indices output, storage_order, dilations, ceil_mode),
// AveragePool (count_include_pad, ceil_mode, dilations), GlobalAveragePool, GlobalMaxPool.
#include <algorithm>
#include <limits>
#include <type_traits>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "kernels/packed_gemm.h"
#include "runtime/op_registry.h"
#include "runtime/op_utils.h"
#include "runtime/ops/window.h"

namespace qforge::ops {

namespace {

enum class PoolKind { Max, Average };

struct PoolParams {
  PoolKind kind;
  bool count_include_pad = false;
  bool column_major = false;  // MaxPool storage_order = 1
};

// ceil(a / b) for b > 0 and any a.
int64_t ceil_div(int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : a / b; }

// Per spatial dim and output coordinate: the first input index (base) and the range of kernel
// taps [lo, hi) that land inside the input, or inside the padded input (for
// count_include_pad). Precomputed so the inner loops have no bounds checks.
struct TapRanges {
  std::vector<std::vector<int64_t>> base, lo, hi, padded;  // padded: taps inside the padding
};

TapRanges tap_ranges(const Window& w) {
  TapRanges t;
  for (size_t j = 0; j < w.rank(); ++j) {
    const int64_t s = w.strides[j], d = w.dilations[j], k = w.kernel[j];
    std::vector<int64_t> base, lo, hi, padded;
    for (int64_t o = 0; o < w.out[j]; ++o) {
      const int64_t b = o * s - w.pad_begin[j];
      const int64_t l = std::clamp<int64_t>(ceil_div(-b, d), 0, k);
      base.push_back(b);
      lo.push_back(l);
      hi.push_back(std::max(l, std::min(k, ceil_div(w.in[j] - b, d))));
      const int64_t pl = std::clamp<int64_t>(ceil_div(-w.pad_begin[j] - b, d), 0, k);
      padded.push_back(
          std::max<int64_t>(0, std::min(k, ceil_div(w.in[j] + w.pad_end[j] - b, d)) - pl));
    }
    t.base.push_back(std::move(base));
    t.lo.push_back(std::move(lo));
    t.hi.push_back(std::move(hi));
    t.padded.push_back(std::move(padded));
  }
  return t;
}

// MaxPool over two spatial dims without Indices: the same taps in the same order as
// pool_kernel (kernel rows, then columns; std::max(best, tap)), so the same values, without its
// rank-generic bookkeeping, which costs more than the maxima on small planes.
// Outputs of one row of 2x2, stride-2 max windows over input rows r0 and r0 + iw (both read
// whole): four at a time where the four windows lie inside the row, in the taps' order
// (r0[2i], r0[2i + 1], r1[2i], r1[2i + 1]) from the lowest float, each step maxps(x, m): x when
// x > m, else m, which is std::max(m, x) exactly (a NaN never wins, -0 and +0 keep the
// first). Returns how many outputs it wrote; the caller does the rest.
inline int64_t max_pool_2x2_row(const float* r0, int64_t iw, int64_t ow_n, float* y) {
#if defined(__SSE2__)
  const float* r1 = r0 + iw;
  const int64_t whole = std::min(ow_n, iw / 2);
  int64_t ow = 0;
  for (; ow + 4 <= whole; ow += 4) {
    const __m128 a0 = _mm_loadu_ps(r0 + 2 * ow), a1 = _mm_loadu_ps(r0 + 2 * ow + 4);
    const __m128 b0 = _mm_loadu_ps(r1 + 2 * ow), b1 = _mm_loadu_ps(r1 + 2 * ow + 4);
    __m128 m = _mm_set1_ps(std::numeric_limits<float>::lowest());
    m = _mm_max_ps(_mm_shuffle_ps(a0, a1, _MM_SHUFFLE(2, 0, 2, 0)), m);
    m = _mm_max_ps(_mm_shuffle_ps(a0, a1, _MM_SHUFFLE(3, 1, 3, 1)), m);
    m = _mm_max_ps(_mm_shuffle_ps(b0, b1, _MM_SHUFFLE(2, 0, 2, 0)), m);
    m = _mm_max_ps(_mm_shuffle_ps(b0, b1, _MM_SHUFFLE(3, 1, 3, 1)), m);
    _mm_storeu_ps(y + ow, m);
  }
  return ow;
#else
  (void)r0, (void)iw, (void)ow_n, (void)y;
  return 0;
#endif
}

#if defined(__x86_64__)
// Outputs [ow0, ow1) of one row of stride-2 max windows `kw` (2 or 3) columns wide whose taps all
// lie inside the input row, 16 at a time: `first` is kernel row 0's input at output ow0's first
// tap, the kernel rows `row_stride` apart. Each kernel row's 16 windows come from two or four
// loads, their columns split into even and odd ones, and are taken in the taps' order (kernel
// rows, then columns) as maxps(x, m): x when x > m, else m, which is std::max(m, x) exactly (a
// NaN never wins, -0 and +0 keep the first). Returns the first output it did not write.
__attribute__((target("avx512f"))) int64_t max_pool_s2_row_avx512(const float* first,
                                                                  int64_t row_stride,
                                                                  int64_t kh_n, int64_t kw,
                                                                  int64_t ow0, int64_t ow1,
                                                                  float* y) {
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  // The maskz form with every lane on: GCC 12 takes _mm512_max_ps's undefined source for a read.
#define QF_MAX(x, m) _mm512_maskz_max_ps(0xFFFF, (x), (m))
  int64_t ow = ow0;
  for (; ow + 16 <= ow1; ow += 16) {
    const float* col = first + 2 * (ow - ow0);
    __m512 m = _mm512_set1_ps(std::numeric_limits<float>::lowest());
    for (int64_t kh = 0; kh < kh_n; ++kh, col += row_stride) {
      const __m512 lo = _mm512_loadu_ps(col), hi = _mm512_loadu_ps(col + 16);
      m = QF_MAX(_mm512_permutex2var_ps(lo, even, hi), m);
      m = QF_MAX(_mm512_permutex2var_ps(lo, odd, hi), m);
      if (kw == 3) {  // columns 2, 4, ..., 32 (the last window's third tap is column 32)
        const __m512 lo2 = _mm512_loadu_ps(col + 2);
        const __m512 hi2 = _mm512_maskz_loadu_ps(0x7FFF, col + 18);
        m = QF_MAX(_mm512_permutex2var_ps(lo2, even, hi2), m);
      }
    }
    _mm512_storeu_ps(y + ow, m);
  }
  return ow;
}

// Blocks of 16 outputs of 2x2, stride-2 max windows over planes of exactly twice the output,
// whose rows hold ow_n outputs, ow_n dividing 16 (the sample CNN's 8 x 8 planes: 4): a block's
// outputs are whole output rows, which read 64 consecutive input floats (output row r reads the
// tensor's input rows 2r and 2r + 1), so 8 permutes split them into the four taps of 16
// windows, taken in the taps' order as max_pool_2x2_row takes them.
__attribute__((target("avx512f"))) void max_pool_2x2_blocks_avx512(const float* x, int64_t ow_n,
                                                                  int64_t blocks, float* y) {
  // Tap (a, b) of output l of a half block (8 outputs from 32 floats): output row l / ow_n of
  // the half, column l % ow_n, at 4 ow_n (l / ow_n) + 2 (l % ow_n) + 2 ow_n a + b.
  __m512i taps[4];
  for (int t = 0; t < 4; ++t) {
    alignas(64) int32_t at[16];
    for (int i = 0; i < 16; ++i) {
      const int64_t l = i % 8;
      at[i] = static_cast<int32_t>(4 * ow_n * (l / ow_n) + 2 * (l % ow_n) + 2 * ow_n * (t / 2) +
                                   t % 2);
    }
    taps[t] = _mm512_load_si512(at);
  }
  for (int64_t b = 0; b < blocks; ++b, x += 64, y += 16) {
    const __m512 z0 = _mm512_loadu_ps(x), z1 = _mm512_loadu_ps(x + 16);
    const __m512 z2 = _mm512_loadu_ps(x + 32), z3 = _mm512_loadu_ps(x + 48);
    __m512 m = _mm512_set1_ps(std::numeric_limits<float>::lowest());
    for (const __m512i& t : taps) {
      const __m512 tap = _mm512_mask_blend_ps(0xFF00, _mm512_permutex2var_ps(z0, t, z1),
                                              _mm512_permutex2var_ps(z2, t, z3));
      m = QF_MAX(tap, m);
    }
    _mm512_storeu_ps(y, m);
  }
}
#undef QF_MAX
#endif

template <typename T>
void max_pool_2d(const OpContext& ctx, const Window& w, int64_t planes, const T* x, T* y) {
  const TapRanges taps = tap_ranges(w);
  const int64_t oh_n = w.out[0], ow_n = w.out[1], iw_n = w.in[1], isize = w.in_size();
  const int64_t dh = w.dilations[0], dw = w.dilations[1];
  if (oh_n == 0 || ow_n == 0) return;
  // 2x2 windows at stride 2 without padding before them: whole windows go four at a time.
  const bool pairs = w.kernel[0] == 2 && w.kernel[1] == 2 && w.strides[0] == 2 &&
                     w.strides[1] == 2 && dh == 1 && dw == 1 && w.pad_begin[0] == 0 &&
                     w.pad_begin[1] == 0;
  (void)pairs;  // read for float only
  // Stride-2 windows 2 or 3 columns wide (ResNet's 3x3 MaxPool): the outputs whose taps all lie
  // inside the row, [begin, end), sixteen at a time where the AVX-512 kernels run.
  int64_t whole_begin = 0, whole_end = 0;
  if (std::is_same_v<T, float> && packed_gemm_avx512() && w.strides[1] == 2 && dw == 1 &&
      (w.kernel[1] == 2 || w.kernel[1] == 3)) {
    const auto whole = [&](int64_t ow) {
      const auto u = static_cast<size_t>(ow);
      return taps.lo[1][u] == 0 && taps.hi[1][u] == w.kernel[1];
    };
    while (whole_begin < ow_n && !whole(whole_begin)) ++whole_begin;
    whole_end = whole_begin;
    while (whole_end < ow_n && whole(whole_end)) ++whole_end;
  }
  if constexpr (std::is_same_v<T, float>) {
    // Planes of exactly twice the output in both dims: output row r reads input rows 2r and
    // 2r + 1 of the whole tensor, so rows go by without any per-row bookkeeping (small planes,
    // the sample CNN's 8 x 8, were mostly that).
    if (pairs && w.in[0] == 2 * oh_n && iw_n == 2 * ow_n) {
      // Rows shorter than 16 outputs: 16 outputs at a time where the AVX-512 kernels run (the
      // sample CNN's MaxPool at batch 32: 17.5-20.7 -> 7.6-8.5 us), the rows left one by one.
      int64_t first = 0;
#if defined(__x86_64__)
      if (packed_gemm_avx512() && ow_n < 16 && 16 % ow_n == 0) {
        const int64_t blocks = planes * oh_n * ow_n / 16;
        parallel_chunks(ctx.threads(), blocks, grain_for(64), [&](int64_t begin, int64_t end) {
          max_pool_2x2_blocks_avx512(x + begin * 64, ow_n, end - begin, y + begin * 16);
        });
        first = blocks * 16 / ow_n;
      }
#endif
      parallel_chunks(ctx.threads(), planes * oh_n - first, grain_for(ow_n * 4),
                      [&](int64_t begin, int64_t end) {
        for (int64_t row = first + begin; row < first + end; ++row) {
          const float* r0 = x + row * 2 * iw_n;
          const float* r1 = r0 + iw_n;
          float* yr = y + row * ow_n;
          for (int64_t ow = max_pool_2x2_row(r0, iw_n, ow_n, yr); ow < ow_n; ++ow) {
            float m = std::numeric_limits<float>::lowest();
            for (const float v : {r0[2 * ow], r0[2 * ow + 1], r1[2 * ow], r1[2 * ow + 1]}) {
              m = std::max(m, v);
            }
            yr[ow] = m;
          }
        }
      });
      return;
    }
  }
  parallel_chunks(ctx.threads(), planes * oh_n, grain_for(ow_n * w.kernel_size()),
                  [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t plane = row / oh_n;
      const auto oh = static_cast<size_t>(row % oh_n);
      const T* xp = x + plane * isize;
      T* yr = y + row * ow_n;
      const int64_t kh_lo = taps.lo[0][oh], kh_hi = taps.hi[0][oh], bh = taps.base[0][oh];
      const auto one = [&](int64_t ow) {
        const auto u = static_cast<size_t>(ow);
        const int64_t kw_lo = taps.lo[1][u], kw_hi = taps.hi[1][u], bw = taps.base[1][u];
        if (kh_hi <= kh_lo || kw_hi <= kw_lo) {
          yr[ow] = T(0);
          return;
        }
        T m = std::numeric_limits<T>::lowest();
        for (int64_t kh = kh_lo; kh < kh_hi; ++kh) {
          const T* xr = xp + (bh + kh * dh) * iw_n + bw;
          for (int64_t kw = kw_lo; kw < kw_hi; ++kw) m = std::max(m, xr[kw * dw]);
        }
        yr[ow] = m;
      };
      int64_t ow = 0;
      if constexpr (std::is_same_v<T, float>) {
        if (pairs && kh_lo == 0 && kh_hi == 2) {
          ow = max_pool_2x2_row(xp + bh * iw_n, iw_n, ow_n, yr);
        }
#if defined(__x86_64__)
        if (ow == 0 && whole_end - whole_begin >= 16 && kh_hi > kh_lo) {
          for (; ow < whole_begin; ++ow) one(ow);
          const int64_t b0 = taps.base[1][static_cast<size_t>(whole_begin)];
          ow = max_pool_s2_row_avx512(xp + (bh + kh_lo * dh) * iw_n + b0, dh * iw_n,
                                      kh_hi - kh_lo, w.kernel[1], whole_begin, whole_end, yr);
        }
#endif
      }
      for (; ow < ow_n; ++ow) one(ow);
    }
  });
}

// Runs the pool on x [N, C, spatial...] of type T; `indices` (may be null) gets MaxPool's
// flat argmax per output. Work is split by output rows (all dims but the last); a row walks
// the taps of the outer dims once and sweeps the whole row for each, so every output still
// sees its taps in kernel order, from one thread.
template <typename T>
void pool_kernel(const OpContext& ctx, const Window& w, const PoolParams& p, int64_t planes,
                 const T* x, T* y, int64_t* indices) {
  const size_t r = w.rank();
  const size_t last = r - 1;
  const int64_t isize = w.in_size(), osize = w.out_size(), olast = w.out[last];
  if (olast == 0 || osize == 0) return;
  const int64_t rows_per_plane = osize / olast;
  const auto istr = contiguous_strides(w.in);
  std::vector<int64_t> cstr(r, 1);  // column-major strides for storage_order = 1
  for (size_t j = 1; j < r; ++j) cstr[j] = cstr[j - 1] * w.in[j - 1];
  const TapRanges taps = tap_ranges(w);
  const int64_t dl = w.dilations[last];
  const int64_t* lo_l = taps.lo[last].data();
  const int64_t* hi_l = taps.hi[last].data();
  const int64_t* base_l = taps.base[last].data();
  const bool is_max = p.kind == PoolKind::Max;
  const bool col_major = p.column_major;
  parallel_chunks(
      ctx.threads(), planes * rows_per_plane, grain_for(olast * w.kernel_size()),
      [&](int64_t begin, int64_t end) {
        std::vector<int64_t> oidx(r), kidx(r);
        std::vector<double> sum(static_cast<size_t>(olast));
        std::vector<T> best(static_cast<size_t>(olast));
        std::vector<int64_t> best_at(static_cast<size_t>(olast));
        for (int64_t row = begin; row < end; ++row) {
          const int64_t plane = row / rows_per_plane;
          int64_t rem = row % rows_per_plane;
          for (size_t j = last; j-- > 0;) {
            oidx[j] = rem % w.out[j];
            rem /= w.out[j];
          }
          const T* xp = x + plane * isize;
          std::fill(sum.begin(), sum.end(), 0.0);
          std::fill(best_at.begin(), best_at.end(), int64_t{-1});
          std::fill(best.begin(), best.end(), std::numeric_limits<T>::lowest());
          bool empty = false;
          for (size_t j = 0; j < last; ++j) {
            const auto o = static_cast<size_t>(oidx[j]);
            kidx[j] = taps.lo[j][o];
            empty = empty || taps.hi[j][o] <= taps.lo[j][o];
          }
          for (bool more = !empty; more;) {  // each tap of the outer dims, in kernel order
            int64_t off = 0, coff = 0;
            for (size_t j = 0; j < last; ++j) {
              const int64_t i =
                  taps.base[j][static_cast<size_t>(oidx[j])] + kidx[j] * w.dilations[j];
              off += i * istr[j];
              coff += i * cstr[j];
            }
            const T* xr = xp + off;
            if (is_max && indices == nullptr) {  // branch-free max; no argmax to track
              for (int64_t ol = 0; ol < olast; ++ol) {
                T m = best[static_cast<size_t>(ol)];
                for (int64_t k = lo_l[ol]; k < hi_l[ol]; ++k)
                  m = std::max(m, xr[base_l[ol] + k * dl]);
                best[static_cast<size_t>(ol)] = m;
              }
            } else {
              for (int64_t ol = 0; ol < olast; ++ol) {
                const auto u = static_cast<size_t>(ol);
                for (int64_t k = lo_l[ol]; k < hi_l[ol]; ++k) {
                  const int64_t i = base_l[ol] + k * dl;
                  const T v = xr[i];
                  if (is_max) {
                    if (best_at[u] < 0 || v > best[u]) {
                      best[u] = v;
                      best_at[u] = col_major ? coff + i * cstr[last] : off + i;
                    }
                  } else {
                    sum[u] += static_cast<double>(v);
                  }
                }
              }
            }
            more = false;  // next tap of the outer dims, if any
            for (size_t j = last; j-- > 0 && !more;) {
              const auto o = static_cast<size_t>(oidx[j]);
              more = ++kidx[j] < taps.hi[j][o];
              if (!more) kidx[j] = taps.lo[j][o];
            }
          }
          // Taps inside the input (or inside the padded input) of the outer dims.
          int64_t outer_count = 1, outer_padded = 1;
          for (size_t j = 0; j < last; ++j) {
            const auto o = static_cast<size_t>(oidx[j]);
            outer_count *= taps.hi[j][o] - taps.lo[j][o];
            outer_padded *= taps.padded[j][o];
          }
          T* yr = y + row * olast;
          for (int64_t ol = 0; ol < olast; ++ol) {
            const auto u = static_cast<size_t>(ol);
            const int64_t taps_in = outer_count * (hi_l[ol] - lo_l[ol]);
            if (is_max) {
              yr[ol] = empty || taps_in == 0 ? T(0) : best[u];
              if (indices != nullptr) {
                indices[row * olast + ol] = plane * isize + std::max<int64_t>(best_at[u], 0);
              }
              continue;
            }
            const int64_t count =
                p.count_include_pad ? outer_padded * taps.padded[last][u] : taps_in;
            yr[ol] =
                empty || count == 0 ? T(0) : static_cast<T>(sum[u] / static_cast<double>(count));
          }
        }
      });
}

// GlobalAveragePool: each plane's sum in double over its elements in order, then divided by
// their count, as pool_kernel computes it (the same bits), eight planes at a time so that eight
// independent chains of additions are in flight instead of one (a chain of double additions
// waits on each: ResNet-50's 2048 planes of 7 x 7 took 0.16 ms one at a time).
template <typename T>
void global_average(const OpContext& ctx, int64_t planes, int64_t size, const T* x, T* y) {
  constexpr int64_t kPlanes = 8;
  parallel_chunks(ctx.threads(), planes, grain_for(size), [&](int64_t begin, int64_t end) {
    const auto mean = [size](double sum) {
      return size == 0 ? T(0) : static_cast<T>(sum / static_cast<double>(size));
    };
    int64_t p = begin;
    for (; p + kPlanes <= end; p += kPlanes) {
      double sum[kPlanes] = {};
      const T* xp = x + p * size;
      for (int64_t i = 0; i < size; ++i) {
        for (int64_t q = 0; q < kPlanes; ++q) sum[q] += static_cast<double>(xp[q * size + i]);
      }
      for (int64_t q = 0; q < kPlanes; ++q) y[p + q] = mean(sum[q]);
    }
    for (; p < end; ++p) {
      double sum = 0.0;
      for (int64_t i = 0; i < size; ++i) sum += static_cast<double>(x[p * size + i]);
      y[p] = mean(sum);
    }
  });
}

void run_pool(OpContext& ctx, const PoolParams& p, bool global) {
  const Tensor& in = ctx.input(0);
  if (in.rank() < 3)
    ctx.fail_invalid("input " + shape_to_string(in.shape()) + " needs [N, C, spatial...]");
  const size_t r = in.rank() - 2;
  const std::span<const int64_t> spatial = std::span(in.shape()).subspan(2);
  Window w;
  if (global) {
    w.in.assign(spatial.begin(), spatial.end());
    w.kernel = w.in;
    w.strides = w.dilations = std::vector<int64_t>(r, 1);
    w.pad_begin = w.pad_end = std::vector<int64_t>(r, 0);
    w.out = std::vector<int64_t>(r, 1);
  } else {
    if (ctx.opset() < 19 && p.kind == PoolKind::Average && ctx.attr("dilations") != nullptr) {
      ctx.fail_invalid("AveragePool has 'dilations' only from opset 19");
    }
    w = forward_window(ctx, spatial, kernel_shape_attr(ctx, r), ctx.attr_int("ceil_mode", 0) != 0);
  }
  Shape out_shape{in.shape()[0], in.shape()[1]};
  out_shape.insert(out_shape.end(), w.out.begin(), w.out.end());
  const int64_t planes = in.shape()[0] * in.shape()[1];
  Tensor indices;
  if (ctx.wants_output(1)) indices = Tensor(DType::I64, out_shape);
  int64_t* pidx = ctx.wants_output(1) ? indices.mutable_data<int64_t>().data() : nullptr;
  const Tensor x = is_half(in.dtype()) ? to_f32(in) : in;
  auto run_typed = [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (p.kind == PoolKind::Max && pidx == nullptr && r == 2) {
      T* py = nullptr;  // max_pool_2d writes every element
      Tensor y = unset_tensor(x.dtype(), out_shape, &py);
      max_pool_2d<T>(ctx, w, planes, x.data<T>().data(), py);
      ctx.set_output(0, is_half(in.dtype()) ? from_f32(y, in.dtype()) : y);
      return;
    }
    Tensor y(x.dtype(), out_shape);
    if (global && p.kind == PoolKind::Average) {
      global_average<T>(ctx, planes, w.in_size(), x.data<T>().data(), y.mutable_data<T>().data());
    } else {
      pool_kernel<T>(ctx, w, p, planes, x.data<T>().data(), y.mutable_data<T>().data(), pidx);
    }
    ctx.set_output(0, is_half(in.dtype()) ? from_f32(y, in.dtype()) : y);
  };
  const bool ok = p.kind == PoolKind::Max ? visit_dtype(TypeList<float, double, int8_t, uint8_t>{},
                                                        x.dtype(), run_typed)
                                          : visit_dtype(FloatTypes{}, x.dtype(), run_typed);
  if (!ok) ctx.fail_dtype(0);
  if (ctx.wants_output(1)) ctx.set_output(1, std::move(indices));
}

void run_max_pool(OpContext& ctx) {
  const int64_t order = ctx.attr_int("storage_order", 0);
  if (order != 0 && order != 1) ctx.fail_invalid("storage_order must be 0 or 1");
  run_pool(ctx, {.kind = PoolKind::Max, .column_major = order == 1}, false);
}
void run_average_pool(OpContext& ctx) {
  run_pool(
      ctx,
      {.kind = PoolKind::Average, .count_include_pad = ctx.attr_int("count_include_pad", 0) != 0},
      false);
}
void run_global_average_pool(OpContext& ctx) { run_pool(ctx, {.kind = PoolKind::Average}, true); }
void run_global_max_pool(OpContext& ctx) { run_pool(ctx, {.kind = PoolKind::Max}, true); }

constexpr OpEntry kOps[] = {
    {"", "MaxPool", run_max_pool},
    {"", "AveragePool", run_average_pool},
    {"", "GlobalAveragePool", run_global_average_pool},
    {"", "GlobalMaxPool", run_global_max_pool},
};

}  // namespace

std::span<const OpEntry> pool_ops() { return kOps; }

}  // namespace qforge::ops
