#pragma once
// `qforge convert DIR --format gguf --quant TYPE -o model.gguf`: a Hugging Face Llama folder
// (config.json, safetensors or torch weights, tokenizer.json) written as one GGUF file that
// llama.cpp loads. The mapping lives in cli/gguf_llama_map.h, the quantizers in
// kernels/gguf_quants.h, the container in exporters/gguf/gguf_writer.h.
#include "cli/convert_job.h"

namespace qforge::cli {

// True for the --quant values only GGUF takes (f32, f16, q8_0, q4_0, q4_1).
bool is_gguf_quant(const std::string& quant);

// Checks the options (Usage errors first), reads the folder, writes the file atomically, one
// tensor at a time.
ConvertResult export_gguf(const ConvertOptions& options);

}  // namespace qforge::cli
