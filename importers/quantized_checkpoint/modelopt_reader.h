#pragma once
// Reads NVIDIA ModelOpt's unified Hugging Face export back (nvidia-modelopt 0.47.0
// torch/export/unified_export_hf.py, quant_utils.py; the layout exporters/modelopt/ writes) into
// qforge's quantized-Linear form (ir/quantized_linear.h). The scheme comes from
// hf_quant_config.json's "quantization" (what TensorRT-LLM reads) or, without that file, from
// config.json's quantization_config (quant_method "modelopt"); when both are there they must
// agree. quant_algo:
//   W4A16_AWQ  M.weight uint8 (or int8) [N / 2, K]: rows 2i and 2i + 1 in one byte, low nibble
//              the even row, signed int4; M.weight_scale float [N, K / group_size]; optional
//              M.pre_quant_scale [K]. group_size from the config, or (ModelOpt writes none in
//              config.json) from the scale's shape, one for every Linear.
//   W8A16      M.weight int8 [N, K]; M.weight_scale float [N] or [N, 1].
//   MIXED_PRECISION with quantized_layers of those two.
// A pre_quant_scale is folded into the group scales where that is exact
// (importers/quantized_checkpoint/modelopt_int4.h), else Unsupported naming it. The scale is kept
// in the model's dtype (config.json dtype / torch_dtype) when it holds every value exactly (a
// model-dtype scale written as float32), else as stored. Other algorithms (FP8, NVFP4, W4A8,
// SmoothQuant), a KV-cache quantization, has_zero_point true, activation scales (input_scale)
// are Unsupported, named; a tensor that disagrees with the config (dtype, shape, group size, a
// packed weight without weight_scale, a quantized module the config excludes) is InvalidInput
// naming the tensor.
#include <string>
#include <string_view>

#include "importers/quantized_checkpoint/quantized_checkpoint.h"
#include "ir/graph.h"

namespace qforge {

inline constexpr std::string_view kModeloptMethod = "modelopt";
inline constexpr std::string_view kHfQuantConfigFile = "hf_quant_config.json";

// `hf_quant_text` is hf_quant_config.json's text, empty when the folder has none;
// `config_text` may lack a quantization_config when `hf_quant_text` is given.
QuantizedCheckpoint read_modelopt(const std::string& config_text, const std::string& file,
                                  const std::string& hf_quant_text,
                                  const std::string& hf_quant_file, Graph& graph);

// The reader-table entry: hf_quant_config.json beside `file` (config.json) when there is one.
QuantizedCheckpoint read_modelopt_folder(const std::string& config_text, const std::string& file,
                                         Graph& graph);

}  // namespace qforge
