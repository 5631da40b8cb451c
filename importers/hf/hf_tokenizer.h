#pragma once
// The vocabulary of a Hugging Face model folder as llama.cpp's converter (convert_hf_to_gguf.py
// `get_vocab_base`, `_set_vocab_gpt2`, gguf-py `SpecialVocab`) puts it into GGUF: tokens in id
// order, their types, the BPE merges, the special token ids and flags, and the pre-tokenizer
// name (tokenizer.ggml.pre). Reads tokenizer.json (byte-level BPE), tokenizer_config.json and
// config.json. SentencePiece vocabularies (tokenizer.model, or a BPE with byte fallback and a
// Metaspace pre-tokenizer) are refused as Unsupported.
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

// Reads DIR/tokenizer.json (IO error when missing, Unsupported with tokenizer.model alone).
HfTokenizer read_hf_tokenizer(const std::filesystem::path& dir, std::optional<int64_t> vocab_size);

}  // namespace qforge
