#pragma once
// The tensor-level pieces of static INT8: quantizing a constant weight, an int32 bias, and
// adding the QuantizeLinear / DequantizeLinear nodes with their scale and zero-point
// initializers. New nodes are appended to graph.nodes; the pass orders them afterwards.
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "kernels/device.h"
#include "kernels/workspace.h"
#include "quant/calib/quant_error.h"

namespace qforge {

struct QuantizedWeight {
  Tensor values;                // i8, the weight's shape
  std::vector<float> scales;    // one per channel of `axis`, or one (per-tensor)
  std::optional<int64_t> axis;  // none: per-tensor
  QuantError error;             // float weight vs its dequantized int8 form
};

// Symmetric int8 in [-127, 127]. `amax`, when given, replaces the measured range (per-tensor
// only; values beyond it clip). Throws InvalidInput naming `weight_name` on NaN/Inf. The
// kernels' device buffers come from `workspace` (the pass's, kept from weight to weight).
QuantizedWeight quantize_weight(const Tensor& weight, const std::string& weight_name,
                                std::optional<int64_t> axis, std::optional<float> amax,
                                Device device, KernelWorkspace& workspace);

// Bias as int32 with scale s_input * s_weight[c % s_weight.size()] per output channel c.
// None when a value would not fit in int32 (|bias / scale| > 2^31 - 1) or a scale underflows
// to 0; `max_ratio` then says how far it went.
struct QuantizedBias {
  Tensor values;  // i32 [C]
  std::vector<float> scales;
};
std::optional<QuantizedBias> quantize_bias_int32(std::span<const float> bias, float input_scale,
                                                 std::span<const float> weight_scales,
                                                 double& max_ratio);

// quantized (an initializer of int8 or int32 values) -> DequantizeLinear; adds `base`_scale and
// `base`_zero_point initializers and the weight's quantized-tensor record (source `base`).
// Returns the dequantized value's name. New names come from `names` (the graph's).
std::string add_dequantize(Graph& graph, UniqueNames& names, const std::string& base,
                           const std::string& quantized,
                           std::span<const float> scales, DType zero_point_dtype,
                           std::optional<int64_t> axis);

// activation -> QuantizeLinear -> DequantizeLinear with one shared scalar scale and int8 zero
// point 0, and the activation's quantized-tensor record. Returns the dequantized value's name.
std::string add_quantize_dequantize(Graph& graph, UniqueNames& names, const std::string& activation,
                                    float scale);

}  // namespace qforge
