// Activations: Relu, LeakyRelu, PRelu, Sigmoid, HardSigmoid, Tanh, Elu, Softplus, Gelu, Erf,
// Softmax, LogSoftmax.
#include "runtime/ops/activation.h"

#include <algorithm>
#include <array>
#include <numbers>
#include <type_traits>
#include <vector>

#include "kernels/cpu/vmath_cpu.h"
#include "runtime/op_registry.h"
#include "runtime/ops/elementwise_kernels.h"

namespace qforge::ops {

namespace {

using SignedNumeric = TypeList<float, double, int64_t, int32_t, int16_t, int8_t>;

void run_relu(OpContext& ctx) {
  same_type_unary<SignedNumeric>(ctx, [](auto x) { return x > 0 ? x : decltype(x)(0); });
}

// Relu(Add(a, b)) in one pass: the sum in the inputs' type first, as Add stores it (an integer
// sum wraps before the Relu sees it; a 16-bit float is summed in f32, and rounding after the
// Relu equals rounding before it).
constexpr auto kAddRelu = [](auto x, auto y) {
  const auto s = static_cast<decltype(x)>(x + y);
  return s > 0 ? s : decltype(s)(0);
};

void run_add_relu(OpContext& ctx) { same_type_binary<SignedNumeric>(ctx, kAddRelu); }

void run_leaky_relu(OpContext& ctx) {
  const double alpha = ctx.attr_float("alpha", 0.01f);
  float_unary(ctx, [alpha](auto x) {
    using T = decltype(x);
    return x >= 0 ? x : static_cast<T>(alpha) * x;
  });
}

void run_prelu(OpContext& ctx) {
  same_type_binary<FloatTypes>(ctx, [](auto x, auto slope) { return x >= 0 ? x : slope * x; });
}

void run_hard_sigmoid(OpContext& ctx) {
  const double alpha = ctx.attr_float("alpha", 0.2f);
  const double beta = ctx.attr_float("beta", 0.5f);
  float_unary(ctx, [alpha, beta](auto x) {
    using T = decltype(x);
    const T v = static_cast<T>(alpha) * x + static_cast<T>(beta);
    return std::max(T(0), std::min(T(1), v));
  });
}

void run_tanh(OpContext& ctx) {
  float_unary(ctx, [](auto x) { return std::tanh(x); });
}

void run_elu(OpContext& ctx) {
  const double alpha = ctx.attr_float("alpha", 1.0f);
  float_unary(ctx, [alpha](auto x) {
    using T = decltype(x);
    return x >= 0 ? x : static_cast<T>(alpha) * (std::exp(x) - T(1));
  });
}

void run_softplus(OpContext& ctx) {
  float_unary(ctx, [](auto x) {
    using T = decltype(x);
    return x > T(0) ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
  });
}

// f32 (f16/bf16 through f32) through an array kernel, in chunks among the threads (the kernel
// computes each element alone, so the chunks do not change the bits); f64 through `per_element`.
template <typename K, typename F>
void float_unary_arrays(OpContext& ctx, K kernel, F per_element) {
  const Tensor& x = ctx.input(0);
  if (x.dtype() != DType::F32 && !is_half(x.dtype())) {
    float_unary(ctx, per_element);
    return;
  }
  const Tensor in = to_f32(x);
  float* po = nullptr;
  Tensor out = unset_tensor(DType::F32, in.shape(), &po);
  const float* px = in.data<float>().data();
  parallel_chunks(ctx.threads(), static_cast<int64_t>(in.numel()), grain_for(8),
                  [&](int64_t begin, int64_t end) { kernel(px + begin, po + begin, end - begin); });
  ctx.set_output(0, x.dtype() == DType::F32 ? std::move(out) : from_f32(out, x.dtype()));
}

void run_sigmoid(OpContext& ctx) {
  float_unary_arrays(
      ctx, [](const float* x, float* y, int64_t n) { sigmoid_f32(x, y, n); },
      [](auto x) {
        using T = decltype(x);
        // Both branches avoid exp overflow.
        if (x >= 0) return T(1) / (T(1) + std::exp(-x));
        const T e = std::exp(x);
        return e / (T(1) + e);
      });
}

void run_erf(OpContext& ctx) {
  float_unary_arrays(
      ctx, [](const float* x, float* y, int64_t n) { erf_f32(x, y, n); },
      [](auto x) { return std::erf(x); });
}

// qforge.internal Silu(x) = x * Sigmoid(x), what runtime/op_fusion.h makes of Mul(x,
// Sigmoid(x)): the same f32 steps in one pass; a 16-bit x has the sigmoid rounded to its dtype
// before the product, as the two ops would.
void run_silu(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  if (x.dtype() != DType::F32 && !is_half(x.dtype())) ctx.fail_dtype(0);
  const Tensor in = to_f32(x);
  const auto n = static_cast<int64_t>(in.numel());
  const float* px = in.data<float>().data();
  float* po = nullptr;
  Tensor out = unset_tensor(DType::F32, in.shape(), &po);
  const auto product = [&](int64_t begin, int64_t end, const float* s) {
    for (int64_t i = begin; i < end; ++i) po[i] = px[i] * s[i];
  };
  if (x.dtype() == DType::F32) {
    parallel_chunks(ctx.threads(), n, grain_for(8), [&](int64_t begin, int64_t end) {
      sigmoid_f32(px + begin, po + begin, end - begin);
      product(begin, end, po);
    });
    ctx.set_output(0, std::move(out));
    return;
  }
  Tensor sig(DType::F32, in.shape());
  float* ps = sig.mutable_data<float>().data();
  parallel_chunks(ctx.threads(), n, grain_for(8), [&](int64_t begin, int64_t end) {
    sigmoid_f32(px + begin, ps + begin, end - begin);
  });
  sig = to_f32(from_f32(sig, x.dtype()));
  const float* rounded = sig.data<float>().data();
  parallel_chunks(ctx.threads(), n, grain_for(1),
                  [&](int64_t begin, int64_t end) { product(begin, end, rounded); });
  ctx.set_output(0, from_f32(out, x.dtype()));
}

void run_gelu(OpContext& ctx) {
  const std::string approximate = ctx.attr_string("approximate", "none");
  if (approximate == "none") {
    const auto exact = [](auto x) {
      using T = decltype(x);
      return T(0.5) * x * (T(1) + std::erf(x * static_cast<T>(std::numbers::sqrt2 / 2)));
    };
    float_unary_arrays(
        ctx, [](const float* x, float* y, int64_t n) { gelu_erf_f32(x, y, n); }, exact);
  } else if (approximate == "tanh") {
    float_unary(ctx, [](auto x) {
      using T = decltype(x);
      const T k = static_cast<T>(std::numbers::sqrt2 * std::numbers::inv_sqrtpi);  // sqrt(2/pi)
      return T(0.5) * x * (T(1) + std::tanh(k * (x + T(0.044715) * x * x * x)));
    });
  } else {
    ctx.fail_invalid("attribute 'approximate' is '" + approximate + "'; expected none or tanh");
  }
}

// The largest of x[0..n) that is a number (-inf when none), as std::max in order would find it,
// over 8 lanes so that the loop vectorizes (the largest does not depend on the order).
float lane_max(const float* x, int64_t n) {
  constexpr int kLanes = 8;
  float m[kLanes];
  for (float& v : m) v = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) m[l] = m[l] < x[i + l] ? x[i + l] : m[l];
  }
  for (; i < n; ++i) m[0] = m[0] < x[i] ? x[i] : m[0];
  float out = m[0];
  for (int l = 1; l < kLanes; ++l) out = out < m[l] ? m[l] : out;
  return out;
}

