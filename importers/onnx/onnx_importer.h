#pragma once
// Reads an ONNX model (protobuf) into the IR. External data is memory-mapped relative to the
// model's folder and must resolve inside it.
#include <filesystem>

#include "ir/graph.h"

namespace qforge {

// Throws Error: IO (cannot open/read), InvalidInput (not ONNX, truncated, bad external data,
// unknown dtype), Unsupported (valid ONNX that the IR does not hold).
Graph import_onnx(const std::filesystem::path& path);

}  // namespace qforge
