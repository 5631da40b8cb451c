#pragma once
// W4A16 weight-only quantization: constant 2-D weights of MatMul (B[K, N]), Gemm (B, either
// transB) and, on request, Gather (embedding tables) become block-wise symmetric int4 with one
// fp16 scale per block of `block_size` values along the reduction axis (kernels/int4.h).
//
// Output formats:
//  - OnnxBlocked: an int4 initializer of the weight's shape, an fp16 scale [.., ceil(K / block),
//    ..] and DequantizeLinear(axis = reduction axis, block_size) in front of the consumer, then
//    a Cast to f32 when the weight was f32 (DequantizeLinear with an fp16 scale yields fp16).
//    Raises the default opset to 21 (int4 and blocked DequantizeLinear).
//  - MatMulNBits: each quantized MatMul becomes com.microsoft MatMulNBits (ONNX Runtime's
//    contrib op; bits 4, uint4 with the default zero point 8, scales in the weight's dtype).
//    Gemm and Gather weights keep the OnnxBlocked form.
// Each int4 tensor written gets a quantized-tensor record on the graph (ir/quant_record.h), in
// either format.
// K need not be a multiple of block_size: the last block is partial (ONNX allows it; for
// MatMulNBits the packed blob is padded with the zero point, which dequantizes to 0).
//
// Left float by default: nodes whose name or weight name matches a pattern of exclude_default
// ("lm_head"), the output projection (a MatMul/Gemm whose result, directly or through one bias
// Add, is a graph output: logits are sensitive and the layer is often tied to the embedding),
// Gather unless include_gather, and nodes whose name matches `exclude`.
//
// Methods: Rtn rounds each weight to nearest; Gptq quantizes the rows of each weight in order
// and moves each row's rounding error onto the rows not yet done, weighted by the calibration
// activations' X^T X (quant/gptq.h, `gptq` must be given; default scale Mse as Rtn, its
// scales are chosen per block as it comes up); Awq first rescales the weights' input channels
// from calibration activations (quant/awq.h, `awq` must be given), then rounds to nearest. Either
// way each block's scale is searched (Int4Scale::Mse) or amax / 7 (Amax); by default Mse for
// Rtn and Amax for Awq, whose own clip search (activation-aware) already chose each block's clip:
// a second, data-free search on top of it lowers MiniLM's cosine (0.9722 -> 0.9689).
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

#include "ir/pass.h"
#include "kernels/device.h"
#include "kernels/int4.h"

namespace qforge {

enum class W4Method { Rtn, Awq, Gptq };  // round to nearest (per `scale`); AWQ + RTN; GPTQ
enum class Int4Format { OnnxBlocked, MatMulNBits };

struct AwqCalibration;   // quant/awq.h
struct GptqCalibration;  // quant/gptq.h

std::string_view w4_method_name(W4Method method);  // "rtn", "awq", "gptq"

Int4Scale default_int4_scale(W4Method method);  // Mse for Rtn and Gptq, Amax for Awq

std::string_view int4_format_name(Int4Format format);  // "onnx-blocked", "matmulnbits"

struct W4A16Options {
  int block_size = 128;  // 16, 32, 64, 128 or 256 (MatMulNBits needs a power of two >= 16)
  W4Method method = W4Method::Rtn;
  // How each block's scale is chosen (kernels/int4.h); unset: default_int4_scale(method).
  std::optional<Int4Scale> scale;
  Int4Format format = Int4Format::OnnxBlocked;
  bool include_gather = false;                             // quantize embedding tables too
  bool exclude_output_projection = true;                   // see above
  std::optional<std::regex> exclude;                       // node names matching are left float
  std::string exclude_pattern;                             // the text of `exclude`, for reports
  std::vector<std::string> exclude_default = {"lm_head"};  // regexes on node and weight names
  Device device = Device::Auto;
  // Awq: the calibration activations (collect_awq_calibration on the graph the pass will see).
  // Shared so that a CLI can build the pass before the data has been read.
  std::shared_ptr<const AwqCalibration> awq;
  int awq_grid = 20;
  // Gptq: H = X^T X per activation (collect_gptq_calibration on the graph the pass will see).
  std::shared_ptr<const GptqCalibration> gptq;
};

// Throws Error(Usage) for a block size outside the list above or a bad exclude_default regex.
std::unique_ptr<Pass> make_w4a16_pass(W4A16Options options);

// A weight the pass would quantize: node `node` reads it at input `input`, reduction axis `axis`.
struct W4A16Target {
  size_t node;
  size_t input;
  std::string weight;
  int64_t axis;
};
// The weights the pass would quantize in `graph`, in node order (what AWQ calibrates for).
std::vector<W4A16Target> plan_w4a16_targets(const Graph& graph, const W4A16Options& options);

}  // namespace qforge
