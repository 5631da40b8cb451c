// Arithmetic: Add, Sub, Mul, Div, Pow, Max, Min, Sum, Mean, Sqrt, Neg, Abs, Exp, Log,
// Reciprocal, Floor, Ceil, Round, Clip, Sin, Cos.
#include <atomic>
#include <limits>

#include "runtime/op_registry.h"
#include "runtime/ops/elementwise_kernels.h"

namespace qforge::ops {

namespace {

void run_add(OpContext& ctx) {
  same_type_binary<NumericTypes>(ctx, [](auto x, auto y) { return x + y; });
}
void run_sub(OpContext& ctx) {
  same_type_binary<NumericTypes>(ctx, [](auto x, auto y) { return x - y; });
}
void run_mul(OpContext& ctx) {
  same_type_binary<NumericTypes>(ctx, [](auto x, auto y) { return x * y; });
}

void run_div(OpContext& ctx) {
  if (dtype_is_float(ctx.input(0).dtype())) {
    same_type_binary<FloatTypes>(ctx, [](auto x, auto y) { return x / y; });
    return;
  }
  // Integer division truncates toward zero, as C and ONNX Runtime do.
  std::atomic<bool> by_zero{false};
  same_type_binary<IntTypes>(ctx, [&by_zero](auto x, auto y) {
    if (y == 0) {
      by_zero.store(true, std::memory_order_relaxed);
      return decltype(x){0};
    }
    return static_cast<decltype(x)>(x / y);
  });
  if (by_zero) ctx.fail_invalid("integer division by zero");
}

// Pow(X, Y): Y may have another numeric type than X; the result has X's type.
void run_pow(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& yin = ctx.input(1);
  if (!dtype_is_float(yin.dtype()) && yin.dtype() != DType::I64 && yin.dtype() != DType::I32) {
    ctx.fail_dtype(1);
  }
  const bool x_half = is_half(x.dtype());
  const DType compute = x_half ? DType::F32 : x.dtype();
  const Tensor xc = x_half ? to_f32(x) : x;
  const bool ok = visit_dtype(NumericTypes{}, compute, [&](auto tag) {
    using T = typename decltype(tag)::type;
    Tensor y;  // Y converted to X's compute type
    if (yin.dtype() == compute) {
      y = yin;
    } else {
      y = Tensor(compute, yin.shape());
      auto dst = y.mutable_data<T>();
      if (yin.dtype() == DType::F64) {
        const auto src = yin.data<double>();
        for (size_t i = 0; i < dst.size(); ++i) dst[i] = static_cast<T>(src[i]);
      } else if (yin.dtype() == DType::I64) {
        const auto src = yin.data<int64_t>();
        for (size_t i = 0; i < dst.size(); ++i) dst[i] = static_cast<T>(src[i]);
      } else {
        const auto src = yin.to_f32();
        for (size_t i = 0; i < dst.size(); ++i) dst[i] = static_cast<T>(src[i]);
      }
    }
    Tensor r = broadcast_binary<T, T>(ctx, xc, y, compute, [](T a, T b) {
      if constexpr (std::is_floating_point_v<T>) {
        if (b == T(2)) return a * a;
        return std::pow(a, b);
      } else {
        return static_cast<T>(std::pow(static_cast<double>(a), static_cast<double>(b)));
      }
    });
    ctx.set_output(0, x_half ? from_f32(r, x.dtype()) : r);
  });
  if (!ok) ctx.fail_dtype(0);
}

// Variadic ops fold their inputs left to right with broadcasting.
template <typename F>
void fold_variadic(OpContext& ctx, F f) {
  if (ctx.num_inputs() == 0) ctx.fail_invalid("needs at least one input");
  Tensor acc = ctx.input(0);
  for (size_t i = 1; i < ctx.num_inputs(); ++i) {
    OpContext pair = ctx.derived();
    pair.inputs = {&acc, &ctx.input(i)};
    pair.outputs.resize(1);
    same_type_binary<NumericTypes>(pair, f);
    acc = std::move(pair.outputs[0]);
  }
  if (ctx.num_inputs() == 1) {
    if (!is_half(acc.dtype()) && !visit_dtype(NumericTypes{}, acc.dtype(), [](auto) {})) {
      ctx.fail_dtype(0);
    }
  }
  ctx.set_output(0, std::move(acc));
}

// f16/bf16 inputs are folded in f32 and the result rounded once (with_widened_halves).
void run_max(OpContext& ctx) {
  with_widened_halves(ctx, [](OpContext& c) {
    fold_variadic(c, [](auto x, auto y) { return (x != x || x > y) ? x : y; });
  });
}
void run_min(OpContext& ctx) {
  with_widened_halves(ctx, [](OpContext& c) {
    fold_variadic(c, [](auto x, auto y) { return (x != x || x < y) ? x : y; });
  });
}
void run_sum(OpContext& ctx) {
  with_widened_halves(ctx,
                      [](OpContext& c) { fold_variadic(c, [](auto x, auto y) { return x + y; }); });
}
void mean_kernel(OpContext& ctx) {
  fold_variadic(ctx, [](auto x, auto y) { return x + y; });
  Tensor sum = std::move(ctx.outputs[0]);
  const DType dt = sum.dtype();
  if (!dtype_is_float(dt)) ctx.fail_dtype(0);
  OpContext div = ctx.derived();
  div.inputs = {&sum};
  div.outputs.resize(1);
  const auto n = static_cast<double>(ctx.num_inputs());
  float_unary(div, [n](auto x) { return static_cast<decltype(x)>(x / n); });
  ctx.set_output(0, std::move(div.outputs[0]));
}
void run_mean(OpContext& ctx) { with_widened_halves(ctx, mean_kernel); }

void run_sqrt(OpContext& ctx) {
  float_unary(ctx, [](auto x) { return std::sqrt(x); });
}
void run_exp(OpContext& ctx) {
  float_unary(ctx, [](auto x) { return std::exp(x); });
}
void run_log(OpContext& ctx) {
  float_unary(ctx, [](auto x) { return std::log(x); });
}
void run_sin(OpContext& ctx) {
  float_unary(ctx, [](auto x) { return std::sin(x); });
}
void run_cos(OpContext& ctx) {
  float_unary(ctx, [](auto x) { return std::cos(x); });
}
void run_reciprocal(OpContext& ctx) {
  float_unary(ctx, [](auto x) { return decltype(x)(1) / x; });
}
void run_floor(OpContext& ctx) {
  float_unary(ctx, [](auto x) { return std::floor(x); });
}
void run_ceil(OpContext& ctx) {
  float_unary(ctx, [](auto x) { return std::ceil(x); });
}
void run_round(OpContext& ctx) {  // half to even under the default rounding mode
  float_unary(ctx, [](auto x) { return std::nearbyint(x); });
}
void run_neg(OpContext& ctx) {
  same_type_unary<NumericTypes>(ctx, [](auto x) { return static_cast<decltype(x)>(-x); });
}
void run_abs(OpContext& ctx) {
  same_type_unary<NumericTypes>(ctx, [](auto x) {
    using T = decltype(x);
    if constexpr (std::is_unsigned_v<T>) {
      return x;
    } else {
      return static_cast<T>(x < 0 ? -x : x);
    }
  });
}

// Clip: min/max are attributes before opset 11 and optional scalar inputs from 11 on.
void run_clip(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  if (ctx.opset() < 11) {
    const float lo = ctx.attr_float("min", -std::numeric_limits<float>::max());
    const float hi = ctx.attr_float("max", std::numeric_limits<float>::max());
    float_unary(ctx, [lo, hi](auto v) {
      using T = decltype(v);
      v = v < T(lo) ? T(lo) : v;
      return v > T(hi) ? T(hi) : v;  // max wins when min > max, as the spec says
    });
    return;
  }
  for (size_t i = 1; i < 3; ++i) {
    if (!ctx.has_input(i)) continue;
    if (ctx.input(i).dtype() != x.dtype()) ctx.fail_dtype(i);
    if (ctx.input(i).numel() != 1) ctx.fail_invalid("min and max must be scalars");
  }
  const bool half = is_half(x.dtype());
  const auto bound = [&](size_t i, double fallback) {
    if (!ctx.has_input(i)) return fallback;
    const Tensor& t = ctx.input(i);
    if (t.dtype() == DType::F64) return t.data<double>()[0];
    if (t.dtype() == DType::I64) return static_cast<double>(t.data<int64_t>()[0]);
    return static_cast<double>(t.to_f32()[0]);
  };
  const double lo = bound(1, -std::numeric_limits<double>::infinity());
  const double hi = bound(2, std::numeric_limits<double>::infinity());
  const Tensor xc = half ? to_f32(x) : x;
  const bool ok = visit_dtype(NumericTypes{}, xc.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    Tensor r = map_unary<T, T>(ctx, xc, xc.dtype(), [lo, hi](T v) {
      if (static_cast<double>(v) < lo) v = static_cast<T>(lo);
      if (static_cast<double>(v) > hi) v = static_cast<T>(hi);  // max wins when min > max
      return v;
    });
    ctx.set_output(0, half ? from_f32(r, x.dtype()) : r);
  });
  if (!ok) ctx.fail_dtype(0);
}

constexpr OpEntry kOps[] = {
    {"", "Add", run_add},
    {"", "Sub", run_sub},
    {"", "Mul", run_mul},
    {"", "Div", run_div},
    {"", "Pow", run_pow},
    {"", "Max", run_max},
    {"", "Min", run_min},
    {"", "Sum", run_sum},
    {"", "Mean", run_mean},
    {"", "Sqrt", run_sqrt},
    {"", "Exp", run_exp},
    {"", "Log", run_log},
    {"", "Sin", run_sin},
    {"", "Cos", run_cos},
    {"", "Reciprocal", run_reciprocal},
    {"", "Floor", run_floor},
    {"", "Ceil", run_ceil},
    {"", "Round", run_round},
    {"", "Neg", run_neg},
    {"", "Abs", run_abs},
    {"", "Clip", run_clip},
};

}  // namespace

std::span<const OpEntry> elementwise_ops() { return kOps; }

}  // namespace qforge::ops
