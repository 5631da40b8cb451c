// Ops that change a tensor's shape or type without arithmetic: Cast, CastLike, Reshape,
// Flatten, Squeeze, Unsqueeze, Transpose, Expand, Shape, Size, Identity, Dropout (inference).
// Reshape-like ops return views that share the input's storage.
#include <cmath>
#include <cstring>
#include <limits>

#include "ir/half.h"
#include "runtime/op_registry.h"
#include "runtime/op_utils.h"

namespace qforge::ops {

namespace {

// ---- Cast -----------------------------------------------------------------------------------

// Element types Cast converts between; f16/bf16 go through f32, bool is 0/1 in a byte.
using CastTypes = TypeList<float, double, int64_t, int32_t, int16_t, int8_t, uint8_t>;

template <typename S, typename D>
D convert(S v) {
  if constexpr (std::is_floating_point_v<S> && std::is_integral_v<D>) {
    // Out-of-range and NaN conversions are undefined in C++; saturate them (NaN -> 0).
    if (std::isnan(v)) return D(0);
    if (v <= static_cast<S>(std::numeric_limits<D>::lowest()))
      return std::numeric_limits<D>::lowest();
    if (v >= static_cast<S>(std::numeric_limits<D>::max())) return std::numeric_limits<D>::max();
  }
  return static_cast<D>(v);
}

bool is_4bit(DType d) { return d == DType::I4 || d == DType::U4; }

Tensor cast_tensor(const OpContext& ctx, const Tensor& in, DType to) {
  if (in.dtype() == to) return in;
  if (is_4bit(in.dtype())) {  // widen to a byte type first
    const DType wide = in.dtype() == DType::I4 ? DType::I8 : DType::U8;
    const std::vector<float> v = in.to_f32();
    Tensor w(wide, in.shape());
    auto d = w.mutable_bytes();
    for (size_t i = 0; i < v.size(); ++i) {
      d[i] = static_cast<std::byte>(static_cast<int8_t>(v[i]));
    }
    return cast_tensor(ctx, w, to);
  }
  if (is_4bit(to)) {  // to integers, then keep the low nibble (wrapping, as ONNX does)
    const Tensor w = cast_tensor(ctx, in, DType::I32);
    Tensor out(to, in.shape());
    auto d = out.mutable_bytes();
    const auto src = w.data<int32_t>();
    for (size_t i = 0; i < src.size(); ++i) {
      const auto nib = static_cast<uint8_t>(src[i] & 0x0f);
      auto& byte = reinterpret_cast<uint8_t&>(d[i / 2]);
      byte = static_cast<uint8_t>(i % 2 == 0 ? nib : byte | (nib << 4));
    }
    return out;
  }
  // Bool targets and sources are handled as u8 with a normalization step.
  const Tensor src = is_half(in.dtype()) ? to_f32(in) : in;
  const DType src_dt = src.dtype() == DType::Bool ? DType::U8 : src.dtype();
  const DType dst_dt = is_half(to) ? DType::F32 : (to == DType::Bool ? DType::U8 : to);
  Tensor out(dst_dt, src.shape());
  const auto n = static_cast<int64_t>(src.numel());
  visit_dtype(CastTypes{}, src_dt, [&](auto stag) {
    using S = typename decltype(stag)::type;
    const S* ps = src.data<S>().data();
    visit_dtype(CastTypes{}, dst_dt, [&](auto dtag) {
      using D = typename decltype(dtag)::type;
      D* pd = out.mutable_data<D>().data();
      const bool to_bool = to == DType::Bool;
      parallel_chunks(ctx.threads(), n, grain_for(2), [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          pd[i] = to_bool ? static_cast<D>(ps[i] != S(0)) : convert<S, D>(ps[i]);
        }
      });
    });
  });
  if (is_half(to)) return from_f32(out, to);
  if (to == DType::Bool) return {DType::Bool, out.shape(), out.storage(), 0};
  return out;
}

void run_cast(OpContext& ctx) {
  const auto dt = dtype_from_onnx(static_cast<int>(ctx.attr_int("to", 0)));
  if (!dt)
    ctx.fail_unsupported("cast target type " + std::to_string(ctx.attr_int("to", 0)) +
                         " is not supported");
  ctx.set_output(0, cast_tensor(ctx, ctx.input(0), *dt));
}

void run_cast_like(OpContext& ctx) {
  ctx.set_output(0, cast_tensor(ctx, ctx.input(0), ctx.input(1).dtype()));
}

// ---- views ----------------------------------------------------------------------------------

void run_reshape(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  Shape shape;
  if (ctx.opset() < 5) {
    shape = ctx.attr_ints("shape").value_or(Shape{});
  } else {
    shape = read_int_values(ctx, ctx.input(1), "shape input");
  }
  const bool allow_zero = ctx.attr_int("allowzero", 0) != 0;
  int64_t infer = -1, known = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 0 && !allow_zero) {
      if (i >= x.rank())
        ctx.fail_invalid("shape " + shape_to_string(shape) + " copies dim " + std::to_string(i) +
                         " of a rank-" + std::to_string(x.rank()) + " input");
      shape[i] = x.shape()[i];
    }
    if (shape[i] == -1) {
      if (infer >= 0) ctx.fail_invalid("shape " + shape_to_string(shape) + " has two -1 dims");
      infer = static_cast<int64_t>(i);
    } else if (shape[i] < 0) {
      ctx.fail_invalid("shape " + shape_to_string(shape) + " has a negative dim");
    } else {
      known *= shape[i];
    }
  }
  const auto numel = static_cast<int64_t>(x.numel());
  if (infer >= 0) {
    if (known == 0 || numel % known != 0) {
      ctx.fail_invalid("cannot reshape " + shape_to_string(x.shape()) + " to " +
                       shape_to_string(shape));
    }
    shape[static_cast<size_t>(infer)] = numel / known;
  }
  if (static_cast<uint64_t>(dims_product(shape, 0, shape.size())) != x.numel()) {
    ctx.fail_invalid("cannot reshape " + shape_to_string(x.shape()) + " (" + std::to_string(numel) +
                     " elements) to " + shape_to_string(shape));
  }
  ctx.set_output(0, view_as(x, shape));
}

