#pragma once
// `qforge convert DIR -o model.onnx`: a Hugging Face model folder (or a GGUF file or
// TensorRT-LLM checkpoint, through the config.json synthesized for it) whose output holds a
// graph to run (.onnx, an engine bundle) becomes its decoder graph (importers/hf/decoder_builder.h,
// DecoderParts::whole()): float32, inputs input_ids and attention_mask (int64 [batch,
// sequence]), output logits. The quantization passes then run on that graph as on any ONNX
// model (--quant w4a16, --quant int8 with --calib holding input_ids and attention_mask).
// A model_type outside the families the builder knows is refused by name, before anything is
// written.
#include <string>

#include "cli/output_path.h"
#include "importers/load_model.h"

namespace qforge::cli {

// True for a model folder (or a file standing for one) converted to an output that holds a
// graph (.onnx or .qfb).
bool wants_decoder_graph(const LoadedModel& loaded, OutputKind out);

// The whole decoder of the folder `input`, built on the tensors load_model read from it.
Graph build_decoder_graph(const std::string& input, const LoadedModel& loaded);

}  // namespace qforge::cli
