// Ops that assemble or pick tensors: Concat, Split, Slice, Gather, Constant,
// ConstantOfShape, Range. Elements move by size, so any byte-sized dtype works.
#include <cmath>

#include "runtime/op_registry.h"
#include "runtime/op_utils.h"

namespace qforge::ops {

namespace {

// Copies `rows` blocks of `block` bytes from src (stride src_stride) to dst (stride dst_stride).
void copy_blocks(const OpContext& ctx, const std::byte* src, int64_t src_stride, std::byte* dst,
                 int64_t dst_stride, int64_t rows, int64_t block) {
  parallel_chunks(ctx.threads(), rows, grain_for(block / 4 + 1), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      std::memcpy(dst + r * dst_stride, src + r * src_stride, static_cast<size_t>(block));
    }
  });
}

void run_concat(OpContext& ctx) {
  if (ctx.num_inputs() == 0) ctx.fail_invalid("needs at least one input");
  const Tensor& first = ctx.input(0);
  const auto rank = static_cast<int64_t>(first.rank());
  if (!ctx.attr("axis")) ctx.fail_invalid("attribute 'axis' is required");
  const auto axis = static_cast<size_t>(normalize_axis(ctx, ctx.attr_int("axis", 0), rank, "axis"));
  Shape os = first.shape();
  os[axis] = 0;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    const Tensor& t = ctx.input(i);
    if (t.dtype() != first.dtype()) ctx.fail_dtype(i);
    bool ok = t.rank() == first.rank();
    for (size_t d = 0; ok && d < t.rank(); ++d) ok = d == axis || t.shape()[d] == first.shape()[d];
    if (!ok) {
      ctx.fail_invalid("input " + std::to_string(i) + " " + shape_to_string(t.shape()) +
                       " does not match input 0 " + shape_to_string(first.shape()) +
                       " outside axis " + std::to_string(axis));
    }
    os[axis] += t.shape()[axis];
  }
  const auto esize = static_cast<int64_t>(element_size(ctx, first.dtype(), "input 0"));
  Tensor out(first.dtype(), os);
  const int64_t outer = dims_product(os, 0, axis);
  const int64_t inner = dims_product(os, axis + 1, os.size()) * esize;
  const int64_t out_row = os[axis] * inner;
  int64_t at = 0;
  std::byte* po = out.mutable_bytes().data();
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    const Tensor& t = ctx.input(i);
    const int64_t block = t.shape()[axis] * inner;
    if (block > 0) copy_blocks(ctx, t.bytes().data(), block, po + at, out_row, outer, block);
    at += block;
  }
  ctx.set_output(0, std::move(out));
}

void run_split(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  const auto rank = static_cast<int64_t>(x.rank());
  const auto axis = static_cast<size_t>(normalize_axis(ctx, ctx.attr_int("axis", 0), rank, "axis"));
  const int64_t dim = x.shape()[axis];
  const size_t parts = ctx.outputs.size();
  std::vector<int64_t> sizes;
  if (ctx.opset() < 13) {
    sizes = ctx.attr_ints("split").value_or(std::vector<int64_t>{});
  } else if (ctx.has_input(1)) {
    sizes = read_int_values(ctx, ctx.input(1), "split input");
  }
  if (sizes.empty()) {
    const int64_t n = ctx.opset() >= 18 && ctx.attr("num_outputs") ? ctx.attr_int("num_outputs", 1)
                                                                   : static_cast<int64_t>(parts);
    if (n < 1 || static_cast<size_t>(n) != parts) {
      ctx.fail_invalid("num_outputs " + std::to_string(n) + " differs from the node's " +
                       std::to_string(parts) + " outputs");
    }
    // Equal parts; from opset 18 the last may be smaller.
    const int64_t chunk = ctx.opset() >= 18 ? (dim + n - 1) / n : dim / n;
    if (ctx.opset() < 18 && dim % n != 0) {
      ctx.fail_invalid("dim " + std::to_string(dim) + " does not split into " + std::to_string(n) +
                       " equal parts");
    }
    for (int64_t i = 0; i < n; ++i)
      sizes.push_back(std::min(chunk, std::max<int64_t>(0, dim - i * chunk)));
  }
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  if (sizes.size() != parts || total != dim) {
    ctx.fail_invalid("split sizes " + shape_to_string(sizes) + " do not cover dim " +
                     std::to_string(dim) + " over " + std::to_string(parts) + " outputs");
  }
  const auto esize = static_cast<int64_t>(element_size(ctx, x.dtype(), "input 0"));
  const int64_t outer = dims_product(x.shape(), 0, axis);
  const int64_t inner = dims_product(x.shape(), axis + 1, x.rank()) * esize;
  int64_t at = 0;
  for (size_t i = 0; i < parts; ++i) {
    Shape os = x.shape();
    os[axis] = sizes[i];
    if (ctx.wants_output(i)) {
      Tensor out(x.dtype(), os);
      const int64_t block = sizes[i] * inner;
      if (block > 0) {
        copy_blocks(ctx, x.bytes().data() + at, dim * inner, out.mutable_bytes().data(), block,
                    outer, block);
      }
      ctx.set_output(i, std::move(out));
    }
    at += sizes[i] * inner;
  }
}

