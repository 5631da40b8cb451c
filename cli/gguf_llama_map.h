#pragma once
// Llama-style decoders (LlamaForCausalLM, MistralForCausalLM -> "llama"; Qwen2ForCausalLM ->
// "qwen2"; Qwen3ForCausalLM -> "qwen3") as llama.cpp's converter writes them to GGUF: Hugging
// Face tensor names to GGUF names (gguf-py constants.py MODEL_TENSORS), the GGUF type of each
// tensor for an output type, the Q/K row permutation (Llama only), and the <arch>.* metadata.
// Every tensor of the checkpoint is mapped or the export is refused naming it, and every shape
// is checked against config.json.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "exporters/gguf/gguf_writer.h"
#include "importers/hf/hf_decoder_facts.h"
#include "importers/hf/hf_folder.h"
#include "ir/gguf_decoder_names.h"
#include "ir/graph.h"

namespace qforge::cli {

// --quant with --format gguf: one table drives parsing, --help and the type rules.
struct GgufOutType {
  std::string_view name;
  gguf::TensorType type;      // of the 2-D weights
  gguf::TensorType output_type;  // of output.weight (token_embd.weight when tied)
  gguf::FileType file_type;
  std::string_view description;
};

inline constexpr GgufOutType kGgufOutTypes[] = {
    {"f32", gguf::TensorType::F32, gguf::TensorType::F32, gguf::FileType::AllF32,
     "every tensor float32"},
    {"f16", gguf::TensorType::F16, gguf::TensorType::F16, gguf::FileType::MostlyF16,
     "2-D weights float16, norms float32 (convert_hf_to_gguf --outtype f16)"},
    {"q8_0", gguf::TensorType::Q8_0, gguf::TensorType::Q8_0, gguf::FileType::MostlyQ8_0,
     "2-D weights Q8_0 (int8, one fp16 scale per 32), norms float32 (--outtype q8_0)"},
    {"q4_0", gguf::TensorType::Q4_0, gguf::TensorType::Q8_0, gguf::FileType::MostlyQ4_0,
     "2-D weights Q4_0 (int4, signed fp16 scale per 32), the output projection Q8_0 "
     "(llama-quantize Q4_0)"},
    {"q4_1", gguf::TensorType::Q4_1, gguf::TensorType::Q8_0, gguf::FileType::MostlyQ4_1,
     "2-D weights Q4_1 (uint4, fp16 scale and min per 32), the output projection Q8_0 "
     "(llama-quantize Q4_1)"},
};

const GgufOutType* find_gguf_out_type(std::string_view name);
std::string gguf_out_types_help();

struct GgufTensorPlan {
  std::string source;  // the checkpoint's name
  std::string name;    // the GGUF name
  std::vector<int64_t> shape;  // the checkpoint's (outermost first)
  gguf::TensorType type = gguf::TensorType::F32;
  // > 0: rows regrouped for llama.cpp's RoPE pairing over this many heads
  int64_t permute_heads = 0;
};

// Maps every initializer of `weights` (a Hugging Face checkpoint of a family above) onto GGUF,
// in the converter's order (token_embd, blocks in order, output_norm, output). Throws
// Unsupported for another architecture (naming it) and InvalidInput for a tensor that is
// unknown, missing, or whose shape disagrees with config.json (naming the tensor).
std::vector<GgufTensorPlan> plan_llama_gguf(const Graph& weights, const HfConfig& config,
                                            const GgufOutType& out);

using GgufFamily = gguf::DecoderFamily;  // ir/gguf_decoder_names.h

// The family of config.json's architectures, or Unsupported naming them.
const GgufFamily& gguf_family(const HfConfig& config);
// Its GGUF architecture name ("llama", "qwen2", "qwen3").
std::string gguf_architecture(const HfConfig& config);

// general.* and <arch>.* keys as convert_hf_to_gguf.py writes them (uint32 counts).
void add_llama_metadata(gguf::GgufWriter& w, const HfConfig& config, const HfDecoderFacts& facts,
                        const std::string& model_name, const GgufOutType& out);

// Rows of a [rows, cols] row-major weight regrouped as convert_hf_to_gguf.py's permute():
// W.reshape(heads, 2, rows/heads/2, cols).swapaxes(1, 2).
std::vector<float> permute_rope_rows(std::span<const float> w, int64_t rows, int64_t cols,
                                     int64_t heads);

}  // namespace qforge::cli
