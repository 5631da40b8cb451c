// Comparisons and logic: Equal, Greater, GreaterOrEqual, Less, LessOrEqual, Not, And, Or, Xor,
// Where, IsNaN, IsInf.
#include "runtime/op_registry.h"
#include "runtime/ops/elementwise_kernels.h"

namespace qforge::ops {

namespace {

// A comparison of two same-dtype inputs (numeric or bool) giving a bool tensor.
template <typename F>
void compare(OpContext& ctx, F f) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  if (a.dtype() != b.dtype()) {
    ctx.fail_invalid("inputs have different dtypes (" + std::string(dtype_name(a.dtype())) +
                     " and " + std::string(dtype_name(b.dtype())) + ")");
  }
  if (is_half(a.dtype())) {
    ctx.set_output(0, broadcast_binary<float, uint8_t>(ctx, to_f32(a), to_f32(b), DType::Bool, f));
    return;
  }
  if (a.dtype() == DType::Bool) {
    ctx.set_output(0, broadcast_binary<uint8_t, uint8_t>(ctx, a, b, DType::Bool, f));
    return;
  }
  const bool ok = visit_dtype(NumericTypes{}, a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    ctx.set_output(0, broadcast_binary<T, uint8_t>(ctx, a, b, DType::Bool, f));
  });
  if (!ok) ctx.fail_dtype(0);
}

void run_equal(OpContext& ctx) {
  compare(ctx, [](auto x, auto y) { return x == y; });
}
void run_greater(OpContext& ctx) {
  compare(ctx, [](auto x, auto y) { return x > y; });
}
void run_greater_or_equal(OpContext& ctx) {
  compare(ctx, [](auto x, auto y) { return x >= y; });
}
void run_less(OpContext& ctx) {
  compare(ctx, [](auto x, auto y) { return x < y; });
}
void run_less_or_equal(OpContext& ctx) {
  compare(ctx, [](auto x, auto y) { return x <= y; });
}

template <typename F>
void bool_binary(OpContext& ctx, F f) {
  for (size_t i = 0; i < 2; ++i) {
    if (ctx.input(i).dtype() != DType::Bool) ctx.fail_dtype(i);
  }
  ctx.set_output(
      0, broadcast_binary<uint8_t, uint8_t>(ctx, ctx.input(0), ctx.input(1), DType::Bool, f));
}

void run_and(OpContext& ctx) {
  bool_binary(ctx, [](uint8_t x, uint8_t y) { return (x != 0) && (y != 0); });
}
void run_or(OpContext& ctx) {
  bool_binary(ctx, [](uint8_t x, uint8_t y) { return (x != 0) || (y != 0); });
}
void run_xor(OpContext& ctx) {
  bool_binary(ctx, [](uint8_t x, uint8_t y) { return (x != 0) != (y != 0); });
}

void run_not(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  if (x.dtype() != DType::Bool) ctx.fail_dtype(0);
  ctx.set_output(0, map_unary<uint8_t, uint8_t>(ctx, x, DType::Bool,
                                                [](uint8_t v) { return v == 0 ? 1 : 0; }));
}

template <typename F>
void float_predicate(OpContext& ctx, F f) {
  const Tensor& x = ctx.input(0);
  const Tensor xc = is_half(x.dtype()) ? to_f32(x) : x;
  const bool ok = visit_dtype(FloatTypes{}, xc.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    ctx.set_output(0, map_unary<T, uint8_t>(ctx, xc, DType::Bool, f));
  });
  if (!ok) ctx.fail_dtype(0);
}

void run_is_nan(OpContext& ctx) {
  float_predicate(ctx, [](auto v) { return std::isnan(v); });
}

void run_is_inf(OpContext& ctx) {
  const bool neg = ctx.attr_int("detect_negative", 1) != 0;
  const bool pos = ctx.attr_int("detect_positive", 1) != 0;
  float_predicate(ctx, [neg, pos](auto v) { return std::isinf(v) && (v > 0 ? pos : neg); });
}

// Where(cond, X, Y): a three-way broadcast that moves elements of X or Y by size.
template <typename E>
Tensor where_kernel(const OpContext& ctx, const Tensor& c, const Tensor& x, const Tensor& y,
                    const Shape& out_shape) {
  Tensor out(x.dtype(), out_shape);
  const Broadcaster bc(out_shape, {&c.shape(), &x.shape(), &y.shape()});
  const uint8_t* pc = c.data<uint8_t>().data();
  const E* px = x.data<E>().data();
  const E* py = y.data<E>().data();
  E* po = out.mutable_data<E>().data();
  const int64_t sc = bc.inner_stride(0), sx = bc.inner_stride(1), sy = bc.inner_stride(2);
  parallel_chunks(ctx.threads(), static_cast<int64_t>(out.numel()), grain_for(1),
                  [&](int64_t begin, int64_t end) {
                    bc.for_each_span<3>(begin, end, [&](int64_t o, int64_t len, const auto& in) {
                      for (int64_t i = 0; i < len; ++i) {
                        po[o + i] =
                            pc[in[0] + i * sc] != 0 ? px[in[1] + i * sx] : py[in[2] + i * sy];
                      }
                    });
                  });
  return out;
}

void run_where(OpContext& ctx) {
  const Tensor& c = ctx.input(0);
  const Tensor& x = ctx.input(1);
  const Tensor& y = ctx.input(2);
  if (c.dtype() != DType::Bool) ctx.fail_dtype(0);
  if (x.dtype() != y.dtype()) {
    ctx.fail_invalid("X and Y have different dtypes (" + std::string(dtype_name(x.dtype())) +
                     " and " + std::string(dtype_name(y.dtype())) + ")");
  }
  const Shape out_shape = broadcast_shapes(ctx, {&c.shape(), &x.shape(), &y.shape()});
  switch (element_size(ctx, x.dtype(), "input 1 '" + ctx.node().inputs[1] + "'")) {
    case 1:
      ctx.set_output(0, where_kernel<uint8_t>(ctx, c, x, y, out_shape));
      break;
    case 2:
      ctx.set_output(0, where_kernel<uint16_t>(ctx, c, x, y, out_shape));
      break;
    case 4:
      ctx.set_output(0, where_kernel<uint32_t>(ctx, c, x, y, out_shape));
      break;
    default:
      ctx.set_output(0, where_kernel<uint64_t>(ctx, c, x, y, out_shape));
      break;
  }
}

constexpr OpEntry kOps[] = {
    {"", "Equal", run_equal},
    {"", "Greater", run_greater},
    {"", "GreaterOrEqual", run_greater_or_equal},
    {"", "Less", run_less},
    {"", "LessOrEqual", run_less_or_equal},
    {"", "And", run_and},
    {"", "Or", run_or},
    {"", "Xor", run_xor},
    {"", "Not", run_not},
    {"", "IsNaN", run_is_nan},
    {"", "IsInf", run_is_inf},
    {"", "Where", run_where},
};

}  // namespace

std::span<const OpEntry> logic_ops() { return kOps; }

}  // namespace qforge::ops
