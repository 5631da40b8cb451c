#pragma once
// Parses ONNX model bytes into protobuf. The top levels of the model are first located in
// protobuf wire format without parsing them, so that initializer raw_data is later copied
// once, straight from the file into its tensor, instead of into a protobuf string first (which
// doubles both the time and the peak memory of importing a large model). Everything else is
// parsed by protobuf.
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <onnx/onnx_pb.h>

namespace qforge {

struct SplitInitializer {
  std::string proto;                                   // the TensorProto without raw_data
  std::optional<std::span<const std::byte>> raw_data;  // its raw_data, a window of the input
};

struct SplitModel {
  std::string model;  // the ModelProto without its graph
  std::string graph;  // the main GraphProto without its initializers
  std::vector<SplitInitializer> initializers;  // in file order
};

// nullopt unless `bytes` is well-formed wire format with exactly one graph and at most one
// raw_data per top-level initializer, all length-delimited; the caller then parses the whole
// model with protobuf, which has the same semantics and reports what is wrong.
std::optional<SplitModel> split_onnx_model(std::span<const std::byte> bytes);

struct ParsedInitializer {
  onnx::TensorProto proto;
  std::optional<std::span<const std::byte>> raw_data;  // set when found outside `proto`
};

struct ParsedOnnxModel {
  onnx::ModelProto model;
  // The main graph's initializers when they were split off (then model.graph() has none);
  // empty when the model was parsed whole.
  std::vector<ParsedInitializer> initializers;
};

// Throws InvalidInput naming `source` when the bytes are not a protobuf ModelProto with an
// ir_version and a graph. Raw data windows point into `bytes`, which must outlive the result.
ParsedOnnxModel parse_onnx_model(std::span<const std::byte> bytes, const std::string& source);

}  // namespace qforge