void run_flatten(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  const auto rank = static_cast<int64_t>(x.rank());
  const int64_t axis = ctx.attr_int("axis", 1);
  const int64_t a = axis == rank ? rank : normalize_axis(ctx, axis, rank, "axis");
  const auto split = static_cast<size_t>(a);
  ctx.set_output(
      0, view_as(x, {dims_product(x.shape(), 0, split), dims_product(x.shape(), split, x.rank())}));
}

// Axes from the attribute (before `input_opset`) or from input 1.
std::optional<std::vector<int64_t>> axes_arg(const OpContext& ctx, int64_t input_opset) {
  if (ctx.opset() < input_opset) return ctx.attr_ints("axes");
  if (!ctx.has_input(1)) return std::nullopt;
  return read_int_values(ctx, ctx.input(1), "axes input");
}

void run_squeeze(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  const auto rank = static_cast<int64_t>(x.rank());
  const auto axes_in = axes_arg(ctx, 13);
  std::vector<bool> drop(x.rank(), false);
  if (axes_in && !axes_in->empty()) {
    for (int64_t a : normalize_axes(ctx, *axes_in, rank, "axes")) {
      if (x.shape()[static_cast<size_t>(a)] != 1) {
        ctx.fail_invalid("cannot squeeze dim " + std::to_string(a) + " of " +
                         shape_to_string(x.shape()) + ": it is not 1");
      }
      drop[static_cast<size_t>(a)] = true;
    }
  } else {
    for (size_t i = 0; i < x.rank(); ++i) drop[i] = x.shape()[i] == 1;
  }
  Shape out;
  for (size_t i = 0; i < x.rank(); ++i) {
    if (!drop[i]) out.push_back(x.shape()[i]);
  }
  ctx.set_output(0, view_as(x, out));
}

