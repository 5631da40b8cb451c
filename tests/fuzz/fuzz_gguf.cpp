// libFuzzer target: GGUF file bytes through parse_gguf (header, metadata, tensor infos).
// Any exception other than qforge::Error, any crash or sanitizer report, or an accepted file
// whose tensor data would lie outside the bytes given, is a bug.
// Seeds: tests/fuzz/corpus/gguf (small files of every tensor type and value type).
#include <cstddef>
#include <cstdint>
#include <span>

#include "importers/gguf/gguf_reader.h"
#include "ir/error.h"

#include "abort_on_internal.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    const qforge::gguf::GgufFile g = qforge::gguf::parse_gguf(bytes, "fuzz.gguf");
    for (const auto& t : g.tensors) {
      if (g.data_offset > size || t.offset > size - g.data_offset ||
          t.nbytes > size - g.data_offset - t.offset || t.offset % g.alignment != 0) {
        __builtin_trap();
      }
    }
  } catch (const qforge::Error& e) {
    qforge::fuzz::abort_on_internal(e);
  }
  return 0;
}
