// Reductions: ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceProd, ReduceSumSquare,
// ReduceL1, ReduceL2, ReduceLogSum, ReduceLogSumExp. Axes are an attribute before opset 18
// (ReduceSum: 13) and an input from then on; keepdims and noop_with_empty_axes as ONNX says.
// Each output element is reduced sequentially in index order; float sums accumulate in double.
// CumSum (the running sum along one axis, exclusive and reverse as ONNX says) sums in the
// element type, as ONNX Runtime does, in index order (reverse: from the end).
#include <cmath>
#include <limits>

#include "runtime/op_registry.h"
#include "runtime/op_utils.h"

namespace qforge::ops {

namespace {

enum class Reduce { Sum, Mean, Max, Min, Prod, SumSquare, L1, L2, LogSum, LogSumExp };

template <typename A>
A identity(Reduce kind) {
  switch (kind) {
    case Reduce::Max:
      return std::numeric_limits<A>::has_infinity ? -std::numeric_limits<A>::infinity()
                                                  : std::numeric_limits<A>::lowest();
    case Reduce::Min:
      return std::numeric_limits<A>::has_infinity ? std::numeric_limits<A>::infinity()
                                                  : std::numeric_limits<A>::max();
    case Reduce::Prod:
      return A(1);
    default:
      return A(0);
  }
}

// T is the element type, A the accumulator (double for floats, T for integers).
template <typename T, typename A>
void reduce_kernel(const OpContext& ctx, Reduce kind, const Tensor& x,
                   const std::vector<bool>& reduced, T* out, int64_t out_count) {
  const auto istr = contiguous_strides(x.shape());
  std::vector<int64_t> kdims, kstr, rdims, rstr;
  for (size_t i = 0; i < x.rank(); ++i) {
    (reduced[i] ? rdims : kdims).push_back(x.shape()[i]);
    (reduced[i] ? rstr : kstr).push_back(istr[i]);
  }
  const int64_t rcount = dims_product(rdims, 0, rdims.size());
  const T* px = x.data<T>().data();
  // LogSumExp subtracts the max first, for range.
  parallel_chunks(ctx.threads(), out_count, grain_for(rcount), [&](int64_t begin, int64_t end) {
    std::vector<int64_t> ridx(rdims.size());
    for (int64_t o = begin; o < end; ++o) {
      int64_t rem = o, base = 0;
      for (size_t j = kdims.size(); j-- > 0;) {
        base += (rem % kdims[j]) * kstr[j];
        rem /= kdims[j];
      }
      A shift = 0;
      if (kind == Reduce::LogSumExp && rcount > 0) {
        shift = identity<A>(Reduce::Max);
        std::fill(ridx.begin(), ridx.end(), 0);
        for (int64_t r = 0; r < rcount; ++r) {
          int64_t off = base;
          for (size_t j = 0; j < rdims.size(); ++j) off += ridx[j] * rstr[j];
          shift = std::max(shift, static_cast<A>(px[off]));
          for (size_t j = rdims.size(); j-- > 0;) {
            if (++ridx[j] < rdims[j]) break;
            ridx[j] = 0;
          }
        }
        if (!std::isfinite(static_cast<double>(shift))) shift = 0;
      }
      A acc = identity<A>(kind);
      std::fill(ridx.begin(), ridx.end(), 0);
      for (int64_t r = 0; r < rcount; ++r) {
        int64_t off = base;
        for (size_t j = 0; j < rdims.size(); ++j) off += ridx[j] * rstr[j];
        const A v = static_cast<A>(+px[off]);  // + promotes int8 by value
        switch (kind) {
          case Reduce::Sum:
          case Reduce::Mean:
          case Reduce::LogSum:
            acc += v;
            break;
          case Reduce::Max:
            acc = std::max(acc, v);
            break;
          case Reduce::Min:
            acc = std::min(acc, v);
            break;
          case Reduce::Prod:
            acc *= v;
            break;
          case Reduce::SumSquare:
          case Reduce::L2:
            acc += v * v;
            break;
          case Reduce::L1:
            acc += v < 0 ? -v : v;
            break;
          case Reduce::LogSumExp:
            acc += static_cast<A>(std::exp(static_cast<double>(v - shift)));
            break;
        }
        for (size_t j = rdims.size(); j-- > 0;) {
          if (++ridx[j] < rdims[j]) break;
          ridx[j] = 0;
        }
      }
      switch (kind) {
        case Reduce::Mean:
          acc = rcount == 0 ? static_cast<A>(NAN) : acc / static_cast<A>(rcount);
          break;
        case Reduce::L2:
          acc = static_cast<A>(std::sqrt(static_cast<double>(acc)));
          break;
        case Reduce::LogSum:
          acc = static_cast<A>(std::log(static_cast<double>(acc)));
          break;
        case Reduce::LogSumExp:
          acc = static_cast<A>(std::log(static_cast<double>(acc))) + shift;
          break;
        default:
          break;
      }
      out[o] = static_cast<T>(acc);
    }
  });
}

void run_reduce(OpContext& ctx, Reduce kind, int64_t axes_input_opset) {
  const Tensor& in = ctx.input(0);
  const auto rank = static_cast<int64_t>(in.rank());
  std::vector<int64_t> axes;
  if (ctx.opset() < axes_input_opset) {
    axes = ctx.attr_ints("axes").value_or(std::vector<int64_t>{});
  } else if (ctx.has_input(1)) {
    axes = read_int_values(ctx, ctx.input(1), "axes input");
  }
  const bool keepdims = ctx.attr_int("keepdims", 1) != 0;
  if (axes.empty() && ctx.attr_int("noop_with_empty_axes", 0) != 0) {
    ctx.set_output(0, in);
    return;
  }
  std::vector<bool> reduced(in.rank(), axes.empty());
  for (int64_t a : normalize_axes(ctx, axes, rank, "axes")) reduced[static_cast<size_t>(a)] = true;
  Shape os;
  for (size_t i = 0; i < in.rank(); ++i) {
    if (!reduced[i])
      os.push_back(in.shape()[i]);
    else if (keepdims)
      os.push_back(1);
  }
  // bool Max/Min are u8 Max/Min (any/all).
  const bool as_bool = in.dtype() == DType::Bool && (kind == Reduce::Max || kind == Reduce::Min);
  const Tensor x = is_half(in.dtype()) ? to_f32(in)
                   : as_bool           ? Tensor(DType::U8, in.shape(), in.storage(), in.offset())
                                       : in;
  Tensor out(x.dtype(), os);
  const auto count = static_cast<int64_t>(out.numel());
  const bool ok_float = visit_dtype(FloatTypes{}, x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    reduce_kernel<T, double>(ctx, kind, x, reduced, out.mutable_data<T>().data(), count);
  });
  bool ok = ok_float;
  if (!ok && kind != Reduce::LogSum && kind != Reduce::LogSumExp && kind != Reduce::L2) {
    const bool minmax = kind == Reduce::Max || kind == Reduce::Min;
    auto run_int = [&](auto tag) {
      using T = typename decltype(tag)::type;
      reduce_kernel<T, int64_t>(ctx, kind, x, reduced, out.mutable_data<T>().data(), count);
    };
    ok = minmax ? visit_dtype(IntTypes{}, x.dtype(), run_int)
                : visit_dtype(TypeList<int64_t, int32_t>{}, x.dtype(), run_int);
  }
  if (!ok) ctx.fail_dtype(0);
  if (as_bool) out = Tensor(DType::Bool, out.shape(), out.storage(), 0);
  ctx.set_output(0, is_half(in.dtype()) ? from_f32(out, in.dtype()) : out);
}

void run_sum(OpContext& ctx) { run_reduce(ctx, Reduce::Sum, 13); }
void run_mean(OpContext& ctx) { run_reduce(ctx, Reduce::Mean, 18); }
void run_max(OpContext& ctx) { run_reduce(ctx, Reduce::Max, 18); }
void run_min(OpContext& ctx) { run_reduce(ctx, Reduce::Min, 18); }
void run_prod(OpContext& ctx) { run_reduce(ctx, Reduce::Prod, 18); }
void run_sum_square(OpContext& ctx) { run_reduce(ctx, Reduce::SumSquare, 18); }
void run_l1(OpContext& ctx) { run_reduce(ctx, Reduce::L1, 18); }
void run_l2(OpContext& ctx) { run_reduce(ctx, Reduce::L2, 18); }
void run_log_sum(OpContext& ctx) { run_reduce(ctx, Reduce::LogSum, 18); }
void run_log_sum_exp(OpContext& ctx) { run_reduce(ctx, Reduce::LogSumExp, 18); }

// CumSum(x, axis): y[.., i, ..] = sum of x[.., j, ..] for j <= i (exclusive: j < i; reverse:
// j >= i, or j > i when both). f16/bf16 are summed in f32 and rounded once.
template <typename T>
void cumsum_kernel(const OpContext& ctx, const T* x, T* y, int64_t outer, int64_t n, int64_t inner,
                   bool exclusive, bool reverse) {
  parallel_chunks(ctx.threads(), outer * inner, grain_for(n * 2), [&](int64_t begin, int64_t end) {
    for (int64_t line = begin; line < end; ++line) {
      const int64_t o = line / inner, in = line % inner;
      const T* px = x + o * n * inner + in;
      T* py = y + o * n * inner + in;
      T acc = T(0);
      for (int64_t step = 0; step < n; ++step) {
        const int64_t k = reverse ? n - 1 - step : step;
        if (exclusive) {
          py[k * inner] = acc;
          acc += px[k * inner];
        } else {
          acc += px[k * inner];
          py[k * inner] = acc;
        }
      }
    }
  });
}

void run_cumsum(OpContext& ctx) {
  const Tensor& in = ctx.input(0);
  const std::vector<int64_t> axis_values = read_int_values(ctx, ctx.input(1), "axis input");
  if (axis_values.size() != 1 || ctx.input(1).rank() > 1) {
    ctx.fail_invalid("axis input must hold one value, got shape " +
                     shape_to_string(ctx.input(1).shape()));
  }
  const auto rank = static_cast<int64_t>(in.rank());
  if (rank == 0) ctx.fail_invalid("CumSum needs an input of rank 1 or more");
  const int64_t axis = normalize_axis(ctx, axis_values[0], rank, "axis");
  const auto a = static_cast<size_t>(axis);
  const int64_t outer = dims_product(in.shape(), 0, a);
  const int64_t n = in.shape()[a];
  const int64_t inner = dims_product(in.shape(), a + 1, in.rank());
  const bool exclusive = ctx.attr_int("exclusive", 0) != 0;
  const bool reverse = ctx.attr_int("reverse", 0) != 0;
  const Tensor x = is_half(in.dtype()) ? to_f32(in) : in;
  Tensor out(x.dtype(), x.shape());
  const bool ok =
      visit_dtype(TypeList<float, double, int64_t, int32_t>{}, x.dtype(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        cumsum_kernel<T>(ctx, x.data<T>().data(), out.mutable_data<T>().data(), outer, n, inner,
                         exclusive, reverse);
      });
  if (!ok) ctx.fail_dtype(0);
  ctx.set_output(0, is_half(in.dtype()) ? from_f32(out, in.dtype()) : out);
}

constexpr OpEntry kOps[] = {
    {"", "CumSum", run_cumsum},
    {"", "ReduceSum", run_sum},        {"", "ReduceMean", run_mean},
    {"", "ReduceMax", run_max},        {"", "ReduceMin", run_min},
    {"", "ReduceProd", run_prod},      {"", "ReduceSumSquare", run_sum_square},
    {"", "ReduceL1", run_l1},          {"", "ReduceL2", run_l2},
    {"", "ReduceLogSum", run_log_sum}, {"", "ReduceLogSumExp", run_log_sum_exp},
};

}  // namespace

std::span<const OpEntry> reduce_ops() { return kOps; }

}  // namespace qforge::ops
