#pragma once
// A Hugging Face model folder whose config.json carries a `quantization_config` (a checkpoint a
// quantizer wrote for a serving engine) read back into qforge's weights-only form: each
// quantized Linear becomes the integers [out, in] under its weight's name, its scale beside it
// and a record tying them (ir/quantized_linear.h), the form the model-folder exporters consume.
//
// One reader per quant_method, chosen from a small table (kQuantizedCheckpointReaders):
// compressed-tensors, gptq, awq (compressed_tensors_reader.h, gptq_awq_reader.h) and modelopt
// (modelopt_reader.h, also for a folder with hf_quant_config.json and no quantization_config).
// A folder whose quant_method has no reader loads as the tensors it stores. TensorRT-LLM's
// checkpoint folder (config.json + rank{r}.safetensors) has its own reader: trtllm_ckpt_reader.h.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ir/graph.h"

namespace qforge {

// One weight scheme of the checkpoint (a compressed-tensors config group).
struct QuantizedScheme {
  int bits = 0;
  int64_t group_size = 0;  // weights per scale along `in`; 0: one scale per output channel
  bool symmetric = true;
  int64_t linears = 0;  // Linears of the folder stored in this scheme
};

// What the checkpoint's config says, for `inspect` and for convert's scheme checks.
struct QuantizedCheckpoint {
  std::string quant_method;  // "compressed-tensors"
  std::string format;        // "pack-quantized", "mixed-precision"
  std::vector<QuantizedScheme> schemes;
  std::vector<std::string> ignore;  // the config's list of modules left float, as written
  int64_t quantized_linears = 0;
};

// The quant_method of config.json's quantization_config; nullopt when the file has none.
// Throws InvalidInput (naming `file`) when the text is not a JSON object or the key holds the
// wrong type.
std::optional<std::string> quantization_method(const std::string& config_text,
                                               const std::string& file);

// True when qforge has a reader for `quant_method`.
bool reads_quant_method(std::string_view quant_method);

// Rewrites `graph` (the folder's tensors as stored) into the quantized-Linear form, with the
// reader of the config's quant_method. Throws InvalidInput naming the tensor when the config and
// the tensors disagree, Unsupported for a scheme qforge does not read (asymmetric, activation
// order, float or activation quantization).
QuantizedCheckpoint read_quantized_checkpoint(const std::string& config_text,
                                              const std::string& file, Graph& graph);

// A model folder's tensors (`graph`, read from DIR) in the quantized-Linear form when DIR's
// config.json (`config_text`) names a quant_method qforge reads, or DIR holds ModelOpt's
// hf_quant_config.json; nullopt (graph untouched) otherwise.
std::optional<QuantizedCheckpoint> read_quantized_folder(const std::filesystem::path& dir,
                                                         const std::string& config_text,
                                                         Graph& graph);

}  // namespace qforge
