// QuantizeLinear and DequantizeLinear: int8/uint8/int16 and packed int4/uint4 (low nibble
// first), per-tensor, per-axis and blocked (opset 21 block_size) scales; quantization rounds
// half to even and saturates. int32 dequantization covers quantized biases.
#include <cmath>

#include "runtime/op_registry.h"
#include "runtime/op_utils.h"

namespace qforge::ops {

namespace {

struct QRange {
  int32_t lo, hi;
};

std::optional<QRange> quant_range(DType d) {
  switch (d) {
    case DType::I8:
      return QRange{-128, 127};
    case DType::U8:
      return QRange{0, 255};
    case DType::I16:
      return QRange{-32768, 32767};
    case DType::I4:
      return QRange{-8, 7};
    case DType::U4:
      return QRange{0, 15};
    default:
      return std::nullopt;
  }
}

// Maps each element of x to its scale/zero-point index: per-tensor, per-axis or blocked.
struct ParamIndex {
  int64_t mode = 0;  // 0 per-tensor, 1 per-axis, 2 blocked
  int64_t dim = 1, inner = 1, block = 0, blocks = 1;
  int64_t operator()(int64_t e) const {
    if (mode == 0) return 0;
    const int64_t d = (e / inner) % dim;
    if (mode == 1) return d;
    const int64_t o = e / (inner * dim);
    return (o * blocks + d / block) * inner + e % inner;
  }
};

ParamIndex param_index(const OpContext& ctx, const Tensor& x, const Tensor& scale) {
  ParamIndex p;
  const int64_t block = ctx.opset() >= 21 ? ctx.attr_int("block_size", 0) : 0;
  if (block < 0) ctx.fail_invalid("block_size must be >= 0");
  if (block == 0 && scale.numel() == 1 && scale.rank() <= 1) return p;
  const auto rank = static_cast<int64_t>(x.rank());
  const auto axis = static_cast<size_t>(normalize_axis(ctx, ctx.attr_int("axis", 1), rank, "axis"));
  p.dim = x.shape()[axis];
  p.inner = dims_product(x.shape(), axis + 1, x.rank());
  if (block == 0) {
    if (scale.rank() != 1 || scale.shape()[0] != p.dim) {
      ctx.fail_invalid("per-axis scale " + shape_to_string(scale.shape()) + " needs " +
                       std::to_string(p.dim) + " values for axis " + std::to_string(axis) + " of " +
                       shape_to_string(x.shape()));
    }
    p.mode = 1;
    return p;
  }
  p.mode = 2;
  p.block = block;
  p.blocks = (p.dim + block - 1) / block;
  Shape expect = x.shape();
  expect[axis] = p.blocks;
  if (scale.shape() != expect) {
    ctx.fail_invalid("blocked scale " + shape_to_string(scale.shape()) + " must be " +
                     shape_to_string(expect) + " for block_size " + std::to_string(block));
  }
  return p;
}

// Zero points as int32 (absent: zeros), checked to match the scale's shape.
std::vector<int32_t> zero_points(const OpContext& ctx, size_t i, const Tensor& scale) {
  // NOLINTNEXTLINE(modernize-return-braced-init-list): a count and a value, not a list
  if (!ctx.has_input(i)) return std::vector<int32_t>(scale.numel(), 0);
  const Tensor& zp = ctx.input(i);
  if (zp.shape() != scale.shape() && !(zp.numel() == 1 && scale.numel() == 1)) {
    ctx.fail_invalid("zero point " + shape_to_string(zp.shape()) + " and scale " +
                     shape_to_string(scale.shape()) + " differ in shape");
  }
  std::vector<int32_t> out;
  out.reserve(zp.numel());
  if (zp.dtype() == DType::I32) {
    for (int32_t v : zp.data<int32_t>()) out.push_back(v);
  } else {
    for (float v : zp.to_f32()) out.push_back(static_cast<int32_t>(v));
  }
  return out;
}

void run_quantize(OpContext& ctx) {
  const Tensor x = f32_input(ctx, 0);
  const Tensor& scale_t = ctx.input(1);
  if (!dtype_is_float(scale_t.dtype())) ctx.fail_dtype(1);
  DType out_dt = DType::U8;
  if (ctx.has_input(2)) {
    out_dt = ctx.input(2).dtype();
  } else if (const int64_t od = ctx.attr_int("output_dtype", 0); od != 0) {
    const auto d = dtype_from_onnx(static_cast<int>(od));
    if (!d) ctx.fail_unsupported("output_dtype " + std::to_string(od) + " is not supported");
    out_dt = *d;
  }
  const auto range = quant_range(out_dt);
  if (!range) ctx.fail_dtype_of("the quantized type", out_dt);
  const ParamIndex pidx = param_index(ctx, x, scale_t);
  const std::vector<float> scale = scale_t.to_f32();
  const std::vector<int32_t> zp = zero_points(ctx, 2, scale_t);
  const auto n = static_cast<int64_t>(x.numel());
  const float* px = x.data<float>().data();
  std::vector<int32_t> q(static_cast<size_t>(n));
  parallel_chunks(ctx.threads(), n, grain_for(4), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const auto p = static_cast<size_t>(pidx(i));
      float v = std::nearbyint(px[i] / scale[p]);  // half to even (default rounding mode)
      if (std::isnan(v)) v = 0.0f;
      const double shifted = static_cast<double>(v) + zp[p];
      q[static_cast<size_t>(i)] = static_cast<int32_t>(
          std::clamp(shifted, static_cast<double>(range->lo), static_cast<double>(range->hi)));
    }
  });
  Tensor out(out_dt, x.shape());
  auto bytes = out.mutable_bytes();
  if (out_dt == DType::I4 || out_dt == DType::U4) {
    for (int64_t i = 0; i < n; ++i) {
      const auto nib = static_cast<uint8_t>(q[static_cast<size_t>(i)] & 0x0f);
      auto& byte = reinterpret_cast<uint8_t&>(bytes[static_cast<size_t>(i / 2)]);
      byte = static_cast<uint8_t>(i % 2 == 0 ? (byte & 0xf0) | nib : (byte & 0x0f) | (nib << 4));
    }
  } else if (out_dt == DType::I16) {
    auto d = out.mutable_data<int16_t>();
    for (int64_t i = 0; i < n; ++i)
      d[static_cast<size_t>(i)] = static_cast<int16_t>(q[static_cast<size_t>(i)]);
  } else {
    for (int64_t i = 0; i < n; ++i)
      bytes[static_cast<size_t>(i)] = static_cast<std::byte>(q[static_cast<size_t>(i)] & 0xff);
  }
  ctx.set_output(0, std::move(out));
}

