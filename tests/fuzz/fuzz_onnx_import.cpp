// libFuzzer target for the ONNX importer: arbitrary bytes must either import or throw
// qforge::Error; anything else (a crash, another exception, a sanitizer report) is a bug.
// External data resolves inside an empty temporary folder, so a fuzzed location can only
// name files that do not exist (or, through "..", be rejected).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>

#include "importers/onnx/onnx_importer.h"
#include "ir/error.h"

namespace {

const std::filesystem::path& base_dir() {
  static const std::filesystem::path dir = [] {
    auto d = std::filesystem::temp_directory_path() /
             (std::string("qforge-fuzz-onnx-") + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    const qforge::Graph g = qforge::import_onnx_bytes(bytes, base_dir(), "fuzz-input");
    // Touch what was imported so that a bad window into storage shows up here.
    size_t sum = 0;
    for (const auto& [name, t] : g.initializers()) {
      for (std::byte b : t.bytes()) sum += static_cast<size_t>(b);
    }
    (void)sum;
  } catch (const qforge::Error&) {
    // Rejected with a message: the expected outcome for malformed input.
  }
  return 0;
}
