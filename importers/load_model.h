#pragma once
// One entry point for every input qforge reads: decides the format from the file's bytes and
// calls the matching importer.
#include <filesystem>

#include <optional>

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
  // A TensorRT-LLM checkpoint folder (read as an HfFolder in Hugging Face names): the Hugging
  // Face config.json its own config stands for (importers/quantized_checkpoint/
  // trtllm_ckpt_reader.h), which hf_config was parsed from; empty for every other input.
  std::string synthesized_config;
};

// Throws Error(IO) for a missing file, Error(InvalidInput) naming the file when no importer
// recognises it.
LoadedModel load_model(const std::filesystem::path& path);

}  // namespace qforge
