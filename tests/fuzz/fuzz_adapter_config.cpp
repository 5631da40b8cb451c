// libFuzzer target: adapter_config.json bytes through parse_lora_config, then the rank/alpha
// pattern rule on a few module names. Any exception other than qforge::Error, any crash or
// sanitizer report, or an accepted config with r <= 0 or a non-finite scaling is a bug.
// Seeds: the adapter_config.json files of tests/interop/fixtures/make_peft_adapters.py output.
// Built by tests/fuzz/CMakeLists.txt (-DQFORGE_FUZZ=ON), or by hand:
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -I. \
//     tests/fuzz/fuzz_adapter_config.cpp importers/lora/lora_config.cpp ir/error.cpp \
//     -o fuzz_adapter_config
//   mkdir corpus && for d in FIXTURES/*/; do cp "$d/adapter_config.json" corpus/$(basename
//   $d).json; done
//   ./fuzz_adapter_config -max_total_time=600 -max_len=8192 corpus
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "importers/lora/lora_config.h"
#include "ir/error.h"

#include "abort_on_internal.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const qforge::LoraConfig config = qforge::parse_lora_config(text, "fuzz/adapter_config.json");
    if (config.r <= 0 || !std::isfinite(config.lora_alpha)) __builtin_trap();
    for (const char* module :
         {"model.layers.0.self_attn.q_proj", "bert.encoder.layer.11.output.dense",
          "transformer.h.0.attn.c_attn", "emb"}) {
      const qforge::ModuleScaling s = qforge::resolve_module_scaling(config, module);
      if (s.r <= 0 || !std::isfinite(s.alpha) || std::isnan(s.scaling)) __builtin_trap();
    }
  } catch (const qforge::Error& e) {
    qforge::fuzz::abort_on_internal(e);
    // Rejected input: the expected outcome for almost every mutation.
  }
  return 0;
}
