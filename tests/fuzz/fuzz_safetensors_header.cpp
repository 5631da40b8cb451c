// libFuzzer target: safetensors header parsing and validation on arbitrary bytes.
// Seeds: tests/fuzz/corpus/safetensors_header/ (small valid files). Any exception other than
// qforge::Error, any crash or sanitizer report, or an accepted tensor outside the input is a bug.
// Built by tests/fuzz/CMakeLists.txt (-DQFORGE_FUZZ=ON), or by hand:
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -I. -Ibuild/generated \
//     tests/fuzz/fuzz_safetensors_header.cpp importers/safetensors/*.cpp ir/tensor.cpp \
//     ir/dtype.cpp ir/error.cpp ir/graph.cpp ir/mapped_file.cpp -lspdlog -lfmt -o fuzz_st
//   mkdir corpus && cp tests/fuzz/corpus/safetensors_header/* corpus/
//   ./fuzz_st -max_total_time=600 -max_len=4096 corpus
#include <cstddef>
#include <cstdint>
#include <span>

#include "importers/safetensors/safetensors_reader.h"
#include "ir/error.h"

#include "abort_on_internal.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const qforge::Graph graph =
        qforge::import_safetensors_bytes(std::as_bytes(std::span(data, size)), "fuzz");
    uint8_t sink = 0;
    for (const auto& [name, tensor] : graph.initializers()) {
      const size_t storage_size = tensor.storage()->bytes().size();
      if (storage_size != size || tensor.offset() > size ||
          tensor.nbytes() > size - tensor.offset()) {
        __builtin_trap();
      }
      for (std::byte b : tensor.bytes()) sink ^= static_cast<uint8_t>(b);  // touch every byte
    }
    static volatile uint8_t keep;
    keep = sink;
  } catch (const qforge::Error& e) {
    qforge::fuzz::abort_on_internal(e);
    // Rejected input: the expected outcome for almost every mutation.
  }
  return 0;
}
