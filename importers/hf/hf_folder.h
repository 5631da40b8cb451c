#pragma once
// A Hugging Face model folder: config.json beside the weights (model.safetensors, sharded
// model-0000N-of-0000M.safetensors with model.safetensors.index.json, or pytorch_model.bin /
// pytorch_model.bin.index.json), as save_pretrained writes it.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace qforge {

// The decoder figures of config.json. Keys absent from the file stay empty, except those
// transformers itself derives: num_key_value_heads defaults to num_attention_heads, head_dim
// to hidden_size / num_attention_heads (Qwen3 sets it otherwise), tie_word_embeddings to true.
struct HfConfig {
  std::vector<std::string> architectures;
  std::string model_type;
  std::optional<int64_t> num_hidden_layers;
  std::optional<int64_t> hidden_size;
  std::optional<int64_t> intermediate_size;
  std::optional<int64_t> num_attention_heads;
  std::optional<int64_t> num_key_value_heads;
  std::optional<int64_t> head_dim;
  std::optional<int64_t> vocab_size;
  std::optional<int64_t> max_position_embeddings;
  std::optional<double> rope_theta;  // top level (transformers 4) or rope_parameters (5)
  bool tie_word_embeddings = true;
  std::string dtype;  // "dtype" (transformers 5) or the legacy "torch_dtype"; may be empty
};

// Parses config.json text; `file` names it in errors. Throws InvalidInput when the text is not
// a JSON object or a key holds the wrong type (naming the key and the file).
HfConfig parse_hf_config(const std::string& text, const std::string& file);

// True when `dir` is a folder holding config.json (and is not a PEFT adapter folder).
bool is_hf_folder(const std::filesystem::path& dir);

// The text of DIR/config.json: IO error naming it when missing or unreadable.
std::string read_config_json(const std::filesystem::path& dir);

// Reads DIR/config.json: IO error naming it when missing or unreadable.
HfConfig read_hf_config(const std::filesystem::path& dir);

// The file the folder's weights are read through, in transformers' order of preference:
// model.safetensors.index.json, model.safetensors, pytorch_model.bin.index.json,
// pytorch_model.bin. IO error naming the folder when none is there.
std::filesystem::path hf_weights_file(const std::filesystem::path& dir);

}  // namespace qforge
