#include "exporters/quant_checkpoint/linear_values.h"

#include <cmath>

#include "ir/error.h"
#include "ir/half.h"

namespace qforge {

Tensor linear_scale_f32(const QuantizedLinearView& q) {
  const std::vector<float> s = q.scale.to_f32();
  return Tensor::from_f32(s, q.scale.shape(), DType::F32);
}

Tensor linear_scale_f16_group_major(const QuantizedLinearView& q, std::string_view layout) {
  const int64_t n = q.values.shape()[0];
  const int64_t groups = q.block_size > 0 ? q.scale.shape()[1] : 1;
  if (q.scale.numel() != static_cast<uint64_t>(n * groups)) {
    fail_internal("scale of '" + q.module + "' is " + shape_to_string(q.scale.shape()) +
                  " for " + std::to_string(n) + " rows");
  }
  const std::vector<float> s = q.scale.to_f32();
  Tensor out(DType::F16, {groups, n});
  auto dst = out.mutable_data<uint16_t>();
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const float v = s[static_cast<size_t>(r * groups + g)];
      const uint16_t h = f32_to_f16(v);
      if (f16_to_f32(h) != v) {
        const bool over = std::isfinite(v) && std::abs(v) > 65504.0f;
        fail_unsupported(
            std::string(layout) + " stores fp16 scales, and '" + q.module + "' has a " +
            std::string(dtype_name(q.scale.dtype())) + " scale of " + std::to_string(v) +
            " (row " + std::to_string(r) + ", group " + std::to_string(g) + ")" +
            (over ? ", over fp16's 65504" : " that fp16 does not hold exactly") +
            "; write --format compressed-tensors, which keeps the checkpoint's scales, or give "
            "--quant with --requantize to dequantize and quantize again with fp16 scales");
      }
      dst[static_cast<size_t>(g * n + r)] = h;
    }
  }
  return out;
}

}  // namespace qforge
