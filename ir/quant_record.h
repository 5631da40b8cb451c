#pragma once
// One record per quantized tensor (DESIGN.md, "Quantized-weight records"): what a quantizing
// pass wrote, kept on the Graph so that every exporter reads it instead of re-deriving it from
// node patterns. Passes attach records as they write the tensors (Graph::add_quant_record); a
// model read from disk gets the same records from its QDQ and MatMulNBits nodes, in one place
// (importers/onnx/onnx_quant_records.h). A record names tensors, it does not hold them: the
// graph's initializers stay the one copy.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "ir/dtype.h"

namespace qforge {

// Activations get records too (static INT8's QuantizeLinear -> DequantizeLinear pairs): the
// bundle manifest lists them, and exporters of activation schemes (compressed-tensors'
// input_activations, TensorRT-LLM) would otherwise have to find them again by node patterns.
enum class QuantKind { Weight, Activation };

// How the stored tensor lays out its values.
enum class QuantPacking {
  // The tensor's own shape and dtype (int4 two per byte, low nibble first, as ONNX does), read
  // by a DequantizeLinear.
  Onnx,
  // com.microsoft MatMulNBits' B for a logical weight [K, N]: uint8 [N, blocks, block_size / 2]
  // of unsigned nibbles q + 2^(bits - 1), scales [N * blocks] (quant/w4a16/w4a16_matmulnbits.h).
  MatMulNBits,
};

enum class QuantGranularity { PerTensor, PerChannel, Blocked };

struct QuantRecord {
  QuantKind kind = QuantKind::Weight;
  // The stored quantized tensor: an initializer, or for an activation the QuantizeLinear output
  // that its DequantizeLinear reads.
  std::string name;
  // The float tensor it stands for: the weight a pass replaced or the activation it quantized.
  // Read from disk, a weight's former name is gone: its DequantizeLinear's output (or the
  // MatMulNBits' B) stands in.
  std::string source;
  // Element type of the quantized values (i8, u8, i4, u4; i32 for an int32 bias), whatever the
  // packing. Unknown only for an activation read from disk whose zero point is computed.
  std::optional<DType> dtype;
  int bits = 0;
  std::optional<int64_t> axis;  // non-negative, of the logical tensor; none: per-tensor
  int64_t block_size = 0;       // > 0: blocks of this many values along `axis`
  std::string scale;
  std::string zero_point;  // empty: none (0, or MatMulNBits' 2^(bits - 1))
  QuantPacking packing = QuantPacking::Onnx;
  // The node `name` feeds (DequantizeLinear, MatMulNBits), by its first output: ONNX node names
  // may be empty or repeated, output names are unique. Empty in a weights-only graph, where no
  // node reads it (ir/quantized_linear.h).
  std::string reader;

  QuantGranularity granularity() const {
    if (block_size > 0) return QuantGranularity::Blocked;
    return axis ? QuantGranularity::PerChannel : QuantGranularity::PerTensor;
  }
  bool operator==(const QuantRecord&) const = default;
};

std::string_view quant_kind_name(QuantKind kind);                      // "weight", "activation"
std::string_view quant_packing_name(QuantPacking packing);             // "onnx", "matmulnbits"
std::string_view quant_granularity_name(QuantGranularity granularity);  // "per-tensor", ...

}  // namespace qforge