// sum of x[0..n) in a fixed order: 8 lane sums (lane l adds elements l, l + 8, ...; the tail
// goes to lane 0), then the lanes in order. Depends on n alone, not on the threads.
float lane_sum(const float* x, int64_t n) {
  constexpr int kLanes = 8;
  float s[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) s[l] += x[i + l];
  }
  for (; i < n; ++i) s[0] += x[i];
  float out = s[0];
  for (int l = 1; l < kLanes; ++l) out += s[l];
  return out;
}

// Softmax and LogSoftmax over [outer, n, inner]: from opset 13 the axis alone is reduced;
// before, the input is coerced to 2-D at `axis` and the whole trailing block is reduced.
// f32 rows along the last axis (inner = 1, what attention reduces) take exp(x - max) from the
// vector kernel (kernels/cpu/vmath_cpu.h) and their max and sum over 8 lanes; other layouts
// and f64 go element by element with std::exp.
template <typename T>
void softmax_kernel(const OpContext& ctx, const T* x, T* y, int64_t outer, int64_t n, int64_t inner,
                    bool log) {
  parallel_chunks(ctx.threads(), outer * inner, grain_for(n * 8), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t base = (r / inner) * n * inner + r % inner;
      T mx = -std::numeric_limits<T>::infinity();
      T sum = 0;
      constexpr bool kF32 = std::is_same_v<T, float>;
      if (kF32 && inner == 1) {
        if constexpr (kF32) {  // the vector kernels take float rows
          mx = lane_max(x + base, n);
          exp_shifted_f32(x + base, y + base, n, mx);
          sum = lane_sum(y + base, n);
        }
      } else {
        for (int64_t i = 0; i < n; ++i) mx = std::max(mx, x[base + i * inner]);
        for (int64_t i = 0; i < n; ++i) {
          const T e = std::exp(x[base + i * inner] - mx);
          if (!log) y[base + i * inner] = e;
          sum += e;
        }
      }
      if (log) {
        const T ls = std::log(sum);
        for (int64_t i = 0; i < n; ++i) y[base + i * inner] = x[base + i * inner] - mx - ls;
      } else {
        for (int64_t i = 0; i < n; ++i) y[base + i * inner] /= sum;
      }
    }
  });
}

