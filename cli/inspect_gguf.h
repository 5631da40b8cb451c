#pragma once
// What `qforge inspect model.gguf` shows: version, architecture, tensor count and bytes per
// GGUF type, every metadata key (arrays as their element type and length), and the tensors.
#include <filesystem>

#include "cli/app.h"

namespace qforge::cli {

// Throws InvalidInput (naming the problem and byte offset) for a malformed file.
Json describe_gguf(const std::filesystem::path& file);
void print_gguf_text(const Json& j);

}  // namespace qforge::cli
