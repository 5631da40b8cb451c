// libFuzzer target: tokenizer.model bytes (a SentencePiece ModelProto) through
// parse_sentencepiece_tokenizer, with and without a vocabulary size from config.json. Any
// exception other than qforge::Error, any crash or sanitizer report, or an accepted vocabulary
// whose token, score and type lists differ in length or whose special ids point past it, is a
// bug. Seeds: tests/fuzz/corpus/sentencepiece_model (small trained tokenizer.model files).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "importers/hf/hf_tokenizer.h"
#include "ir/error.h"

#include "abort_on_internal.h"

namespace {

void check(const std::string& bytes, std::optional<int64_t> vocab_size) {
  try {
    const qforge::HfTokenizer t = qforge::parse_sentencepiece_tokenizer(
        bytes, "", "", "", R"({"bos_token_id": 1, "eos_token_id": 2})", vocab_size, "fuzz");
    if (t.tokens.size() != t.token_types.size() || t.tokens.size() != t.scores.size()) {
      __builtin_trap();
    }
    if (vocab_size && t.tokens.size() != static_cast<size_t>(*vocab_size)) __builtin_trap();
    for (const auto& [name, id] : t.special_ids) {
      if (id >= t.tokens.size()) __builtin_trap();
    }
  } catch (const qforge::Error& e) {
    qforge::fuzz::abort_on_internal(e);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  check(bytes, std::nullopt);
  check(bytes, 300);
  return 0;
}