void softmax_family(OpContext& ctx, bool log) {
  const Tensor& in = ctx.input(0);
  const auto rank = static_cast<int64_t>(in.rank());
  const bool legacy = ctx.opset() < 13;
  const int64_t axis =
      rank == 0 ? 0 : normalize_axis(ctx, ctx.attr_int("axis", legacy ? 1 : -1), rank, "axis");
  const auto& s = in.shape();
  const int64_t outer = dims_product(s, 0, static_cast<size_t>(axis));
  const int64_t n = legacy ? dims_product(s, static_cast<size_t>(axis), s.size())
                           : (rank == 0 ? 1 : s[static_cast<size_t>(axis)]);
  const int64_t inner = legacy ? 1 : dims_product(s, static_cast<size_t>(axis) + 1, s.size());
  const Tensor x = is_half(in.dtype()) ? to_f32(in) : in;
  const bool ok = visit_dtype(FloatTypes{}, x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* py = nullptr;
    Tensor y = unset_tensor(x.dtype(), x.shape(), &py);
    softmax_kernel<T>(ctx, x.data<T>().data(), py, outer, n, inner, log);
    ctx.set_output(0, is_half(in.dtype()) ? from_f32(y, in.dtype()) : y);
  });
  if (!ok) ctx.fail_dtype(0);
}

}  // namespace

