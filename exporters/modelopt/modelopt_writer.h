#pragma once
// Writes weights as NVIDIA ModelOpt's unified Hugging Face export writes them
// (modelopt/torch/export/unified_export_hf.py, quant_utils.py::pack_int4_in_uint8,
// get_quant_config, convert_hf_config.py; nvidia-modelopt 0.47.0), the checkpoint TensorRT-LLM's
// LLM API (PyTorch backend) loads with `hf_quant_config.json`:
// - W4A16 (quant_algo W4A16_AWQ): each quantized Linear [N, K], int4 in groups of g along K:
//     <module>.weight           uint8 [N / 2, K]: two adjacent output rows per byte, row 2r in
//                               the low nibble, 2r + 1 in the high one, as signed int4 (no
//                               offset), the same as ModelOpt's TensorRT-LLM checkpoint
//     <module>.weight_scale     float32 [N, K / g] (ModelOpt's amax / 7 is float32; qforge's
//                               scale converts to it exactly)
//     <module>.pre_quant_scale  [K] of ones, in the model dtype. qforge's AWQ folds its
//                               activation scales into the preceding norm or Linear, so the
//                               input needs no scaling; TensorRT-LLM's loader of an unfused
//                               Linear (o_proj, down_proj) reads the tensor unconditionally,
//                               its fused q/k/v and gate/up loaders ignore it.
// - W8A16 (quant_algo W8A16, --quant int8-weights): <module>.weight int8 [N, K] and
//   <module>.weight_scale float32 [N].
// The dequantized weight is q * weight_scale. hf_quant_config.json holds
// {producer, quantization: {quant_algo, kv_cache_quant_algo null, group_size, has_zero_point
// false, pre_quant_scale true, exclude_modules}}; config.json's quantization_config is what
// ModelOpt puts there (quant_method modelopt, quant_algo, ignore, producer) plus group_size,
// has_zero_point and pre_quant_scale for loaders that read config.json alone. N must be even
// (W4A16), else Unsupported naming the module.
#include <filesystem>
#include <memory>

#include "exporters/quant_checkpoint/hf_quant_writer.h"

namespace qforge {

// i4 values [N, K] (N even) -> uint8 [N / 2, K] as above.
Tensor pack_modelopt_int4(const Tensor& values);

std::unique_ptr<HfQuantLayout> make_modelopt_hf_layout();

class ModeloptHfWriter : public HfQuantWriter {
 public:
  ModeloptHfWriter(const std::filesystem::path& out, QuantCheckpointOptions options)
      : HfQuantWriter(make_modelopt_hf_layout(), out, std::move(options)) {}
};

}  // namespace qforge
