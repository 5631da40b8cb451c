#pragma once
// Templates behind the elementwise op families (arithmetic, logic, activations): broadcast
// binary and ternary maps, unary maps, and the dtype plumbing around them. f16/bf16 inputs are
// computed in f32 and rounded back once.
#include <cmath>

#include "runtime/op_utils.h"

namespace qforge::ops {

// out[i] = f(a[i], b[i]) over the numpy broadcast of a and b; T is the inputs' element type,
// R the output's (its dtype is `out_dtype`).
template <typename T, typename R, typename F>
Tensor broadcast_binary(const OpContext& ctx, const Tensor& a, const Tensor& b, DType out_dtype,
                        F f) {
  const Shape out_shape = broadcast_shapes(ctx, {&a.shape(), &b.shape()});
  R* po = nullptr;
  Tensor out = unset_tensor(out_dtype, out_shape, &po);
  const Broadcaster bc(out_shape, {&a.shape(), &b.shape()});
  const T* pa = a.data<T>().data();
  const T* pb = b.data<T>().data();
  const int64_t sa = bc.inner_stride(0), sb = bc.inner_stride(1);
  const auto n = static_cast<int64_t>(out.numel());
  parallel_chunks(ctx.threads(), n, grain_for(1), [&](int64_t begin, int64_t end) {
    bc.for_each_span<2>(begin, end, [&](int64_t o, int64_t len, const std::array<int64_t, 2>& in) {
      const T* x = pa + in[0];
      const T* y = pb + in[1];
      R* z = po + o;
      if (sa == 1 && sb == 1) {
        for (int64_t i = 0; i < len; ++i) z[i] = static_cast<R>(f(x[i], y[i]));
      } else if (sa == 1) {
        const T yv = y[0];
        for (int64_t i = 0; i < len; ++i) z[i] = static_cast<R>(f(x[i], yv));
      } else if (sb == 1) {
        const T xv = x[0];
        for (int64_t i = 0; i < len; ++i) z[i] = static_cast<R>(f(xv, y[i]));
      } else {
        for (int64_t i = 0; i < len; ++i) z[i] = static_cast<R>(f(x[0], y[0]));
      }
    });
  });
  return out;
}

// out[i] = f(x[i]); R is the output element type.
template <typename T, typename R, typename F>
Tensor map_unary(const OpContext& ctx, const Tensor& x, DType out_dtype, F f) {
  R* po = nullptr;
  Tensor out = unset_tensor(out_dtype, x.shape(), &po);
  const T* px = x.data<T>().data();
  parallel_chunks(ctx.threads(), static_cast<int64_t>(x.numel()), grain_for(4),
                  [&](int64_t begin, int64_t end) {
                    for (int64_t i = begin; i < end; ++i) po[i] = static_cast<R>(f(px[i]));
                  });
  return out;
}

// Same-dtype binary op over the types in List on a and b, f16/bf16 through f32. Output dtype =
// inputs'.
template <typename List, typename F>
Tensor same_type_binary(const OpContext& ctx, const Tensor& a, const Tensor& b, F f) {
  if (a.dtype() != b.dtype()) {
    ctx.fail_invalid("inputs have different dtypes (" + std::string(dtype_name(a.dtype())) +
                     " and " + std::string(dtype_name(b.dtype())) + ")");
  }
  if (is_half(a.dtype())) {
    const Tensor r = broadcast_binary<float, float>(ctx, to_f32(a), to_f32(b), DType::F32, f);
    return from_f32(r, a.dtype());
  }
  Tensor out;
  const bool ok = visit_dtype(List{}, a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    out = broadcast_binary<T, T>(ctx, a, b, a.dtype(), f);
  });
  if (!ok) ctx.fail_dtype(0);
  return out;
}

// The same over the op's inputs 0 and 1, into its output 0.
template <typename List, typename F>
void same_type_binary(OpContext& ctx, F f) {
  ctx.set_output(0, same_type_binary<List>(ctx, ctx.input(0), ctx.input(1), f));
}

// Unary op over the types in List, f16/bf16 through f32. Output dtype = input's.
template <typename List, typename F>
void same_type_unary(OpContext& ctx, F f) {
  const Tensor& x = ctx.input(0);
  if (is_half(x.dtype())) {
    ctx.set_output(0, from_f32(map_unary<float, float>(ctx, to_f32(x), DType::F32, f), x.dtype()));
    return;
  }
  const bool ok = visit_dtype(List{}, x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    ctx.set_output(0, map_unary<T, T>(ctx, x, x.dtype(), f));
  });
  if (!ok) ctx.fail_dtype(0);
}

// Unary float op (f32, f64, f16/bf16 through f32).
template <typename F>
void float_unary(OpContext& ctx, F f) {
  same_type_unary<FloatTypes>(ctx, f);
}

}  // namespace qforge::ops
