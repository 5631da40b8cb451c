#include "ir/quant_record.h"

namespace qforge {

std::string_view quant_kind_name(QuantKind kind) {
  return kind == QuantKind::Activation ? "activation" : "weight";
}

std::string_view quant_packing_name(QuantPacking packing) {
  return packing == QuantPacking::MatMulNBits ? "matmulnbits" : "onnx";
}

std::string_view quant_granularity_name(QuantGranularity granularity) {
  switch (granularity) {
    case QuantGranularity::PerChannel:
      return "per-channel";
    case QuantGranularity::Blocked:
      return "blocked";
    case QuantGranularity::PerTensor:
      break;
  }
  return "per-tensor";
}

}  // namespace qforge
