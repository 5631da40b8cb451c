#pragma once
// The config.json figures a GGUF header needs beyond HfConfig (importers/hf/hf_folder.h):
// the RMSNorm epsilon, whether head_dim is given explicitly (llama.cpp's converter then also
// writes attention.key_length/value_length), and the RoPE scaling type, which GGUF export
// refuses unless it is the default.
#include <filesystem>
#include <optional>
#include <string>

namespace qforge {

struct HfDecoderFacts {
  std::optional<double> rms_norm_eps;
  bool head_dim_given = false;
  // rope_scaling.rope_type / .type (transformers 4) or rope_parameters.rope_type (5); empty or
  // "default" for plain RoPE.
  std::string rope_type;
};

// Throws InvalidInput naming `file` when the text is not a JSON object or a key has a wrong type.
HfDecoderFacts parse_hf_decoder_facts(const std::string& config_json, const std::string& file);

HfDecoderFacts read_hf_decoder_facts(const std::filesystem::path& dir);

}  // namespace qforge
