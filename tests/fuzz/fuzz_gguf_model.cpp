// libFuzzer target: GGUF file bytes through parse_gguf and then the GGUF model reader
// (importers/gguf/gguf_model_reader.h: metadata to config.json, names mapped back, Q/K rows
// un-permuted, Q4_0/Q8_0 blocks to int4/int8 values and scales, other types dequantized).
// Any exception other than qforge::Error, any crash or sanitizer report, or a quantized Linear
// whose scale does not fit its values, is a bug.
// Seeds: tests/fuzz/corpus/gguf_model (tiny one-layer llama and qwen3 files, Q4_0, Q8_0, Q4_1).
#include <cstddef>
#include <cstdint>
#include <span>

#include "importers/gguf/gguf_model_reader.h"
#include "importers/gguf/gguf_reader.h"
#include "ir/error.h"

#include "abort_on_internal.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    const qforge::gguf::GgufFile g = qforge::gguf::parse_gguf(bytes, "fuzz.gguf");
    const qforge::gguf::GgufDecoder d = qforge::gguf::read_gguf_decoder(g, bytes, "fuzz.gguf");
    for (const auto& r : d.graph.quant_records()) {
      const auto* values = d.graph.find_initializer(r.name);
      const auto* scale = d.graph.find_initializer(r.scale);
      if (values == nullptr || scale == nullptr || values->rank() != 2 ||
          scale->shape()[0] != values->shape()[0] ||
          scale->shape()[1] * r.block_size != values->shape()[1]) {
        __builtin_trap();
      }
    }
  } catch (const qforge::Error& e) {
    qforge::fuzz::abort_on_internal(e);
  }
  return 0;
}
