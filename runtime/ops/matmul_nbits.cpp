// com.microsoft MatMulNBits and qforge.internal Int4MatMul (see runtime/ops/matmul_nbits.h).
#include "runtime/ops/matmul_nbits.h"

#include <string>
#include <vector>

#include "ir/error.h"
#include "kernels/int4.h"
#include "kernels/int4_matmul.h"
#include "runtime/op_utils.h"

namespace qforge::ops {

namespace {

// Y[..., N] = A[..., K] . W through the W4A16 kernel; bias added in f32 after the product.
void int4_product(OpContext& ctx, const Int4Weight& w, const Tensor* bias) {
  const Tensor& a_in = ctx.input(0);
  const DType dt = float_dtype(ctx, 0);
  if (a_in.rank() == 0 || a_in.shape().back() != w.k) {
    ctx.fail_invalid("input A " + shape_to_string(a_in.shape()) + " does not end in K = " +
                     std::to_string(w.k));
  }
  const int64_t m = static_cast<int64_t>(a_in.numel()) / std::max<int64_t>(w.k, 1);
  Shape out_shape = a_in.shape();
  out_shape.back() = w.n;
  Tensor y(DType::F32, out_shape);
  auto py = y.mutable_data<float>();
  const Int4Weight view = w;
  if (w.k == 0) {
    std::fill(py.begin(), py.end(), 0.0f);
  } else if (dt == DType::F16) {
    int4_matmul_f16(a_in.data<uint16_t>(), m, view, py, Device::Cpu, ctx.threads());
  } else {
    const Tensor a = to_f32(a_in);
    int4_matmul(a.data<float>(), m, view, py, Device::Cpu, ctx.threads());
  }
  if (bias != nullptr) {
    if (bias->dtype() != dt) ctx.fail_dtype_of("bias", bias->dtype());
    if (static_cast<int64_t>(bias->numel()) != w.n) {
      ctx.fail_invalid("bias " + shape_to_string(bias->shape()) + " does not have N = " +
                       std::to_string(w.n) + " elements");
    }
    const std::vector<float> bv = bias->to_f32();
    for (int64_t i = 0; i < m; ++i)
      for (int64_t c = 0; c < w.n; ++c) py[static_cast<size_t>(i * w.n + c)] += bv[static_cast<size_t>(c)];
  }
  ctx.set_output(0, from_f32(y, dt));
}

int64_t positive_attr(OpContext& ctx, const char* name) {
  const int64_t v = ctx.attr_int(name, 0);
  if (v <= 0) ctx.fail_invalid(std::string("attribute ") + name + " must be > 0, got " + std::to_string(v));
  return v;
}

Int4Weight view_of(const Tensor& packed, const Tensor& scales, const Tensor* zeros, int64_t k,
                   int64_t n, int64_t block_size, bool round_f16) {
  Int4Weight w;
  w.packed = packed.data<uint8_t>();
  if (scales.dtype() == DType::F16) {
    w.scales_f16 = scales.data<uint16_t>();
  } else {
    w.scales_f32 = scales.data<float>();
  }
  if (zeros != nullptr && !zeros->empty()) w.zero_points = zeros->data<int8_t>();
  w.k = k;
  w.n = n;
  w.block_size = block_size;
  w.round_to_f16 = round_f16;
  return w;
}

}  // namespace

void run_matmul_nbits(OpContext& ctx) {
  const int64_t k = positive_attr(ctx, "K"), n = positive_attr(ctx, "N");
  const int64_t bits = ctx.attr_int("bits", 4);
  if (bits != 4) ctx.fail_unsupported("bits = " + std::to_string(bits) + " (only 4 is supported)");
  const int64_t bs = positive_attr(ctx, "block_size");
  if (ctx.has_input(4)) ctx.fail_unsupported("input g_idx is not supported");
  const RepackedNBits r = repack_matmulnbits(ctx.label(), ctx.input(1), ctx.input(2),
                                             ctx.has_input(3) ? &ctx.input(3) : nullptr, k, n, bs);
  if (ctx.input(2).dtype() != float_dtype(ctx, 0)) ctx.fail_dtype(2);
  int4_product(ctx, view_of(r.packed, r.scales, &r.zeros, k, n, bs, false),
               ctx.has_input(5) ? &ctx.input(5) : nullptr);
}

void run_int4_matmul(OpContext& ctx) {
  const Tensor& w = ctx.input(1);
  const Tensor& scales = ctx.input(2);
  if (w.rank() != 2 || (w.dtype() != DType::I4)) ctx.fail_dtype(1);
  if (scales.dtype() != DType::F16 && scales.dtype() != DType::F32) ctx.fail_dtype(2);
  const int64_t k = w.shape()[0], n = w.shape()[1];
  const int64_t bs = positive_attr(ctx, "block_size");
  const Tensor* zeros = ctx.has_input(3) ? &ctx.input(3) : nullptr;
  if (zeros != nullptr && zeros->dtype() != DType::I8) ctx.fail_dtype(3);
  const int64_t expect = int4_block_count(k, bs) * n;
  if (static_cast<int64_t>(scales.numel()) != expect ||
      (zeros != nullptr && static_cast<int64_t>(zeros->numel()) != expect)) {
    ctx.fail_invalid("scales / zero points do not hold [ceil(K / block_size), N] values");
  }
  int4_product(ctx, view_of(w, scales, zeros, k, n, bs, ctx.attr_int("round_f16", 0) != 0),
               ctx.has_input(4) ? &ctx.input(4) : nullptr);
}

RepackedNBits repack_matmulnbits(const std::string& what, const Tensor& b, const Tensor& scales,
                                 const Tensor* zero_points, int64_t k, int64_t n,
                                 int64_t block_size) {
  if (block_size < 2 || block_size % 2 != 0) {
    fail_invalid(what + ": block_size " + std::to_string(block_size) + " is not even");
  }
  const int64_t blocks = int4_block_count(k, block_size);
  const int64_t blob = block_size / 2;
  if (b.dtype() != DType::U8 || static_cast<int64_t>(b.numel()) != n * blocks * blob) {
    fail_invalid(what + ": B " + std::string(dtype_name(b.dtype())) + " " +
                 shape_to_string(b.shape()) + " is not uint8 [N, n_blocks, block_size / 2] = [" +
                 std::to_string(n) + ", " + std::to_string(blocks) + ", " + std::to_string(blob) +
                 "]");
  }
  if ((scales.dtype() != DType::F32 && scales.dtype() != DType::F16) ||
      static_cast<int64_t>(scales.numel()) != n * blocks) {
    fail_invalid(what + ": scales " + std::string(dtype_name(scales.dtype())) + " " +
                 shape_to_string(scales.shape()) + " do not hold N * n_blocks = " +
                 std::to_string(n * blocks) + " floats");
  }
  RepackedNBits r;
  r.packed = Tensor(DType::I4, {k, n});
  auto out = r.packed.mutable_data<uint8_t>();
  std::fill(out.begin(), out.end(), uint8_t{0});
  const auto in = b.data<uint8_t>();
  for (int64_t c = 0; c < n; ++c) {
    for (int64_t row = 0; row < k; ++row) {
      const int64_t j = row % block_size;
      const auto byte = in[static_cast<size_t>((c * blocks + row / block_size) * blob + j / 2)];
      // u - 8 as a two's complement nibble is u ^ 8.
      const auto q = static_cast<uint8_t>(((byte >> (4 * (j % 2))) & 0x0f) ^ 0x08);
      const int64_t e = row * n + c;
      out[static_cast<size_t>(e / 2)] |= static_cast<uint8_t>(q << (4 * (e % 2)));
    }
  }
  const std::vector<float> s = scales.to_f32();
  r.scales = Tensor(DType::F32, {blocks, n});
  auto so = r.scales.mutable_data<float>();
  for (int64_t c = 0; c < n; ++c)
    for (int64_t bl = 0; bl < blocks; ++bl)
      so[static_cast<size_t>(bl * n + c)] = s[static_cast<size_t>(c * blocks + bl)];
  if (zero_points != nullptr) {
    const int64_t zbytes = (blocks + 1) / 2;
    if (zero_points->dtype() != DType::U8) {
      fail_unsupported(what + ": zero points of dtype " +
                       std::string(dtype_name(zero_points->dtype())) +
                       " are not supported (only packed uint8)");
    }
    if (static_cast<int64_t>(zero_points->numel()) != n * zbytes) {
      fail_invalid(what + ": zero points " + shape_to_string(zero_points->shape()) +
                   " do not hold N * ceil(n_blocks / 2) = " + std::to_string(n * zbytes) + " bytes");
    }
    const auto zp = zero_points->data<uint8_t>();
    r.zeros = Tensor(DType::I8, {blocks, n});
    auto zo = r.zeros.mutable_data<int8_t>();
    bool any = false;
    for (int64_t c = 0; c < n; ++c) {
      for (int64_t bl = 0; bl < blocks; ++bl) {
        const int u = (zp[static_cast<size_t>(c * zbytes + bl / 2)] >> (4 * (bl % 2))) & 0x0f;
        zo[static_cast<size_t>(bl * n + c)] = static_cast<int8_t>(u - 8);
        any = any || u != 8;
      }
    }
    if (!any) r.zeros = Tensor();
  }
  return r;
}

}  // namespace qforge::ops
