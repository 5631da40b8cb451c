#pragma once
// Writes an IR graph as an ONNX model, atomically (temporary file beside the target, then
// rename). Weights go to an external data file when asked or when the model exceeds 2 GB.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

#include "ir/graph.h"

namespace qforge {

struct OnnxExportOptions {
  bool external_data = false;         // force external data
  std::string external_data_name;     // file name beside the model; default "<model>.data"
  size_t external_threshold = 1024;   // tensors at least this big go external
  // Without external_data, weights go external anyway once all tensors together exceed this:
  // protobuf cannot hold a message over 2 GiB (the margin is for the graph itself).
  uint64_t auto_external_bytes = (uint64_t{1} << 31) - (uint64_t{64} << 20);
  bool run_checker = true;            // onnx::checker where the model's opset allows
  // Embedded initializers of the main graph at least this big (and not empty) are written
  // straight from their storage, not copied into the protobuf message first (the bytes are
  // the same).
  size_t streamed_threshold = size_t{64} << 10;
};

void export_onnx(const Graph& graph, const std::filesystem::path& path,
                 const OnnxExportOptions& options = {});

}  // namespace qforge
