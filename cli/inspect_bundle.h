#pragma once
// What `qforge inspect NAME.qfb` shows: the manifest (format, producer, source, files with size,
// SHA-256 and their verification state), the scheme and passes it was built with, the model's
// inputs and outputs, a summary of the quantized tensors and report.json's per-layer errors.
#include <filesystem>

#include "cli/app.h"

namespace qforge::cli {

// Reads and verifies the bundle (a missing or modified file is shown, not thrown: the result's
// "verified" is false). Throws Error for a folder or manifest that cannot be read at all.
Json describe_bundle(const std::filesystem::path& dir);
void print_bundle_text(const Json& j);

}  // namespace qforge::cli