template <typename E>
void slice_kernel(const OpContext& ctx, const Tensor& x, const std::vector<int64_t>& start,
                  const std::vector<int64_t>& step, Tensor& out) {
  const size_t r = x.rank();
  const auto istr = contiguous_strides(x.shape());
  const Shape& os = out.shape();
  const E* px = x.data<E>().data();
  E* po = out.mutable_data<E>().data();
  const int64_t last = r == 0 ? 1 : os.back();
  const int64_t rows = last == 0 ? 0 : static_cast<int64_t>(out.numel()) / last;
  parallel_chunks(ctx.threads(), rows, grain_for(last), [&](int64_t b, int64_t e) {
    for (int64_t row = b; row < e; ++row) {
      int64_t rem = row, off = 0;
      for (size_t j = r - (r > 0 ? 1 : 0); j-- > 0;) {
        off += (start[j] + (rem % os[j]) * step[j]) * istr[j];
        rem /= os[j];
      }
      if (r > 0) off += start[r - 1];
      const int64_t s = r == 0 ? 0 : step[r - 1];
      for (int64_t i = 0; i < last; ++i) po[row * last + i] = px[off + i * s];
    }
  });
}

void run_slice(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  const auto rank = static_cast<int64_t>(x.rank());
  std::vector<int64_t> starts, ends, axes, steps;
  if (ctx.opset() < 10) {
    starts = ctx.attr_ints("starts").value_or(std::vector<int64_t>{});
    ends = ctx.attr_ints("ends").value_or(std::vector<int64_t>{});
    axes = ctx.attr_ints("axes").value_or(std::vector<int64_t>{});
  } else {
    starts = read_int_values(ctx, ctx.input(1), "starts");
    ends = read_int_values(ctx, ctx.input(2), "ends");
    if (ctx.has_input(3)) axes = read_int_values(ctx, ctx.input(3), "axes");
    if (ctx.has_input(4)) steps = read_int_values(ctx, ctx.input(4), "steps");
  }
  if (axes.empty()) {
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
  }
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (ends.size() != starts.size() || axes.size() != starts.size() ||
      steps.size() != starts.size()) {
    ctx.fail_invalid("starts, ends, axes and steps differ in length");
  }
  std::vector<int64_t> start(x.rank(), 0), step(x.rank(), 1);
  Shape os = x.shape();
  const auto norm_axes = normalize_axes(ctx, axes, rank, "axes");
  for (size_t i = 0; i < starts.size(); ++i) {
    const auto a = static_cast<size_t>(norm_axes[i]);
    const int64_t dim = x.shape()[a], st = steps[i];
    if (st == 0) ctx.fail_invalid("steps must not be 0");
    int64_t s = starts[i] < 0 ? starts[i] + dim : starts[i];
    int64_t e = ends[i] < 0 ? ends[i] + dim : ends[i];
    if (st > 0) {
      s = std::clamp<int64_t>(s, 0, dim);
      e = std::clamp<int64_t>(e, 0, dim);
      os[a] = e > s ? (e - s + st - 1) / st : 0;
    } else {
      s = std::clamp<int64_t>(s, 0, dim - 1);
      e = std::clamp<int64_t>(e, -1, dim - 1);
      os[a] = s > e ? (s - e + (-st) - 1) / (-st) : 0;
    }
    start[a] = s;
    step[a] = st;
  }
  Tensor out(x.dtype(), os);
  switch (element_size(ctx, x.dtype(), "input 0")) {
    case 1:
      slice_kernel<uint8_t>(ctx, x, start, step, out);
      break;
    case 2:
      slice_kernel<uint16_t>(ctx, x, start, step, out);
      break;
    case 4:
      slice_kernel<uint32_t>(ctx, x, start, step, out);
      break;
    default:
      slice_kernel<uint64_t>(ctx, x, start, step, out);
      break;
  }
  ctx.set_output(0, std::move(out));
}

void run_gather(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& idx_t = ctx.input(1);
  const auto rank = static_cast<int64_t>(x.rank());
  if (rank == 0) ctx.fail_invalid("data must have rank >= 1");
  const auto axis = static_cast<size_t>(normalize_axis(ctx, ctx.attr_int("axis", 0), rank, "axis"));
  const std::vector<int64_t> idx = read_int_values(ctx, idx_t, "indices");
  const int64_t dim = x.shape()[axis];
  Shape os(x.shape().begin(), x.shape().begin() + static_cast<std::ptrdiff_t>(axis));
  os.insert(os.end(), idx_t.shape().begin(), idx_t.shape().end());
  os.insert(os.end(), x.shape().begin() + static_cast<std::ptrdiff_t>(axis) + 1, x.shape().end());
  const auto esize = static_cast<int64_t>(element_size(ctx, x.dtype(), "input 0"));
  const int64_t outer = dims_product(x.shape(), 0, axis);
  const int64_t inner = dims_product(x.shape(), axis + 1, x.rank()) * esize;
  const auto n = static_cast<int64_t>(idx.size());
  for (int64_t v : idx) {
    if (v < -dim || v >= dim) {
      ctx.fail_invalid("index " + std::to_string(v) + " is out of range for dim " +
                       std::to_string(axis) + " of size " + std::to_string(dim));
    }
  }
  Tensor out(x.dtype(), os);
  const std::byte* px = x.bytes().data();
  std::byte* po = out.mutable_bytes().data();
  parallel_chunks(ctx.threads(), outer * n, grain_for(inner / 4 + 1), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t o = r / n;
      int64_t v = idx[static_cast<size_t>(r % n)];
      if (v < 0) v += dim;
      std::memcpy(po + r * inner, px + (o * dim + v) * inner, static_cast<size_t>(inner));
    }
  });
  ctx.set_output(0, std::move(out));
}

