// Normalizations: BatchNormalization (inference), InstanceNormalization, LayerNormalization
// (with its optional Mean and InvStdDev outputs), and the fused RmsNorm (runtime/op_fusion.h).
// Statistics accumulate in double.
#include <immintrin.h>

#include <cmath>

#include "kernels/cpu/lanes.h"
#include "kernels/packed_gemm.h"
#include "runtime/op_registry.h"
#include "runtime/op_utils.h"

namespace qforge::ops {

namespace {

// A per-channel f32 parameter of length `c` (BatchNorm and InstanceNorm inputs).
std::vector<float> channel_param(const OpContext& ctx, size_t i, int64_t c) {
  const Tensor& t = ctx.input(i);
  if (!dtype_is_float(t.dtype())) ctx.fail_dtype(i);
  if (t.numel() != static_cast<uint64_t>(c)) {
    ctx.fail_invalid("input " + std::to_string(i) + " '" + ctx.node().inputs[i] + "' has shape " +
                     shape_to_string(t.shape()) + "; expected " + std::to_string(c) + " values");
  }
  return t.to_f32();
}

void run_batch_norm(OpContext& ctx) {
  if (ctx.attr_int("training_mode", 0) != 0) {
    ctx.fail_unsupported("training_mode=1 is not supported; the runtime does inference only");
  }
  if (ctx.attr_int("spatial", 1) != 1) ctx.fail_unsupported("spatial=0 is not supported");
  for (size_t i = 1; i < ctx.outputs.size(); ++i) {
    if (ctx.wants_output(i)) {
      ctx.fail_unsupported(
          "training outputs (running mean/var, saved statistics) are not supported");
    }
  }
  const DType dt = float_dtype(ctx, 0);
  const Tensor x = to_f32(ctx.input(0));
  if (x.rank() < 2) ctx.fail_invalid("X " + shape_to_string(x.shape()) + " needs [N, C, ...]");
  const int64_t c = x.shape()[1];
  const auto scale = channel_param(ctx, 1, c), bias = channel_param(ctx, 2, c);
  const auto mean = channel_param(ctx, 3, c), var = channel_param(ctx, 4, c);
  const double eps = ctx.attr_float("epsilon", 1e-5f);
  std::vector<float> a(static_cast<size_t>(c)), b(static_cast<size_t>(c));
  for (size_t i = 0; i < a.size(); ++i) {
    const double inv = 1.0 / std::sqrt(static_cast<double>(var[i]) + eps);
    a[i] = static_cast<float>(scale[i] * inv);
    b[i] = static_cast<float>(bias[i] - mean[i] * scale[i] * inv);
  }
  const int64_t inner = dims_product(x.shape(), 2, x.rank());
  const int64_t planes = x.shape()[0] * c;
  float* py = nullptr;
  Tensor y = unset_tensor(DType::F32, x.shape(), &py);
  const float* px = x.data<float>().data();
  parallel_chunks(ctx.threads(), planes, grain_for(inner), [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const auto ch = static_cast<size_t>(p % c);
      for (int64_t i = 0; i < inner; ++i) py[p * inner + i] = px[p * inner + i] * a[ch] + b[ch];
    }
  });
  ctx.set_output(0, from_f32(y, dt));
}

void run_instance_norm(OpContext& ctx) {
  const DType dt = float_dtype(ctx, 0);
  const Tensor x = to_f32(ctx.input(0));
  if (x.rank() < 3)
    ctx.fail_invalid("X " + shape_to_string(x.shape()) + " needs [N, C, spatial...]");
  const int64_t c = x.shape()[1];
  const auto scale = channel_param(ctx, 1, c), bias = channel_param(ctx, 2, c);
  const double eps = ctx.attr_float("epsilon", 1e-5f);
  const int64_t inner = dims_product(x.shape(), 2, x.rank());
  float* py = nullptr;
  Tensor y = unset_tensor(DType::F32, x.shape(), &py);
  const float* px = x.data<float>().data();
  parallel_chunks(
      ctx.threads(), x.shape()[0] * c, grain_for(inner * 3), [&](int64_t begin, int64_t end) {
        for (int64_t p = begin; p < end; ++p) {
          const float* xp = px + p * inner;
          double sum = 0.0, sq = 0.0;
          for (int64_t i = 0; i < inner; ++i) sum += xp[i];
          const double mu = sum / static_cast<double>(inner);
          for (int64_t i = 0; i < inner; ++i) sq += (xp[i] - mu) * (xp[i] - mu);
          const double inv = 1.0 / std::sqrt(sq / static_cast<double>(inner) + eps);
          const auto ch = static_cast<size_t>(p % c);
          for (int64_t i = 0; i < inner; ++i) {
            py[p * inner + i] = static_cast<float>((xp[i] - mu) * inv * scale[ch] + bias[ch]);
          }
        }
      });
  ctx.set_output(0, from_f32(y, dt));
}

// Expands a Scale or B input to `target` (the normalized trailing shape or X's full shape).
Tensor expand_param(const OpContext& ctx, size_t i, const Shape& target) {
  Tensor p = f32_input(ctx, i);
  const Shape s = broadcast_shapes(ctx, {&target, &p.shape()});
  if (s != target) {
    ctx.fail_invalid("input " + std::to_string(i) + " " + shape_to_string(p.shape()) +
                     " does not broadcast to " + shape_to_string(target));
  }
  if (p.shape() == target) return p;
  Tensor out(DType::F32, target);
  const Broadcaster bc(target, {&p.shape()});
  const float* src = p.data<float>().data();
  float* dst = out.mutable_data<float>().data();
  bc.for_each_span<1>(0, static_cast<int64_t>(out.numel()),
                      [&](int64_t o, int64_t len, const auto& in) {
                        for (int64_t k = 0; k < len; ++k)
                          dst[o + k] = src[in[0] + k * bc.inner_stride(0)];
                      });
  return out;
}

// What row_sum adds up per element: x, (x - mu)^2 in double, or x * x rounded to f32 (as a
// Mul before a ReduceMean computes it).
enum class Term { Value, CenteredSquare, FloatSquare };

// sum over i of the term of x[i], in double: eight interleaved sums (element i goes to sum
// i % 8, held in four 2-lane registers), added as ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 +
// s7)), so the adds overlap instead of waiting on one another. The order depends only on n: a
// row gives the same bits wherever it is computed.
double row_sum_lanes(const float* x, int64_t n, double mu, Term term) {
  using V = lanes::Lanes<double, 2>::V;
  const auto value = [&](float a) -> double {
    switch (term) {
      case Term::CenteredSquare:
        return (a - mu) * (a - mu);
      case Term::FloatSquare:
        return a * a;  // f32 product, then widened
      default:
        return a;
    }
  };
  V acc[4] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 4; ++l) acc[l] += V{value(x[i + 2 * l]), value(x[i + 2 * l + 1])};
  }
  for (int64_t j = 0; i < n; ++i, ++j) acc[j / 2][j % 2] += value(x[i]);
  return ((acc[0][0] + acc[0][1]) + (acc[1][0] + acc[1][1])) +
         ((acc[2][0] + acc[2][1]) + (acc[3][0] + acc[3][1]));
}

