#pragma once
// One entry point for every input qforge reads: decides the format from the file's bytes and
// calls the matching importer.
#include <filesystem>

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "importers/format.h"
#include "importers/hf/hf_folder.h"
#include "importers/quantized_checkpoint/quantized_checkpoint.h"
#include "ir/graph.h"

namespace qforge {

struct LoadedModel {
  FileFormat format = FileFormat::Unknown;
  Graph graph;
  // A Hugging Face model folder (format HfFolder): its config.json and how its weights are
  // stored.
  std::optional<HfConfig> hf_config;
  FileFormat weights_format = FileFormat::Unknown;
  // A folder whose config.json has a quantization_config qforge reads (compressed-tensors):
  // the scheme; the graph holds its quantized Linears in ir/quantized_linear.h's form.
  std::optional<QuantizedCheckpoint> quantized;
  // An input that is not a Hugging Face folder but stands for one: the config.json synthesized
  // for it, which hf_config was parsed from and the folder writers take instead of a source
  // folder's. A GGUF file (importers/gguf/gguf_model_reader.h): from its metadata; a TensorRT-LLM
  // checkpoint (importers/quantized_checkpoint/trtllm_ckpt_reader.h): from its own config.
  std::optional<nlohmann::ordered_json> config_json;
  // A GGUF file: the Linears whose GGUF type has no symmetric integer form (Q4_1), read as float.
  std::vector<std::string> unfit_linears;
};

// Throws Error(IO) for a missing file, Error(InvalidInput) naming the file when no importer
// recognises it.
LoadedModel load_model(const std::filesystem::path& path);

}  // namespace qforge
