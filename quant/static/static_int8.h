#pragma once
// Static INT8 in QDQ form, from calibrated activation ranges (DESIGN.md, "Quantization rules"):
// - activations per-tensor symmetric: scale = amax / 127, int8 zero point 0, one shared
//   QuantizeLinear -> DequantizeLinear pair per tensor whatever the number of readers;
// - constant weights per-channel on the output channel (Conv 0, ConvTranspose 1, MatMul B last
//   axis, Gemm 0 with transB=1 else 1), stored as int8 initializers read by a DequantizeLinear
//   (no QuantizeLinear on constants);
// - bias float by default, or int32 with scale s_input * s_weight[c] (`int32_bias`), kept float
//   with a warning where a value would not fit in int32.
// Which inputs get Q/DQ, per op: Conv, ConvTranspose, Gemm: the data input (and Gemm's B when it
// is not constant); MatMul: both (activation x activation too); Add: both, when neither is a
// constant (a residual add a runtime can fuse; an Add of a constant is a bias add and stays
// float); MaxPool, AveragePool, GlobalAveragePool: the input; Concat: every input, with one
// scale shared by the inputs and the output (`concat_shared_scale`, on by default: TensorRT
// fuses a Concat into the quantized graph only then; off, Concat stays float). A node is
// quantized whole or not at all: an activation without a usable range (missing, 0, not finite)
// leaves its readers float, with a warning. With `add_shared_scale`, a residual Add's two inputs
// share one scale too. The output graph's default opset is at least 13. Every quantized
// activation, weight and int32 bias gets a quantized-tensor record (ir/quant_record.h).
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ir/pass.h"
#include "kernels/device.h"

namespace qforge {

// `NAME=amax:X` replaces a tensor's range (an activation's calibrated amax, or a weight's,
// which then gets one clipped per-tensor scale); `NAME=per-tensor` gives a weight one scale.
struct TensorOverride {
  std::optional<float> amax;
  bool per_tensor = false;
};

struct StaticInt8Options {
  std::map<std::string, float> activation_amax;  // calibrated amax per value name
  bool int32_bias = false;
  std::optional<std::regex> exclude;  // nodes whose name matches stay float
  std::string exclude_pattern;        // the text of `exclude`, for reports
  std::vector<std::string> op_types;  // empty: every op of static_int8_op_types()
  std::map<std::string, TensorOverride> overrides;
  // One scale, from the union of the ranges, for every input and the output of a Concat, and
  // for both inputs of a residual Add (quant/static/shared_scales.h).
  bool concat_shared_scale = true;
  bool add_shared_scale = false;
  Device device = Device::Auto;
};

// The op types the pass knows, in the order --help lists them.
std::span<const std::string_view> static_int8_op_types();

// Throws Error(Usage) for an op type outside static_int8_op_types() or an override naming a
// value `graph` lacks: lets a caller check the flags before the slow calibration.
void check_static_int8_options(const Graph& graph, const StaticInt8Options& options);

// The pass runs check_static_int8_options() on the graph it gets first.
std::unique_ptr<Pass> make_static_int8_pass(StaticInt8Options options);

}  // namespace qforge
