#pragma once
// torch's element types as torch.save names them: the dtype global (`torch.float32`, used by
// _rebuild_tensor_v3), the legacy typed-storage class (`torch.FloatStorage`, used by
// _rebuild_tensor_v2) and the IR dtype, where the IR has one.
#include <cstdint>
#include <optional>
#include <string_view>

#include "ir/dtype.h"

namespace qforge {

struct TorchDType {
  std::string_view name;       // torch.<name>, e.g. "bfloat16"
  std::string_view storage;    // torch.<storage>, e.g. "BFloat16Storage"; "" when there is none
  std::optional<DType> dtype;  // nullopt: a torch dtype qforge does not hold
  uint32_t itemsize;
};

// By dtype name ("float32") or by storage class name ("FloatStorage"); nullptr if unknown.
const TorchDType* torch_dtype_by_name(std::string_view name);
const TorchDType* torch_dtype_by_storage(std::string_view storage);

}  // namespace qforge
