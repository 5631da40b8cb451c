#pragma once
// ONNX TensorProto -> IR Tensor. Data inside the protobuf is copied into an owned buffer;
// external data is a window of the memory-mapped data file, which must lie inside the model's
// folder. Every size and offset is checked before any allocation or access.
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <onnx/onnx_pb.h>

#include "ir/tensor.h"

namespace qforge {

// "float", "int4", ... for an ONNX TensorProto.DataType value; "" for numbers ONNX does not
// define.
std::string_view onnx_type_name(int onnx_type);

// The IR dtype of an ONNX element type. `what` names the tensor or value for messages, e.g.
// "tensor 'w' of 'model.onnx'". Throws InvalidInput for numbers ONNX does not define and
// Unsupported for types the IR lacks (string, uint16, float8, ...). UNDEFINED (0) gives nullopt.
std::optional<DType> dtype_from_onnx_checked(int onnx_type, std::string_view what);

class OnnxTensorReader {
 public:
  // `model_dir` is where external data files must live; `source` names the model in messages.
  // `release_windows`: the raw_data windows read() is given lie in a read-only file mapping,
  // whose pages it drops once their bytes are copied (release_mapped_pages).
  OnnxTensorReader(std::filesystem::path model_dir, std::string source,
                   bool release_windows = false);

  // Converts `proto`, releasing its embedded raw_data once copied to keep memory bounded.
  // `label` names the tensor in messages ("tensor 'w'"). `raw_data`, when given, is the
  // tensor's raw_data found outside the parsed proto (see onnx_wire.h).
  Tensor read(onnx::TensorProto& proto, const std::string& label,
              std::optional<std::span<const std::byte>> raw_data = std::nullopt);

  const std::string& source() const { return source_; }

 private:
  static Tensor read_embedded(onnx::TensorProto& proto,
                              std::optional<std::span<const std::byte>> raw_data, DType dtype,
                              Shape shape, size_t nbytes, const std::string& where,
                              bool release_window);
  Tensor read_external(const onnx::TensorProto& proto, DType dtype, Shape shape, size_t nbytes,
                       const std::string& where);
  std::shared_ptr<const Storage> map_data_file(const std::string& location,
                                               const std::string& where);

  std::filesystem::path model_dir_;
  std::filesystem::path canonical_dir_;
  std::string source_;
  bool release_windows_ = false;
  // One mapping per data file, shared by all tensors that live in it.
  std::map<std::filesystem::path, std::shared_ptr<const Storage>> files_;
};

}  // namespace qforge
