#include "cli/hf_graph_job.h"

#include <spdlog/spdlog.h>

#include "importers/hf/decoder_builder.h"
#include "importers/hf/decoder_config.h"

namespace qforge::cli {

bool wants_decoder_graph(const LoadedModel& loaded, OutputKind out) {
  return loaded.format == FileFormat::HfFolder &&
         (out == OutputKind::Onnx || out == OutputKind::Bundle);
}

Graph build_decoder_graph(const std::string& input, const LoadedModel& loaded) {
  // A TensorRT-LLM checkpoint's Hugging Face config is synthesized from its own.
  const DecoderConfig config =
      !loaded.config_json
          ? read_decoder_config(input)
          : parse_decoder_config(loaded.config_json->dump(), input + "/config.json");
  const auto parts = build_decoder_parts(config, loaded.graph);
  Graph g = parts->whole();
  spdlog::info("built the {} decoder graph of '{}': {} layers, {} nodes", config.model_type,
               input, parts->num_layers(), g.nodes.size());
  return g;
}

}  // namespace qforge::cli
