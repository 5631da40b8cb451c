// Matching a data block's arrays to the model's inputs: names, dtypes, shapes, sample counts.
#include "importers/dataset/block_layout.h"

#include <optional>

#include "importers/torch/byte_io.h"
#include "ir/error.h"

namespace qforge::dataset_detail {

using torch_detail::printable;
using torch_detail::quote;

namespace {

std::string dims_string(const std::vector<Dim>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i > 0) s += ", ";
    s += dims[i].value           ? std::to_string(*dims[i].value)
         : dims[i].param.empty() ? "?"
                                 : dims[i].param;
  }
  return s + "]";
}

std::string_view numpy_name(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return "float32";
    case DType::F16:
      return "float16";
    case DType::F64:
      return "float64";
    case DType::I64:
      return "int64";
    case DType::I32:
      return "int32";
    case DType::I16:
      return "int16";
    case DType::I8:
      return "int8";
    case DType::U8:
      return "uint8";
    case DType::Bool:
      return "bool";
    default:
      return dtype_name(dtype);
  }
}

}  // namespace

Shape row_shape(const BlockArray& a, bool sample_axis) {
  return sample_axis ? Shape(a.shape.begin() + 1, a.shape.end()) : a.shape;
}

BlockLayout match_inputs(const DataBlock& block, const std::vector<ValueInfo>& inputs,
                         const std::string& here, bool single_array_file) {
  BlockLayout info;
  const std::vector<BlockArray>& arrays = block.arrays();
  std::vector<bool> used(arrays.size(), false);
  std::optional<int64_t> rows;
  std::string rows_from;
  for (const ValueInfo& in : inputs) {
    size_t a = arrays.size();
    for (size_t k = 0; k < arrays.size(); ++k) {
      // A .npy holds one unnamed array: the model's only input.
      if (arrays[k].name == in.name || (arrays[k].name.empty() && inputs.size() == 1)) a = k;
    }
    if (a == arrays.size()) {
      if (single_array_file) {
        fail_invalid(here + " is an .npy, which holds one array, but the model has " +
                     std::to_string(inputs.size()) + " inputs; use an .npz keyed by input name");
      }
      std::string msg = here + " has no array for input " + quote(in.name) + "; it holds ";
      for (size_t k = 0; k < arrays.size(); ++k) {
        if (k > 0) msg += ", ";
        msg += quote(printable(arrays[k].name));
      }
      msg += " (arrays are matched to model inputs by name)";
      fail_invalid(msg);
    }
    used[a] = true;
    const BlockArray& arr = arrays[a];
    if (in.dtype && *in.dtype != arr.dtype) {
      fail_invalid(here + ": input " + quote(in.name) + " is " +
                   std::string(dtype_name(arr.dtype)) + " but the model expects " +
                   std::string(dtype_name(*in.dtype)) + "; convert it (e.g. x.astype(numpy." +
                   std::string(numpy_name(*in.dtype)) + "))");
    }
    bool axis = !arr.shape.empty();
    if (in.shape) {
      const std::vector<Dim>& dims = *in.shape;
      axis = arr.shape.size() == dims.size();
      bool ok = axis || arr.shape.size() + 1 == dims.size();
      for (size_t d = 1; ok && d < dims.size(); ++d) {
        const int64_t have = arr.shape[axis ? d : d - 1];
        ok = !dims[d].value || *dims[d].value == have;
      }
      if (!ok) {
        fail_invalid(here + ": input " + quote(in.name) + " has shape " +
                     shape_to_string(arr.shape) + " but the model expects " + dims_string(dims));
      }
    } else if (!axis) {
      fail_invalid(here + ": input " + quote(in.name) + " is a scalar; samples lie along axis 0");
    }
    const int64_t n = axis ? arr.shape[0] : 1;
    if (rows && *rows != n) {
      std::string msg =
          here + ": input " + quote(in.name) + " has " + std::to_string(n) + " sample(s) but ";
      msg += rows_from;
      msg += " has " + std::to_string(*rows) + "; give every input the same count along axis 0";
      fail_invalid(msg);
    }
    rows = n;
    rows_from = "input " + quote(in.name);
    info.input_array.push_back(a);
    info.sample_axis.push_back(axis);
    info.row_shapes.push_back(row_shape(arr, axis));
  }
  info.rows = *rows;
  const bool per_sample_file = !info.sample_axis.front();
  for (size_t k = 0; k < arrays.size(); ++k) {
    const BlockArray& arr = arrays[k];
    if (used[k] || arr.name.empty()) continue;
    const bool axis = !per_sample_file && !arr.shape.empty() && arr.shape[0] == info.rows;
    if (!axis && !per_sample_file) continue;  // not aligned with the samples: left alone
    info.extras[arr.name] = {k, axis, arr.dtype, row_shape(arr, axis)};
  }
  return info;
}

}  // namespace qforge::dataset_detail
