#pragma once
// The vocabulary of a Hugging Face model folder as llama.cpp's converter (convert_hf_to_gguf.py
// `get_vocab_base`, `_set_vocab_gpt2`, gguf-py `SpecialVocab`) puts it into GGUF: tokens in id
// order, their types, the BPE merges, the special token ids and flags, and the pre-tokenizer
// name (tokenizer.ggml.pre). Reads a SentencePiece tokenizer.model when the folder has one (as the
// converter's _set_vocab_sentencepiece does: tokenizer.ggml.model "llama" with each piece's score
// and type, added_tokens.json and tokenizer_config.json's added_tokens_decoder over them), else
// tokenizer.json (byte-level BPE); tokenizer_config.json and config.json for the special tokens.
// A tokenizer.json BPE with byte fallback and no tokenizer.model is refused as Unsupported.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace qforge {

// gguf-py TokenType.
enum class GgufTokenType : int32_t { Normal = 1, Unknown = 2, Control = 3, UserDefined = 4,
                                     Unused = 5, Byte = 6 };

struct HfTokenizer {
  std::string model = "gpt2";  // tokenizer.ggml.model
  std::string pre;             // tokenizer.ggml.pre
  std::string pre_reason;      // why `pre` is "default" when the pre-tokenizer was not recognized
  std::vector<std::string> tokens;
  std::vector<int32_t> token_types;
  std::vector<std::string> merges;  // "a b"
  std::vector<float> scores;        // tokenizer.ggml.scores: SentencePiece vocabularies only
  // tokenizer.ggml.add_space_prefix: tokenizer_config.json's add_prefix_space, when it has one
  // (the converter writes it for Llama-family models).
  std::optional<bool> add_space_prefix;
  // tokenizer.ggml.<name>_token_id, in SpecialVocab's order (bos, eos, unk, sep, pad, cls, mask)
  std::vector<std::pair<std::string, uint32_t>> special_ids;
  std::optional<bool> add_bos;
  std::optional<bool> add_eos;
  std::string chat_template;
};

// `vocab_size` is config.json's (tokens past the tokenizer's become "[PAD<i>]", Unused), or
// nullopt for the tokenizer's own size. Texts may be empty for files that are absent (all but
// tokenizer.json); `dir` names the folder in errors.
HfTokenizer parse_hf_tokenizer(const std::string& tokenizer_json,
                               const std::string& tokenizer_config_json,
                               const std::string& config_json, std::optional<int64_t> vocab_size,
                               const std::string& dir);

// `model_proto` is tokenizer.model's bytes (a SentencePiece ModelProto: InvalidInput naming the
// file when it does not parse or holds no piece); the other texts may be empty for absent files.
HfTokenizer parse_sentencepiece_tokenizer(const std::string& model_proto,
                                          const std::string& added_tokens_json,
                                          const std::string& tokenizer_json,
                                          const std::string& tokenizer_config_json,
                                          const std::string& config_json,
                                          std::optional<int64_t> vocab_size,
                                          const std::string& dir);

// Reads DIR/tokenizer.model when present, else DIR/tokenizer.json (IO error when neither is).
HfTokenizer read_hf_tokenizer(const std::filesystem::path& dir, std::optional<int64_t> vocab_size);

}  // namespace qforge
