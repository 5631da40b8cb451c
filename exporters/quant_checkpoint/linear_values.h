#pragma once
// What the GPTQ, AWQ and ModelOpt layouts share when they re-lay one quantized Linear
// (exporters/quant_checkpoint/hf_quant_writer.h, QuantizedLinearView): the signed integers read
// out of the i4/i8 tensor, and the scale converted to the fp16 or float32 those formats store.
//
// fp16 scales: the formats store fp16 whatever the model dtype, and the loader's dequantized
// weight is q * fp16(s). A scale fp16 holds exactly (every fp16 one; a bf16 one in fp16's normal
// range [2^-14, 65504], or below it on fp16's grid of 2^-24; a float32 one with at most 11
// significant bits) converts as it is, so the integers and the weight stay exactly the
// checkpoint's. Any other scale is refused, naming the module: re-emitting it would round the
// weight (a second rounding error the user did not ask for). qforge's own quantizers choose
// scales that fp16 holds for these layouts (quant/weights/linear_weight_quant.h fp16_scales).
#include <cstdint>
#include <string_view>

#include "exporters/quant_checkpoint/hf_quant_writer.h"

namespace qforge {

// The stored nibble (two's complement, 0..15) of element e of an i4 tensor's bytes: element e
// sits in byte e / 2, the low nibble first.
inline uint32_t int4_nibble(const uint8_t* bytes, int64_t e) {
  return (static_cast<uint32_t>(bytes[e / 2]) >> (4 * (e % 2))) & 0x0fu;
}

// q.scale ([N, G] or [N] per channel, any float dtype) as fp16 [G, N] (G = 1 per channel): the
// group-major layout GPTQ and AWQ store. Throws Unsupported naming q.module, `layout` and the
// scale when fp16 does not hold a scale exactly.
Tensor linear_scale_f16_group_major(const QuantizedLinearView& q, std::string_view layout);

// q.scale as float32 in its own shape (exact from f16, bf16 and f32).
Tensor linear_scale_f32(const QuantizedLinearView& q);

}  // namespace qforge