void run_unsqueeze(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  const auto axes_in = axes_arg(ctx, 13);
  if (!axes_in) ctx.fail_invalid("needs axes");
  const auto out_rank = static_cast<int64_t>(x.rank() + axes_in->size());
  std::vector<bool> added(static_cast<size_t>(out_rank), false);
  for (int64_t a : normalize_axes(ctx, *axes_in, out_rank, "axes"))
    added[static_cast<size_t>(a)] = true;
  Shape out;
  size_t next = 0;
  for (const bool a : added) out.push_back(a ? 1 : x.shape()[next++]);
  ctx.set_output(0, view_as(x, out));
}

void run_identity(OpContext& ctx) { ctx.set_output(0, ctx.input(0)); }

// Dropout at inference is the identity; the mask, when asked for, is all true.
void run_dropout(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  bool training = false;
  if (ctx.opset() >= 12 && ctx.has_input(2)) {
    const Tensor& t = ctx.input(2);
    if (t.dtype() != DType::Bool || t.numel() != 1) ctx.fail_dtype(2);
    training = t.data<uint8_t>()[0] != 0;
  }
  if (training) {
    const float ratio = ctx.opset() >= 12 && ctx.has_input(1)
                            ? read_float_scalar(ctx, ctx.input(1), "ratio")
                            : ctx.attr_float("ratio", 0.5f);
    // Training with ratio 0 drops nothing and is still deterministic.
    if (ratio != 0.0f) {
      ctx.fail_unsupported(
          "training_mode=true drops values at random; the runtime does "
          "inference only");
    }
  }
  ctx.set_output(0, x);
  if (ctx.wants_output(1)) {
    Tensor mask(DType::Bool, x.shape());
    auto m = mask.mutable_data<uint8_t>();
    std::fill(m.begin(), m.end(), uint8_t{1});
    ctx.set_output(1, std::move(mask));
  }
}

// ---- data movement --------------------------------------------------------------------------

// Output row by output row (its last dim), each row's source offset carried from the previous
// row's like an odometer over the other dims (no division per row: a row of MiniLM's heads is 32
// floats), and copied whole where the last dim stays contiguous.
template <typename E>
void transpose_kernel(const OpContext& ctx, const Tensor& x, const std::vector<int64_t>& perm,
                      E* po, const Shape& os) {
  const size_t r = x.rank();
  const auto istr = contiguous_strides(x.shape());
  std::vector<int64_t> src_stride(r);  // input stride of each output dim
  for (size_t i = 0; i < r; ++i) src_stride[i] = istr[static_cast<size_t>(perm[i])];
  const E* px = x.data<E>().data();
  const int64_t last = r == 0 ? 1 : os.back();
  const int64_t rows = last == 0 ? 0 : static_cast<int64_t>(shape_numel(os)) / last;
  const int64_t ls = r == 0 ? 0 : src_stride.back();
  const size_t outer = r > 0 ? r - 1 : 0;  // the dims that number the rows
  parallel_chunks(ctx.threads(), rows, grain_for(last), [&](int64_t begin, int64_t end) {
    std::vector<int64_t> index(outer, 0);
    int64_t off = 0;
    for (size_t j = outer, rem = static_cast<size_t>(begin); j-- > 0;) {
      index[j] = static_cast<int64_t>(rem % static_cast<size_t>(os[j]));
      rem /= static_cast<size_t>(os[j]);
      off += index[j] * src_stride[j];
    }
    for (int64_t row = begin; row < end; ++row) {
      E* dst = po + row * last;
      if (ls == 1) {
        std::memcpy(dst, px + off, static_cast<size_t>(last) * sizeof(E));
      } else {
        for (int64_t i = 0; i < last; ++i) dst[i] = px[off + i * ls];
      }
      for (size_t j = outer; j-- > 0;) {  // the next row's index and offset
        off += src_stride[j];
        if (++index[j] < os[j]) break;
        off -= os[j] * src_stride[j];
        index[j] = 0;
      }
    }
  });
}

