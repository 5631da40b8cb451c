// Pools over any spatial rank: MaxPool (Indices output, storage_order, dilations, ceil_mode),
// AveragePool (count_include_pad, ceil_mode, dilations), GlobalAveragePool, GlobalMaxPool.
#include <limits>

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

// Runs the pool on x [N, C, spatial...] of type T; `indices` (may be null) gets MaxPool's
// flat argmax per output.
template <typename T>
void pool_kernel(const OpContext& ctx, const Window& w, const PoolParams& p, int64_t planes,
                 const T* x, T* y, int64_t* indices) {
  const size_t r = w.rank();
  const int64_t isize = w.in_size(), osize = w.out_size(), ksize = w.kernel_size();
  const auto istr = contiguous_strides(w.in);
  std::vector<int64_t> cstr(r, 1);  // column-major strides for storage_order = 1
  for (size_t j = 1; j < r; ++j) cstr[j] = cstr[j - 1] * w.in[j - 1];
  parallel_chunks(ctx.threads(), planes * osize, grain_for(ksize), [&](int64_t begin, int64_t end) {
    std::vector<int64_t> oidx(r), kidx(r);
    for (int64_t e = begin; e < end; ++e) {
      const int64_t plane = e / osize;
      int64_t rem = e % osize;
      for (size_t j = r; j-- > 0;) {
        oidx[j] = rem % w.out[j];
        rem /= w.out[j];
      }
      const T* xp = x + plane * isize;
      double sum = 0.0;
      T best = std::numeric_limits<T>::lowest();
      int64_t best_at = -1;
      int64_t count = 0;
      std::fill(kidx.begin(), kidx.end(), 0);
      for (int64_t k = 0; k < ksize; ++k) {
        int64_t off = 0, coff = 0;
        bool inside = true;
        for (size_t j = 0; j < r; ++j) {
          const int64_t i = oidx[j] * w.strides[j] - w.pad_begin[j] + kidx[j] * w.dilations[j];
          inside = inside && i >= 0 && i < w.in[j];
          off += i * istr[j];
          coff += i * cstr[j];
        }
        if (inside) {
          const T v = xp[off];
          if (p.kind == PoolKind::Max) {
            if (best_at < 0 || v > best) {
              best = v;
              best_at = p.column_major ? coff : off;
            }
          } else {
            sum += static_cast<double>(v);
            ++count;
          }
        }
        for (size_t j = r; j-- > 0;) {  // next kernel position
          if (++kidx[j] < w.kernel[j]) break;
          kidx[j] = 0;
        }
      }
      if (p.kind == PoolKind::Max) {
        y[e] = best_at < 0 ? T(0) : best;
        if (indices != nullptr) indices[e] = plane * isize + std::max<int64_t>(best_at, 0);
        continue;
      }
      if (p.count_include_pad) {  // positions inside the padded input, per dim
        count = 1;
        for (size_t j = 0; j < r; ++j) {
          int64_t c = 0;
          for (int64_t kk = 0; kk < w.kernel[j]; ++kk) {
            const int64_t i = oidx[j] * w.strides[j] - w.pad_begin[j] + kk * w.dilations[j];
            c += (i >= -w.pad_begin[j] && i < w.in[j] + w.pad_end[j]) ? 1 : 0;
          }
          count *= c;
        }
      }
      y[e] = count == 0 ? T(0) : static_cast<T>(sum / static_cast<double>(count));
    }
  });
}

void run_pool(OpContext& ctx, const PoolParams& p, bool global) {
  const Tensor& in = ctx.input(0);
  if (in.rank() < 3) ctx.fail_invalid("input " + shape_to_string(in.shape()) + " needs [N, C, spatial...]");
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
    Tensor y(x.dtype(), out_shape);
    pool_kernel<T>(ctx, w, p, planes, x.data<T>().data(), y.mutable_data<T>().data(), pidx);
    ctx.set_output(0, is_half(in.dtype()) ? from_f32(y, in.dtype()) : y);
  };
  const bool ok = p.kind == PoolKind::Max
                      ? visit_dtype(TypeList<float, double, int8_t, uint8_t>{}, x.dtype(), run_typed)
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
  run_pool(ctx, {.kind = PoolKind::Average,
                 .count_include_pad = ctx.attr_int("count_include_pad", 0) != 0}, false);
}
void run_global_average_pool(OpContext& ctx) {
  run_pool(ctx, {.kind = PoolKind::Average}, true);
}
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