// The term of eight elements, as row_sum_lanes computes each. (Functions, not lambdas: a
// lambda would not inherit the target.)
template <Term T>
__attribute__((target("avx512f"), always_inline)) inline __m512d term8(__m256 v, __m512d mu) {
  if constexpr (T == Term::FloatSquare) return _mm512_maskz_cvtps_pd(0xFF, _mm256_mul_ps(v, v));
  const __m512d d = _mm512_maskz_cvtps_pd(0xFF, v);
  if constexpr (T == Term::CenteredSquare) {
    const __m512d c = _mm512_sub_pd(d, mu);
    return _mm512_mul_pd(c, c);
  }
  return d;
}

// The first `lanes` of eight floats at p, the rest 0 (not read: no fault past an array's end),
// and the same widened to double. (The maskz forms with every lane on: GCC 12 takes the plain
// forms' undefined source for a read.)
__attribute__((target("avx512f"), always_inline)) inline __m256 load8(__mmask8 lanes,
                                                                      const float* p) {
  const __m512d v = _mm512_castps_pd(_mm512_maskz_loadu_ps(lanes, p));
  return _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xF, v, 0));
}
__attribute__((target("avx512f"), always_inline)) inline __m512d widen8(__mmask8 lanes,
                                                                        const float* p) {
  return _mm512_maskz_cvtps_pd(0xFF, load8(lanes, p));
}

