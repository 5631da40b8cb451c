#pragma once
// Weight-only quantization of the Linear weights of a weights-only graph (a Hugging Face model
// folder's tensors): symmetric round-to-nearest, W4A16 in blocks along the input dim or INT8 per
// output channel, stored in the form ir/quantized_linear.h gives (the initializer keeps its name
// and holds i4/i8 [out, in], "<name>_scale" in the weight's float dtype, a record with no reader).
//
// Which tensors are Linear weights is data: kDecoderLinearRules, a table of regular expressions
// over tensor names, first match wins. The decoder layers' projections are quantized; the output
// projection (lm_head) stays float by default, as the ONNX W4A16 pass leaves it; embeddings,
// norms and biases match no rule and stay float.
//
// Scales (the ONNX W4A16 and int8-weights passes' rules, so figures agree with that path):
// - 4 bits: kernels/int4.h's quantize_int4_blocked on blocks of `block_size` values along `in`
//   with its Int4Scale rule (default Mse, as --quant w4a16 RTN). The kernel's scales are fp16; an
//   f16 or f32 weight keeps them exactly, a bf16 weight gets them rounded to bf16 and its codes
//   recomputed from the rounded scale, so that q * scale is what the stored tensors say.
// - 8 bits: scale = amax / 127 per output row (kernels/quantize.h's int8_symmetric_scale),
//   rounded to the weight's dtype, codes from the rounded scale, in [-127, 127].
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ir/graph.h"
#include "ir/pass.h"
#include "kernels/device.h"
#include "kernels/int4.h"
#include "quant/weights/linear_precision.h"

namespace qforge {

enum class LinearRuleAction { Quantize, KeepFloat };

struct LinearWeightRule {
  std::string_view pattern;  // ECMAScript regex matched against the whole tensor name
  LinearRuleAction action;
  std::string_view what;  // for the report: "decoder projection", "output projection"
};

inline constexpr std::array<LinearWeightRule, 2> kDecoderLinearRules = {{
    {R"(model\.layers\.\d+\.(self_attn|mlp)\.(q|k|v|o|gate|up|down|qkv|gate_up)_proj\.weight)",
     LinearRuleAction::Quantize, "decoder projection"},
    {R"(lm_head\.weight)", LinearRuleAction::KeepFloat,
     "output projection (float by default, as --quant w4a16 leaves lm_head)"},
}};

struct LinearWeightQuantOptions {
  int bits = 4;              // 4 (blocked) or 8 (per output channel)
  int64_t block_size = 128;  // 4 bits: values per scale along `in`
  Int4Scale int4_scale = Int4Scale::Mse;
  Device device = Device::Cpu;
  // Scales stored in the weight's dtype that fp16 also holds exactly, for layouts that store fp16
  // scales whatever the model dtype (GPTQ, AWQ): int8 scales (amax / 127) are rounded to fp16
  // first, then to the weight's dtype (which keeps them on fp16's grid), and the codes come from
  // that scale. int4 scales are fp16 choices already.
  bool fp16_scales = false;
  // Mixed precision (quant/weights/linear_precision.h): rules over the decoder projections'
  // module names, first match wins; a module no rule matches gets `bits`. A rule may keep a
  // module float. Int4 modules use `block_size`.
  std::vector<PrecisionRule> precision;
};

// A Linear weight left float, and why ("output projection ...").
struct FloatLinear {
  std::string name;
  std::string why;
};

struct LinearWeightPlan {
  std::vector<std::string> quantize;  // initializer names, in graph order
  std::vector<int> bits;              // per `quantize` entry: 4 or 8
  std::vector<FloatLinear> kept;      // Linear weights a rule keeps float
};

// Which initializers of `weights` the options quantize, and to how many bits. Throws Usage naming
// the tensor when a matched weight cannot be quantized as asked (not 2-D float, `in` not a
// multiple of the block size: the message names a block size that fits every weight, if one
// does), naming the rule when a precision rule matches no decoder projection, and naming both
// modules when rules give the parts of one fused Linear (q/k/v, gate/up) different precisions.
LinearWeightPlan plan_linear_weight_quant(const Graph& weights,
                                          const LinearWeightQuantOptions& options);

struct LinearQuantStats {
  double max_abs_error = 0.0;
  double sqnr_db = 0.0;
};

// Quantizes initializer `name` of `weights` (a planned one) in place: store_quantized_linear.
// Throws InvalidInput naming it when it holds NaN or Inf. Reads no file; the float tensor's
// storage is released by the graph (a mapped window stays with its file).
LinearQuantStats quantize_linear_weight(Graph& weights, const std::string& name,
                                        const LinearWeightQuantOptions& options);

// Plans and quantizes every weight of the plan, reporting each ("tensors" rows) and the float
// ones. An empty plan is the caller's to refuse (the pass then changes nothing).
std::unique_ptr<Pass> make_linear_weight_quant_pass(LinearWeightQuantOptions options);

}  // namespace qforge
