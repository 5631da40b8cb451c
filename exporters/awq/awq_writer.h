#pragma once
// Writes weights in AutoAWQ's GEMM layout (`version: gemm`), the one AutoAWQ, transformers
// (through GPTQModel) and vLLM's awq / awq_marlin load (../shared/REFERENCE.md 3.3; AutoAWQ
// awq/modules/linear/gemm.py, awq/utils/packing_utils.py): each quantized Linear [N, K], int4 in
// groups of g along K, becomes
//   <module>.qweight  int32 [K, N / 8]: q + 8 as unsigned, eight output columns per word in the
//                     interleaved order 0, 2, 4, 6, 1, 3, 5, 7 (field i of word c holds column
//                     8c + order[i], at bits 4i)
//   <module>.qzeros   int32 [K / g, N / 8]: zero point 8 in every field (0x88888888)
//   <module>.scales   fp16 [K / g, N] (exporters/quant_checkpoint/linear_values.h)
// The loader's weight is (stored q - zero) * scale = q * fp16(scale). AWQ GEMM has no symmetric
// mode: a symmetric int4 weight is written as the asymmetric form with every zero 8
// (`zero_point: true`, which vLLM's and GPTQModel's AWQ kernels require). Only 4 bits; N a
// multiple of 8 and K of g, else Unsupported naming the module. config.json's
// quantization_config: quant_method awq, zero_point true, group_size, bits 4, version gemm,
// modules_to_not_convert (the Linears left float).
#include <cstdint>
#include <filesystem>
#include <memory>

#include "exporters/quant_checkpoint/hf_quant_writer.h"

namespace qforge {

// i4 values [N, K] (N a multiple of 8) -> int32 [K, N / 8] as above.
Tensor pack_awq_qweight(const Tensor& values);
// int32 [groups, n / 8] with every field `zero`, in the same packing.
Tensor pack_awq_qzeros(int64_t groups, int64_t n, uint32_t zero);

std::unique_ptr<HfQuantLayout> make_awq_layout();

class AwqWriter : public HfQuantWriter {
 public:
  AwqWriter(const std::filesystem::path& out, QuantCheckpointOptions options)
      : HfQuantWriter(make_awq_layout(), out, std::move(options)) {}
};

}  // namespace qforge
