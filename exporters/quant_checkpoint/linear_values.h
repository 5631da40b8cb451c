#pragma once
// What the GPTQ, AWQ and ModelOpt layouts share when they re-lay one quantized Linear
// (exporters/quant_checkpoint/hf_quant_writer.h, QuantizedLinearView): the signed integers read
// out of the i4/i8 tensor, and the scale converted to the fp16 or float32 those formats store.
//
// fp16 scales: the formats store fp16 whatever the model dtype, so a bf16 or float32 scale s is
// rounded to nearest even, and the loader's dequantized weight is q * fp16(s) with the same
// integers q. A bf16 scale in fp16's normal range [2^-14, 65504] converts exactly (bf16 has fewer
// mantissa bits); below 2^-14 (a group whose largest weight is under about 4e-4) fp16 keeps fewer
// bits and the weight moves by at most 8 * 2^-25 (2.4e-7) absolute; a float32 scale rounds at
// 2^-11 relative. A scale over fp16's range (65504) is refused, naming the module.
#include <cstdint>
#include <string_view>
#include <vector>

#include "exporters/quant_checkpoint/hf_quant_writer.h"

namespace qforge {

// The integers of an i4 or i8 [N, K] tensor, row-major, as signed values (-8..7, -128..127).
std::vector<int8_t> signed_linear_values(const Tensor& values);

// q.scale ([N, G] or [N] per channel, any float dtype) as fp16 [G, N] (G = 1 per channel): the
// group-major layout GPTQ and AWQ store. Throws Unsupported naming q.module and `layout` when a
// scale does not fit fp16. `inexact` counts the scales that fp16 does not hold exactly.
Tensor linear_scale_f16_group_major(const QuantizedLinearView& q, std::string_view layout,
                                    int64_t& inexact);

// q.scale as float32 in its own shape (exact from f16, bf16 and f32).
Tensor linear_scale_f32(const QuantizedLinearView& q);

}  // namespace qforge
