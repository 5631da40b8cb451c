#pragma once
// Checks on where a command writes, done before any work: the kind of output from its
// extension, its folder exists, and it is not the input.
#include <filesystem>

namespace qforge::cli {

enum class OutputKind { Onnx, Safetensors, Bundle, HfFolder };

struct OutputPath {
  OutputKind kind;
};

// Throws Usage (same file as input, unknown extension) or IO (folder missing).
// A bundle (NAME.qfb) is a folder: an existing one is refused unless `overwrite`. A path
// without an extension, or ending in '/', is a Hugging Face model folder, refused the same way.
OutputPath check_output_path(const std::filesystem::path& input,
                             const std::filesystem::path& output, bool overwrite = false);

}  // namespace qforge::cli
