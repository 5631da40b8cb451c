// libFuzzer target: tokenizer.json bytes through parse_hf_tokenizer (and the same bytes as a
// config.json through parse_hf_decoder_facts). Any exception other than qforge::Error, any
// crash or sanitizer report, or an accepted vocabulary whose token and type lists differ in
// length or whose special ids point past it, is a bug.
// Seeds: tests/fuzz/corpus/hf_tokenizer (byte-level BPE tokenizer.json files).
#include <cstddef>
#include <cstdint>
#include <string>

#include "importers/hf/hf_decoder_facts.h"
#include "importers/hf/hf_tokenizer.h"
#include "ir/error.h"

#include "abort_on_internal.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const qforge::HfTokenizer t = qforge::parse_hf_tokenizer(text, "", text, std::nullopt, "fuzz");
    if (t.tokens.size() != t.token_types.size()) __builtin_trap();
    for (const auto& [name, id] : t.special_ids) {
      if (id >= t.tokens.size()) __builtin_trap();
    }
  } catch (const qforge::Error& e) {
    qforge::fuzz::abort_on_internal(e);
  }
  try {
    qforge::parse_hf_decoder_facts(text, "fuzz/config.json");
  } catch (const qforge::Error& e) {
    qforge::fuzz::abort_on_internal(e);
  }
  return 0;
}