// The same sums with the eight in one AVX-512 register (element i in lane i % 8, the same adds
// in the same order; the lanes past a row's end add +0, which leaves every sum as it was: a sum
// starts at +0 and never becomes -0): the same bits, four times fewer adds issued.
template <Term T>
__attribute__((target("avx512f"))) double row_sum_avx512(const float* x, int64_t n, double mu) {
  const __m512d m = _mm512_set1_pd(mu);
  __m512d acc = _mm512_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) acc = _mm512_add_pd(acc, term8<T>(_mm256_loadu_ps(x + i), m));
  if (i < n) {
    const auto lanes = static_cast<__mmask8>((1u << (n - i)) - 1u);
    acc = _mm512_add_pd(acc, _mm512_maskz_mov_pd(lanes, term8<T>(load8(lanes, x + i), m)));
  }
  alignas(64) double s[8];
  _mm512_store_pd(s, acc);
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

double row_sum(const float* x, int64_t n, double mu, Term term) {
  if (packed_gemm_avx512()) {
    switch (term) {
      case Term::CenteredSquare:
        return row_sum_avx512<Term::CenteredSquare>(x, n, mu);
      case Term::FloatSquare:
        return row_sum_avx512<Term::FloatSquare>(x, n, mu);
      default:
        return row_sum_avx512<Term::Value>(x, n, mu);
    }
  }
  return row_sum_lanes(x, n, mu, term);
}

// y[i] = f32(((x[i] - mu) * inv) * s[i] [+ b[i]]), in double as LayerNormalization's loop
// computes it, eight at a time: the same operations, so the same bits.
__attribute__((target("avx512f"))) void normalize_avx512(const float* x, int64_t n, double mu,
                                                          double inv, const float* s,
                                                          const float* b, float* y) {
  const __m512d m = _mm512_set1_pd(mu), r = _mm512_set1_pd(inv);
  for (int64_t i = 0; i < n; i += 8) {
    const auto lanes = static_cast<__mmask8>(n - i >= 8 ? 0xFF : (1u << (n - i)) - 1u);
    __m512d v = _mm512_mul_pd(_mm512_mul_pd(_mm512_sub_pd(widen8(lanes, x + i), m), r),
                              widen8(lanes, s + i));
    if (b != nullptr) v = _mm512_add_pd(v, widen8(lanes, b + i));
    const __m256 f = _mm512_maskz_cvtpd_ps(0xFF, v);
    _mm512_mask_storeu_ps(y + i, lanes, _mm512_castps256_ps512(f));
  }
}