void run_dequantize(OpContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& scale_t = ctx.input(1);
  if (!dtype_is_float(scale_t.dtype()) || scale_t.dtype() == DType::F64) ctx.fail_dtype(1);
  if (!quant_range(x.dtype()) && x.dtype() != DType::I32) ctx.fail_dtype(0);
  if (ctx.has_input(2) && ctx.input(2).dtype() != x.dtype()) ctx.fail_dtype(2);
  DType out_dt = scale_t.dtype();
  if (const int64_t od = ctx.attr_int("output_dtype", 0); od != 0) {
    const auto d = dtype_from_onnx(static_cast<int>(od));
    if (!d || (*d != DType::F32 && !is_half(*d))) {
      ctx.fail_unsupported("output_dtype " + std::to_string(od) + " is not supported");
    }
    out_dt = *d;
  }
  const ParamIndex pidx = param_index(ctx, x, scale_t);
  const std::vector<float> scale = scale_t.to_f32();
  const std::vector<int32_t> zp = zero_points(ctx, 2, scale_t);
  // i32 values do not fit f32 exactly; read them directly, the rest through to_f32.
  std::vector<float> xs;
  std::vector<int32_t> xi;
  if (x.dtype() == DType::I32) {
    const auto d = x.data<int32_t>();
    xi.assign(d.begin(), d.end());
  } else {
    xs = x.to_f32();
  }
  const auto n = static_cast<int64_t>(x.numel());
  Tensor y(DType::F32, x.shape());
  float* py = y.mutable_data<float>().data();
  parallel_chunks(ctx.threads(), n, grain_for(4), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const auto p = static_cast<size_t>(pidx(i));
      const auto k = static_cast<size_t>(i);
      const int64_t v = xi.empty() ? static_cast<int64_t>(xs[k]) : xi[k];
      py[i] = static_cast<float>(v - zp[p]) * scale[p];
    }
  });
  ctx.set_output(0, from_f32(y, out_dt));
}

constexpr OpEntry kOps[] = {
    {"", "QuantizeLinear", run_quantize},
    {"", "DequantizeLinear", run_dequantize},
};

}  // namespace

std::span<const OpEntry> quantize_ops() { return kOps; }

}  // namespace qforge::ops