// kScaleAddSoftmaxOp (activation.h). f32 scores with an f32 scalar scale and an f32 bias that
// broadcasts to them: a chunk of rows u = (x * c or x / c) + b into a scratch, then each row's
// softmax as Softmax takes it from its input. Anything else: the three ops one after another.
void run_scale_add_softmax(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor* c = ctx.has_input(1) ? &ctx.input(1) : nullptr;
  const Tensor* b = ctx.has_input(2) ? &ctx.input(2) : nullptr;
  const bool divide = ctx.attr_int("divide", 0) != 0;
  const bool f32 = x.dtype() == DType::F32 && (c == nullptr || c->dtype() == DType::F32) &&
                   (b == nullptr || b->dtype() == DType::F32);
  const bool rows = f32 && x.rank() >= 1 && x.numel() > 0 && (c == nullptr || c->numel() == 1) &&
                    (b == nullptr || broadcast_shapes(ctx, {&x.shape(), &b->shape()}) == x.shape());
  if (!rows) {
    Tensor u = x;
    if (c != nullptr && divide) {
      u = same_type_binary<FloatTypes>(ctx, u, *c, [](auto p, auto q) { return p / q; });
    } else if (c != nullptr) {
      u = same_type_binary<FloatTypes>(ctx, u, *c, [](auto p, auto q) { return p * q; });
    }
    if (b != nullptr) {
      u = same_type_binary<FloatTypes>(ctx, u, *b, [](auto p, auto q) { return p + q; });
    }
    if (u.rank() == 0) ctx.fail_invalid("Softmax over the last axis of a scalar");
    const Tensor w = is_half(u.dtype()) ? to_f32(u) : u;
    const int64_t last = w.shape().back();
    const int64_t outer = last == 0 ? 0 : static_cast<int64_t>(w.numel()) / last;
    const bool ok = visit_dtype(FloatTypes{}, w.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      T* pw = nullptr;
      Tensor y = unset_tensor(w.dtype(), w.shape(), &pw);
      softmax_kernel<T>(ctx, w.data<T>().data(), pw, outer, last, 1, false);
      ctx.set_output(0, is_half(u.dtype()) ? from_f32(y, u.dtype()) : y);
    });
    if (!ok) ctx.fail_dtype(0);
    return;
  }
  const int64_t n = x.shape().back();
  const int64_t count = static_cast<int64_t>(x.numel()) / n;
  const Broadcaster bc(x.shape(), {&x.shape(), b != nullptr ? &b->shape() : &x.shape()});
  const SoftmaxRows rows_of{.n = n,
                            .scale = c != nullptr ? c->data<float>().data() : nullptr,
                            .divide = divide,
                            .bias = b != nullptr ? b->data<float>().data() : nullptr,
                            .bc = &bc};
  const float* px = x.data<float>().data();
  float* py = nullptr;
  Tensor y = unset_tensor(DType::F32, x.shape(), &py);
  parallel_chunks(ctx.threads(), count, grain_for(n * 8), [&](int64_t begin, int64_t end) {
    std::vector<float> u;
    scale_add_softmax_rows(rows_of, begin, end, px + begin * n, py + begin * n, u);
  });
  ctx.set_output(0, std::move(y));
}

