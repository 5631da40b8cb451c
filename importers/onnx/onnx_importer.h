#pragma once
// Reads an ONNX model (protobuf) into the IR. External data is memory-mapped relative to the
// model's folder and must resolve inside it.
#include <cstddef>
#include <filesystem>
#include <span>
#include <string_view>

#include "ir/graph.h"

namespace qforge {

// Throws Error: IO (cannot open/read), InvalidInput (not ONNX, truncated, bad external data,
// unknown dtype), Unsupported (valid ONNX that the IR does not hold).
Graph import_onnx(const std::filesystem::path& path);

// The same from bytes already in memory (the fuzzer's entry point). External data resolves
// inside `base_dir`; `source_name` names the model in error messages. Tensors with data inside
// the protobuf are copied, so `bytes` may be freed afterwards.
Graph import_onnx_bytes(std::span<const std::byte> bytes, const std::filesystem::path& base_dir,
                        std::string_view source_name = "<memory>");

}  // namespace qforge
