#include "cli/hf_graph_job.h"

#include <spdlog/spdlog.h>

#include "importers/hf/decoder_builder.h"
#include "importers/hf/decoder_config.h"

namespace qforge::cli {

bool wants_decoder_graph(const LoadedModel& loaded, OutputKind out) {
  // A GGUF file stands for a folder through the config.json synthesized from its metadata.
  const bool folder = loaded.format == FileFormat::HfFolder || loaded.config_json.has_value();
  return folder && (out == OutputKind::Onnx || out == OutputKind::Bundle);
}

Graph build_decoder_graph(const std::string& input, const LoadedModel& loaded) {
  // A TensorRT-LLM checkpoint's Hugging Face config is synthesized from its own.
  DecoderConfig config =
      !loaded.config_json
          ? read_decoder_config(input)
          : parse_decoder_config(loaded.config_json->dump(), input + "/config.json");
  config.dequantize_in_f32 = loaded.quantized && loaded.quantized->quant_method == "gguf";
  const auto parts = build_decoder_parts(config, loaded.graph);
  Graph g = parts->whole();
  spdlog::info("built the {} decoder graph of '{}': {} layers, {} nodes", config.model_type,
               input, parts->num_layers(), g.nodes.size());
  return g;
}

}  // namespace qforge::cli