void run_transpose(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  const auto rank = static_cast<int64_t>(x.rank());
  std::vector<int64_t> perm;
  if (auto p = ctx.attr_ints("perm"); p && !p->empty()) {
    if (static_cast<int64_t>(p->size()) != rank) ctx.fail_invalid("perm has the wrong length");
    perm = normalize_axes(ctx, *p, rank, "perm");
  } else {
    for (int64_t i = rank - 1; i >= 0; --i) perm.push_back(i);
  }
  Shape os;
  for (int64_t p : perm) os.push_back(x.shape()[static_cast<size_t>(p)]);
  std::byte* po = nullptr;  // every element written: rows x last
  Tensor out = unset_tensor(x.dtype(), os, &po);
  switch (element_size(ctx, x.dtype(), "input 0")) {
    case 1:
      transpose_kernel(ctx, x, perm, reinterpret_cast<uint8_t*>(po), os);
      break;
    case 2:
      transpose_kernel(ctx, x, perm, reinterpret_cast<uint16_t*>(po), os);
      break;
    case 4:
      transpose_kernel(ctx, x, perm, reinterpret_cast<uint32_t*>(po), os);
      break;
    default:
      transpose_kernel(ctx, x, perm, reinterpret_cast<uint64_t*>(po), os);
      break;
  }
  ctx.set_output(0, std::move(out));
}

template <typename E>
void expand_kernel(const OpContext& ctx, const Tensor& x, Tensor& out) {
  const Broadcaster bc(out.shape(), {&x.shape()});
  const E* px = x.data<E>().data();
  E* po = out.mutable_data<E>().data();
  const int64_t s = bc.inner_stride(0);
  parallel_chunks(ctx.threads(), static_cast<int64_t>(out.numel()), grain_for(1),
                  [&](int64_t b, int64_t e) {
                    bc.for_each_span<1>(b, e, [&](int64_t o, int64_t len, const auto& in) {
                      for (int64_t i = 0; i < len; ++i) po[o + i] = px[in[0] + i * s];
                    });
                  });
}

void run_expand(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Shape target = read_int_values(ctx, ctx.input(1), "shape input");
  const Shape os = broadcast_shapes(ctx, {&x.shape(), &target});
  Tensor out(x.dtype(), os);
  switch (element_size(ctx, x.dtype(), "input 0")) {
    case 1:
      expand_kernel<uint8_t>(ctx, x, out);
      break;
    case 2:
      expand_kernel<uint16_t>(ctx, x, out);
      break;
    case 4:
      expand_kernel<uint32_t>(ctx, x, out);
      break;
    default:
      expand_kernel<uint64_t>(ctx, x, out);
      break;
  }
  ctx.set_output(0, std::move(out));
}

void run_shape(OpContext& ctx) {
  const Shape& s = ctx.input(0).shape();
  const auto rank = static_cast<int64_t>(s.size());
  auto clamp = [rank](int64_t v) { return std::clamp(v < 0 ? v + rank : v, int64_t{0}, rank); };
  const int64_t start = clamp(ctx.attr_int("start", 0));
  const int64_t end = ctx.attr("end") ? clamp(ctx.attr_int("end", rank)) : rank;
  const int64_t n = std::max<int64_t>(0, end - start);
  Tensor out(DType::I64, {n});
  auto d = out.mutable_data<int64_t>();
  for (int64_t i = 0; i < n; ++i) d[static_cast<size_t>(i)] = s[static_cast<size_t>(start + i)];
  ctx.set_output(0, std::move(out));
}

void run_size(OpContext& ctx) {
  Tensor out(DType::I64, {});
  out.mutable_data<int64_t>()[0] = static_cast<int64_t>(ctx.input(0).numel());
  ctx.set_output(0, std::move(out));
}

constexpr OpEntry kOps[] = {
    {"", "Cast", run_cast},           {"", "CastLike", run_cast_like},
    {"", "Reshape", run_reshape},     {"", "Flatten", run_flatten},
    {"", "Squeeze", run_squeeze},     {"", "Unsqueeze", run_unsqueeze},
    {"", "Identity", run_identity},   {"", "Dropout", run_dropout},
    {"", "Transpose", run_transpose}, {"", "Expand", run_expand},
    {"", "Shape", run_shape},         {"", "Size", run_size},
};

}  // namespace

std::span<const OpEntry> shape_ops() { return kOps; }

}  // namespace qforge::ops