namespace {

void run_softmax(OpContext& ctx) { softmax_family(ctx, false); }
void run_log_softmax(OpContext& ctx) { softmax_family(ctx, true); }

// kGeluChainOp (activation.h): the erf runs on the scaled values in the output's storage, as
// the Erf op runs on the Div's output.
void run_gelu_chain(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  if (x.dtype() != DType::F32) ctx.fail_dtype(0);
  const bool divide = ctx.attr_int("divide", 0) != 0;
  const bool half_first = ctx.attr_int("half_first", 0) != 0;
  const float scale = ctx.attr_float("scale", 1.0f);
  const auto n = static_cast<int64_t>(x.numel());
  const float* px = x.data<float>().data();
  float* po = nullptr;
  Tensor out = unset_tensor(DType::F32, x.shape(), &po);
  // Output 1, when asked for: the erf's values (an observer reads them; runtime/op_fusion.h).
  float* pe = nullptr;
  Tensor erf_values;
  if (ctx.wants_output(1)) erf_values = unset_tensor(DType::F32, x.shape(), &pe);
  parallel_chunks(ctx.threads(), n, grain_for(8), [&](int64_t begin, int64_t end) {
    float* e = pe != nullptr ? pe : po;
    for (int64_t i = begin; i < end; ++i) e[i] = divide ? px[i] / scale : px[i] * scale;
    erf_f32(e + begin, e + begin, end - begin);
    for (int64_t i = begin; i < end; ++i) {
      const float p = 1.0f + e[i];
      po[i] = half_first ? (px[i] * 0.5f) * p : (px[i] * p) * 0.5f;
    }
  });
  ctx.set_output(0, std::move(out));
  if (pe != nullptr) ctx.set_output(1, std::move(erf_values));
}

constexpr OpEntry kOps[] = {
    {"", "Relu", run_relu},
    {kInternalDomain, "AddRelu", run_add_relu},  // runtime/op_fusion.h
    {"", "LeakyRelu", run_leaky_relu},
    {"", "PRelu", run_prelu},
    {"", "Sigmoid", run_sigmoid},
    {"", "HardSigmoid", run_hard_sigmoid},
    {"", "Tanh", run_tanh},
    {"", "Elu", run_elu},
    {"", "Softplus", run_softplus},
    {"", "Erf", run_erf},
    {"", "Gelu", run_gelu},
    {kInternalDomain, "Gelu", run_gelu},  // runtime/op_fusion.h, at any opset
    {kInternalDomain, "Silu", run_silu},  // runtime/op_fusion.h
    {kInternalDomain, kGeluChainOp, run_gelu_chain},  // runtime/op_fusion.h, exact fusions
    {kInternalDomain, kScaleAddSoftmaxOp, run_scale_add_softmax},
    {"", "Softmax", run_softmax},
    {"", "LogSoftmax", run_log_softmax},
};

}  // namespace

std::span<const OpEntry> activation_ops() { return kOps; }

Tensor add_relu(const OpContext& ctx, const Tensor& a, const Tensor& b) {
  return same_type_binary<SignedNumeric>(ctx, a, b, kAddRelu);
}

void scale_add_softmax_rows(const SoftmaxRows& a, int64_t begin, int64_t end, const float* x,
                            float* y, std::vector<float>& u) {
  const int64_t n = a.n;
  const float cv = a.scale != nullptr ? *a.scale : 1.0f;
  const int64_t sb = a.bc->inner_stride(1);
  if (u.size() < static_cast<size_t>((end - begin) * n)) u.resize((end - begin) * n);
  // The rows of u in one walk (short rows, such as an encoder's 16 tokens, would otherwise pay
  // for the walk's setup row by row), then each row's softmax.
  a.bc->for_each_span<2>(begin * n, end * n,
                         [&](int64_t o, int64_t len, const std::array<int64_t, 2>& in) {
                           const float* xs = x + (in[0] - begin * n);
                           float* us = u.data() + (o - begin * n);
                           if (a.scale == nullptr) {
                             std::copy(xs, xs + len, us);
                           } else if (a.divide) {
                             for (int64_t i = 0; i < len; ++i) us[i] = xs[i] / cv;
                           } else {
                             for (int64_t i = 0; i < len; ++i) us[i] = xs[i] * cv;
                           }
                           if (a.bias == nullptr) return;
                           const float* bs = a.bias + in[1];
                           if (sb == 1) {
                             for (int64_t i = 0; i < len; ++i) us[i] = us[i] + bs[i];
                           } else {
                             for (int64_t i = 0; i < len; ++i) us[i] = us[i] + bs[0];
                           }
                         });
  for (int64_t r = 0; r < end - begin; ++r) {
    const float* ur = u.data() + r * n;
    float* yr = y + r * n;
    const float mx = lane_max(ur, n);
    exp_shifted_f32(ur, yr, n, mx);
    const float sum = lane_sum(yr, n);
    for (int64_t i = 0; i < n; ++i) yr[i] /= sum;
  }
}

}  // namespace qforge::ops
