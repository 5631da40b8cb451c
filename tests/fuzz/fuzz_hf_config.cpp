// libFuzzer target: config.json bytes of a Hugging Face model folder through parse_hf_config.
// Any exception other than qforge::Error, any crash or sanitizer report, or an accepted config
// with a negative figure (sizes, heads, head_dim) is a bug.
// Seeds: tests/fuzz/corpus/hf_config (configs as transformers writes them).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "importers/hf/hf_folder.h"
#include "ir/error.h"

#include "abort_on_internal.h"

namespace {

bool bad_size(const std::optional<int64_t>& v) { return v && *v < 0; }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const qforge::HfConfig c = qforge::parse_hf_config(text, "fuzz/config.json");
    if (bad_size(c.num_hidden_layers) || bad_size(c.hidden_size) ||
        bad_size(c.intermediate_size) || bad_size(c.vocab_size) ||
        bad_size(c.num_key_value_heads) || bad_size(c.max_position_embeddings) ||
        bad_size(c.num_attention_heads) || bad_size(c.head_dim)) {
      __builtin_trap();
    }
  } catch (const qforge::Error& e) {
    qforge::fuzz::abort_on_internal(e);
  }
  return 0;
}