void run_layer_norm(OpContext& ctx) {
  const DType dt = float_dtype(ctx, 0);
  const Tensor x = to_f32(ctx.input(0));
  const auto rank = static_cast<int64_t>(x.rank());
  const int64_t axis = normalize_axis(ctx, ctx.attr_int("axis", -1), rank, "axis");
  const double eps = ctx.attr_float("epsilon", 1e-5f);
  const int64_t outer = dims_product(x.shape(), 0, static_cast<size_t>(axis));
  const int64_t n = dims_product(x.shape(), static_cast<size_t>(axis), x.rank());
  // Parameters shaped like the normalized block repeat per row; others span all of X.
  const Shape block(x.shape().begin() + axis, x.shape().end());
  auto param = [&](size_t i, bool& per_row) {
    const Shape& ps = ctx.input(i).shape();
    per_row = ps.size() <= block.size();
    return expand_param(ctx, i, per_row ? block : x.shape());
  };
  bool scale_row = true, bias_row = true;
  const Tensor scale = param(1, scale_row);
  const Tensor bias = ctx.has_input(2) ? param(2, bias_row) : Tensor();
  Shape stat_shape = x.shape();
  for (auto d = static_cast<size_t>(axis); d < stat_shape.size(); ++d) stat_shape[d] = 1;
  Tensor y(DType::F32, x.shape()), mean(DType::F32, stat_shape), inv_std(DType::F32, stat_shape);
  const float* px = x.data<float>().data();
  const float* ps = scale.data<float>().data();
  const float* pb = bias.empty() ? nullptr : bias.data<float>().data();
  float* py = y.mutable_data<float>().data();
  float* pm = mean.mutable_data<float>().data();
  float* pi = inv_std.mutable_data<float>().data();
  parallel_chunks(ctx.threads(), outer, grain_for(n * 3), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = px + r * n;
      const double mu = row_sum(xr, n, 0.0, Term::Value) / static_cast<double>(n);
      const double var = row_sum(xr, n, mu, Term::CenteredSquare) / static_cast<double>(n);
      const double inv = 1.0 / std::sqrt(var + eps);
      pm[r] = static_cast<float>(mu);
      pi[r] = static_cast<float>(inv);
      const float* sr = ps + (scale_row ? 0 : r * n);
      const float* br = pb == nullptr ? nullptr : pb + (bias_row ? 0 : r * n);
      if (packed_gemm_avx512()) {
        normalize_avx512(xr, n, mu, inv, sr, br, py + r * n);
        continue;
      }
      for (int64_t i = 0; i < n; ++i) {
        const double v = (xr[i] - mu) * inv * sr[i];
        py[r * n + i] = static_cast<float>(br == nullptr ? v : v + br[i]);
      }
    }
  });
  ctx.set_output(0, from_f32(y, dt));
  // Mean and InvStdDev have the stash type (f32) per the spec.
  if (ctx.wants_output(1)) ctx.set_output(1, std::move(mean));
  if (ctx.wants_output(2)) ctx.set_output(2, std::move(inv_std));
}

// qforge.internal RmsNorm(x[, w]), what runtime/op_fusion.h makes of the exported chain, with
// its f32 steps: mean = f32(sum of f32 squares / n), r = 1 / sqrt(mean + epsilon),
// y = (x * r) [* w], over the last axis.
void run_rms_norm(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  if (x.dtype() != DType::F32) ctx.fail_dtype(0);
  if (x.rank() == 0) ctx.fail_invalid("RmsNorm needs an input of rank 1 or more");
  const int64_t n = x.shape().back();
  const int64_t rows = n > 0 ? static_cast<int64_t>(x.numel()) / n : 0;
  const float* pw = nullptr;
  if (ctx.has_input(1)) {
    const Tensor& w = ctx.input(1);
    if (w.dtype() != DType::F32) ctx.fail_dtype(1);
    if (w.shape() != Shape{n}) {
      ctx.fail_invalid("weight " + shape_to_string(w.shape()) + " is not [" + std::to_string(n) +
                       "]");
    }
    pw = w.data<float>().data();
  }
  const float eps = ctx.attr_float("epsilon", 1e-6f);
  float* py = nullptr;
  Tensor y = unset_tensor(DType::F32, x.shape(), &py);
  const float* px = x.data<float>().data();
  parallel_chunks(ctx.threads(), rows, grain_for(n * 3), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = px + r * n;
      float* yr = py + r * n;
      const auto mean = static_cast<float>(row_sum(xr, n, 0.0, Term::FloatSquare) /
                                           static_cast<double>(n));
      const float inv = 1.0f / std::sqrt(mean + eps);
      if (pw == nullptr) {
        for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * inv;
      } else {
        for (int64_t i = 0; i < n; ++i) yr[i] = (xr[i] * inv) * pw[i];
      }
    }
  });
  ctx.set_output(0, std::move(y));
}

constexpr OpEntry kOps[] = {
    {"", "BatchNormalization", run_batch_norm},
    {"", "InstanceNormalization", run_instance_norm},
    {"", "LayerNormalization", run_layer_norm},
    {kInternalDomain, "RmsNorm", run_rms_norm},  // runtime/op_fusion.h
};

}  // namespace

std::span<const OpEntry> norm_ops() { return kOps; }

}  // namespace qforge::ops
