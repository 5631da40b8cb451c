#pragma once
// Reads GPTQ (GPTQModel / AutoGPTQ `format` gptq and gptq_v2) and AutoAWQ GEMM checkpoints back
// (../shared/REFERENCE.md 3.2, 3.3; the layouts exporters/gptq/ and exporters/awq/ write) into
// qforge's quantized-Linear form (ir/quantized_linear.h), for symmetric weights only:
//   GPTQ  M.qweight int32 [K * bits / 32, N] packed along K; M.qzeros int32 [G, N * bits / 32]
//         packed along N, every zero 2^(bits-1) (stored minus one in v1); M.scales [G, N];
//         M.g_idx int32 [K] = i / group (no act-order); bits 4 or 8; G = K / group (1 for -1)
//   AWQ   M.qweight int32 [K, N / 8] packed along N in the order 0,2,4,6,1,3,5,7; M.qzeros
//         [G, N / 8] the same, every zero 8; M.scales [G, N]; 4 bits, version gemm
// M.weight becomes the signed integers [N, K] and M.weight_scale the scales transposed to
// [N, G] (or [N] for one group), in their stored dtype. A zero point other than the symmetric
// one, act-order, desc_act, other bit widths or AWQ versions are Unsupported, named; tensors
// that disagree with the config (shapes, dtypes, a missing qzeros or scales) are InvalidInput
// naming the tensor.
#include <string>
#include <string_view>

#include "importers/quantized_checkpoint/quantized_checkpoint.h"
#include "ir/graph.h"

namespace qforge {

inline constexpr std::string_view kGptqMethod = "gptq";
inline constexpr std::string_view kAwqMethod = "awq";

QuantizedCheckpoint read_gptq(const std::string& config_text, const std::string& file,
                              Graph& graph);
QuantizedCheckpoint read_awq(const std::string& config_text, const std::string& file,
                             Graph& graph);

}  // namespace qforge
