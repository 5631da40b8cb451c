// libFuzzer target for the ONNX importer: arbitrary bytes must either import or throw
// qforge::Error; anything else (a crash, another exception, a sanitizer report) is a bug.
// External data resolves inside a folder that is never created, so a fuzzed location can only
// name files that do not exist (or, through "..", a link or an absolute path, be rejected).
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>

#include "importers/onnx/onnx_importer.h"
#include "ir/error.h"

#include "abort_on_internal.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::filesystem::path base_dir =
      std::filesystem::temp_directory_path() / "qforge-fuzz-onnx-no-such-folder";
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    const qforge::Graph g = qforge::import_onnx_bytes(bytes, base_dir, "fuzz-input");
    // Read every imported byte so that a bad window into storage shows up here.
    size_t sum = 0;
    for (const auto& [name, t] : g.initializers()) {
      for (std::byte b : t.bytes()) sum += static_cast<size_t>(b);
    }
    volatile size_t sink = sum;
    (void)sink;
  } catch (const qforge::Error& e) {
    qforge::fuzz::abort_on_internal(e);
    // Rejected with a message: the expected outcome for malformed input.
  }
  return 0;
}