void run_constant(OpContext& ctx) {
  if (const Tensor* t = ctx.attr_tensor("value")) {
    ctx.set_output(0, *t);
  } else if (ctx.attr("value_float")) {
    const float v = ctx.attr_float("value_float", 0.0f);
    ctx.set_output(0, Tensor::from_f32({&v, 1}, {}));
  } else if (auto fs = ctx.attr_floats("value_floats")) {
    ctx.set_output(0, Tensor::from_f32(*fs, {static_cast<int64_t>(fs->size())}));
  } else if (ctx.attr("value_int")) {
    Tensor t(DType::I64, {});
    t.mutable_data<int64_t>()[0] = ctx.attr_int("value_int", 0);
    ctx.set_output(0, std::move(t));
  } else if (auto is = ctx.attr_ints("value_ints")) {
    Tensor t(DType::I64, {static_cast<int64_t>(is->size())});
    std::copy(is->begin(), is->end(), t.mutable_data<int64_t>().begin());
    ctx.set_output(0, std::move(t));
  } else {
    ctx.fail_unsupported("only value, value_float(s) and value_int(s) constants are supported");
  }
}

void run_constant_of_shape(OpContext& ctx) {
  const Shape shape = read_int_values(ctx, ctx.input(0), "shape input");
  const Tensor* value = ctx.attr_tensor("value");
  if (value && value->numel() != 1) ctx.fail_invalid("attribute 'value' must hold one element");
  const DType dt = value ? value->dtype() : DType::F32;
  Tensor out(dt, shape);
  if (value) {
    const auto esize = element_size(ctx, dt, "attribute 'value'");
    const std::byte* v = value->bytes().data();
    std::byte* po = out.mutable_bytes().data();
    for (uint64_t i = 0; i < out.numel(); ++i) std::memcpy(po + i * esize, v, esize);
  }
  ctx.set_output(0, std::move(out));
}

void run_range(OpContext& ctx) {
  const DType dt = ctx.input(0).dtype();
  for (size_t i = 0; i < 3; ++i) {
    if (ctx.input(i).dtype() != dt) ctx.fail_dtype(i);
    if (ctx.input(i).numel() != 1) ctx.fail_invalid("start, limit and delta must be scalars");
  }
  if (is_half(dt)) {  // computed in f32, rounded once
    const Tensor a = to_f32(ctx.input(0)), b = to_f32(ctx.input(1)), c = to_f32(ctx.input(2));
    OpContext f32 = ctx.derived();
    f32.inputs = {&a, &b, &c};
    f32.outputs.resize(1);
    run_range(f32);
    ctx.set_output(0, from_f32(f32.outputs[0], dt));
    return;
  }
  const Tensor& s = ctx.input(0);
  const bool ok =
      visit_dtype(TypeList<float, double, int64_t, int32_t, int16_t>{}, s.dtype(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        const T start = s.data<T>()[0], limit = ctx.input(1).data<T>()[0];
        const T delta = ctx.input(2).data<T>()[0];
        if (delta == T(0)) ctx.fail_invalid("delta must not be 0");
        int64_t n;
        if constexpr (std::is_floating_point_v<T>) {
          n = static_cast<int64_t>(std::ceil((static_cast<double>(limit) - start) / delta));
        } else {
          const int64_t span = static_cast<int64_t>(limit) - start;
          n = span / delta + ((span % delta != 0 && ((span > 0) == (delta > 0))) ? 1 : 0);
        }
        n = std::max<int64_t>(n, 0);
        Tensor out(s.dtype(), {n});
        auto d = out.mutable_data<T>();
        for (int64_t i = 0; i < n; ++i)
          d[static_cast<size_t>(i)] = static_cast<T>(start + i * delta);
        ctx.set_output(0, std::move(out));
      });
  if (!ok) ctx.fail_dtype(0);
}

constexpr OpEntry kOps[] = {
    {"", "Concat", run_concat},     {"", "Split", run_split},
    {"", "Slice", run_slice},       {"", "Gather", run_gather},
    {"", "Constant", run_constant}, {"", "ConstantOfShape", run_constant_of_shape},
    {"", "Range", run_range},
};

}  // namespace

std::span<const OpEntry> tensor_ops() { return kOps; }

}  // namespace qforge::ops
