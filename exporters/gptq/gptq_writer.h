#pragma once
// Writes weights in the GPTQ layout that GPTQModel, transformers (through GPTQModel) and vLLM
// load (../shared/REFERENCE.md 3.2; GPTQModel nn_modules/qlinear pack, utils/model.py v1/v2):
// each quantized Linear [N, K] of bits b (4, or 8 per channel) becomes
//   <module>.qweight  int32 [K * b / 32, N]: q + 2^(b-1) as unsigned, 32 / b rows of K per word,
//                     row r*per + j of a column at bits j * b (packed along K)
//   <module>.qzeros   int32 [G, ceil(N * b / 32)]: every zero point 2^(b-1), packed along N the
//                     same way; checkpoint_format gptq (v1) stores it minus one (0x77777777 for
//                     4 bits), gptq_v2 stores it as is (0x88888888)
//   <module>.scales   fp16 [G, N] (exporters/quant_checkpoint/linear_values.h: a bf16 or float32
//                     scale is rounded to nearest even, the integers are the same)
//   <module>.g_idx    int32 [K] = k / group (no act-order)
// with G = K / group (group = K per channel, group_size -1). The loader's weight is
// (stored q - zero) * scale = q * fp16(scale). A bias and every float tensor are kept as they
// are. config.json's quantization_config: quant_method gptq, bits, group_size, desc_act false,
// sym true, checkpoint_format, pack_dtype int32, and GPTQModel's `dynamic` negative rules for
// decoder Linears left float (lm_head is never quantized by GPTQ loaders).
#include <cstdint>
#include <filesystem>
#include <memory>

#include "exporters/quant_checkpoint/hf_quant_writer.h"

namespace qforge {

// i4 or i8 values [N, K] -> int32 [K * bits / 32, N] as above; K a multiple of 32 / bits.
Tensor pack_gptq_qweight(const Tensor& values);
// int32 [groups, ceil(n * bits / 32)] holding `zero` in every field (padding fields 0).
Tensor pack_gptq_qzeros(int64_t groups, int64_t n, int bits, uint32_t zero);
// int32 [k] = i / group.
Tensor gptq_g_idx(int64_t k, int64_t group);

// `v2`: checkpoint_format gptq_v2 (true zero points); otherwise gptq (v1, zero minus one).
std::unique_ptr<HfQuantLayout> make_gptq_layout(bool v2);

class GptqWriter : public HfQuantWriter {
 public:
  GptqWriter(const std::filesystem::path& out, QuantCheckpointOptions options, bool v2)
      : HfQuantWriter(make_gptq_layout(v2), out, std::move(options)) {}
};

}  // namespace qforge
