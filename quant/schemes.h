#pragma once
// The quantization schemes qforge knows: one table drives `--quant` parsing, `--help` and
// validation alike.
#include <array>
#include <optional>
#include <string>
#include <string_view>

namespace qforge {

enum class QuantScheme { None, Int8Weights, Int8Static, W4A16 };

struct QuantSchemeInfo {
  QuantScheme scheme;
  std::string_view name;
  std::string_view description;
};

inline constexpr std::array<QuantSchemeInfo, 4> kQuantSchemes = {{
    {QuantScheme::None, "none", "no quantization: import and write the model as it is"},
    {QuantScheme::Int8Weights, "int8-weights",
     "weight-only symmetric INT8 (per-channel by default) with DequantizeLinear before "
     "Conv/ConvTranspose/Gemm/MatMul; activations stay float. On a model folder or state "
     "dict: its decoder Linear weights per output channel, written as compressed-tensors"},
    {QuantScheme::Int8Static, "int8",
     "static INT8 QDQ from calibrated ranges (needs --calib or --import-calib): BatchNorm "
     "folded, activations per-tensor and weights per-channel, symmetric, zero point 0"},
    {QuantScheme::W4A16, "w4a16",
     "weight-only block-wise symmetric INT4 (--block-size, default 128) for MatMul/Gemm "
     "weights: int4 + fp16 scales with blocked DequantizeLinear (opset 21) or "
     "com.microsoft.MatMulNBits (--int4-format matmulnbits). On a model folder or state "
     "dict: its decoder Linear weights in blocks along the input dim, written as "
     "compressed-tensors pack-quantized"},
}};

std::string_view quant_scheme_name(QuantScheme scheme);
// "none: ...\nint8-weights: ..." for --help.
std::string quant_schemes_help();

}  // namespace qforge
