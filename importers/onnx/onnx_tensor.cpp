#include "importers/onnx/onnx_tensor.h"

#include <array>
#include <bit>
#include <cstring>

#include "ir/error.h"
#include "ir/page_release.h"

namespace qforge {

static_assert(std::endian::native == std::endian::little,
              "ONNX raw_data is little-endian; big-endian hosts would need byte swapping");

namespace {

// TensorProto.DataType names, indexed by value (onnx.proto as of ONNX 1.20).
constexpr std::array<std::string_view, 29> kOnnxTypeNames = {
    "undefined",  "float",        "uint8",          "int8",       "uint16",         "int16",
    "int32",      "int64",        "string",         "bool",       "float16",        "double",
    "uint32",     "uint64",       "complex64",      "complex128", "bfloat16",       "float8e4m3fn",
    "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz", "uint4",     "int4",           "float4e2m1",
    "float8e8m0", "uint2",        "int2",           "float6e2m3", "float6e3m2"};

// Which typed field ONNX uses for each IR dtype when raw_data is absent.
enum class TypedField { Float, Int32, Int64, Double };

TypedField typed_field(DType dtype) {
  switch (dtype) {
    case DType::F32: return TypedField::Float;
    case DType::F64: return TypedField::Double;
    case DType::I64: return TypedField::Int64;
    default: return TypedField::Int32;
  }
}

std::string_view typed_field_name(TypedField field) {
  switch (field) {
    case TypedField::Float: return "float_data";
    case TypedField::Int32: return "int32_data";
    case TypedField::Int64: return "int64_data";
    case TypedField::Double: return "double_data";
  }
  return "";
}

size_t typed_field_size(const onnx::TensorProto& p, TypedField field) {
  switch (field) {
    case TypedField::Float: return static_cast<size_t>(p.float_data_size());
    case TypedField::Int32: return static_cast<size_t>(p.int32_data_size());
    case TypedField::Int64: return static_cast<size_t>(p.int64_data_size());
    case TypedField::Double: return static_cast<size_t>(p.double_data_size());
  }
  return 0;
}

template <typename Dst, typename Src>
void store_values(const google::protobuf::RepeatedField<Src>& src, std::span<std::byte> out) {
  for (int i = 0; i < src.size(); ++i) {
    const Dst v = static_cast<Dst>(src.Get(i));
    std::memcpy(out.data() + static_cast<size_t>(i) * sizeof(Dst), &v, sizeof(Dst));
  }
}

// Narrows int32_data to the dtype's width, as ONNX stores every small type there.
void store_int32_data(const onnx::TensorProto& p, DType dtype, std::span<std::byte> out) {
  const auto& src = p.int32_data();
  switch (dtype) {
    case DType::I32: store_values<int32_t>(src, out); break;
    case DType::I16: store_values<int16_t>(src, out); break;
    case DType::F16:
    case DType::BF16: store_values<uint16_t>(src, out); break;  // bit patterns
    case DType::I8: store_values<int8_t>(src, out); break;
    case DType::U8:
    case DType::I4:  // each int32 holds one byte: two 4-bit values, low nibble first
    case DType::U4: store_values<uint8_t>(src, out); break;
    case DType::Bool:
      for (int i = 0; i < src.size(); ++i) out[static_cast<size_t>(i)] = std::byte{src.Get(i) != 0};
      break;
    default: fail_internal("store_int32_data: dtype " + std::string(dtype_name(dtype)));
  }
}

}  // namespace

std::string_view onnx_type_name(int onnx_type) {
  if (onnx_type < 0 || onnx_type >= static_cast<int>(kOnnxTypeNames.size())) return "";
  return kOnnxTypeNames[static_cast<size_t>(onnx_type)];
}

std::optional<DType> dtype_from_onnx_checked(int onnx_type, std::string_view what) {
  if (onnx_type == 0) return std::nullopt;
  if (const auto dtype = dtype_from_onnx(onnx_type)) return dtype;
  const std::string_view name = onnx_type_name(onnx_type);
  if (name.empty()) {
    fail_invalid("unknown dtype " + std::to_string(onnx_type) + " in " + std::string(what) +
                 ": the file is corrupt or needs a newer ONNX than qforge knows");
  }
  fail_unsupported(std::string(what) + " has dtype " + std::string(name) + " (" +
                   std::to_string(onnx_type) +
                   "), which qforge does not support; cast it to a supported type first");
}

OnnxTensorReader::OnnxTensorReader(std::filesystem::path model_dir, std::string source,
                                   bool release_windows)
    : model_dir_(std::move(model_dir)), source_(std::move(source)),
      release_windows_(release_windows) {
  std::error_code ec;
  canonical_dir_ = std::filesystem::weakly_canonical(
      model_dir_.empty() ? std::filesystem::path(".") : model_dir_, ec);
  if (ec) fail_io("cannot resolve the folder of '" + source_ + "': " + ec.message());
}

Tensor OnnxTensorReader::read(onnx::TensorProto& proto, const std::string& label,
                              std::optional<std::span<const std::byte>> raw_data) {
  const std::string where = label + " of '" + source_ + "'";
  const int type = proto.data_type();
  const auto dtype = dtype_from_onnx_checked(type, where);
  if (!dtype) fail_invalid(where + " has no data_type; the file is corrupt, re-export it");
  if (proto.has_segment()) {
    fail_unsupported(where + " is a segment of a larger tensor, which qforge does not support");
  }
  Shape shape(proto.dims().begin(), proto.dims().end());
  uint64_t numel = 0;
  try {
    numel = shape_numel(shape);
  } catch (const Error& e) {
    fail_invalid(where + ": " + e.what());
  }
  const auto nbytes = dtype_storage_bytes(*dtype, numel);
  if (!nbytes) fail_invalid(where + " has shape " + shape_to_string(shape) + ", too large to hold");
  const bool window = raw_data.has_value();  // not the proto's own string
  if (!raw_data && proto.has_raw_data()) raw_data = std::as_bytes(std::span(proto.raw_data()));
  if (proto.data_location() == onnx::TensorProto::EXTERNAL) {
    if (raw_data || typed_field_size(proto, typed_field(*dtype)) != 0) {
      fail_invalid(where + " has both external and embedded data; re-export the model");
    }
    return read_external(proto, *dtype, std::move(shape), *nbytes, where);
  }
  if (proto.data_location() != onnx::TensorProto::DEFAULT) {
    fail_invalid(where + " has unknown data_location " + std::to_string(proto.data_location()));
  }
  return read_embedded(proto, raw_data, *dtype, std::move(shape), *nbytes, where,
                       window && release_windows_);
}

Tensor OnnxTensorReader::read_embedded(onnx::TensorProto& proto,
                                       std::optional<std::span<const std::byte>> raw_data,
                                       DType dtype, Shape shape, size_t nbytes,
                                       const std::string& where, bool release_window) {
  const TypedField field = typed_field(dtype);
  size_t other_fields = static_cast<size_t>(proto.string_data_size()) +
                        static_cast<size_t>(proto.uint64_data_size());
  for (TypedField f : {TypedField::Float, TypedField::Int32, TypedField::Int64, TypedField::Double}) {
    if (f != field) other_fields += typed_field_size(proto, f);
  }
  if (other_fields != 0) {
    fail_invalid(where + " (" + std::string(dtype_name(dtype)) +
                 ") stores values in a field that ONNX reserves for other dtypes; re-export it");
  }
  const size_t typed_count = typed_field_size(proto, field);
  if (raw_data) {
    if (typed_count != 0) fail_invalid(where + " has both raw_data and " +
                                       std::string(typed_field_name(field)) + "; re-export it");
    if (raw_data->size() != nbytes) {
      fail_invalid(where + " has " + std::to_string(raw_data->size()) +
                   " bytes of raw_data but its shape " + shape_to_string(shape) + " of " +
                   std::string(dtype_name(dtype)) + " needs " + std::to_string(nbytes) +
                   "; the file is corrupt");
    }
    Tensor t = Tensor::copy_of(dtype, std::move(shape), *raw_data);
    std::string().swap(*proto.mutable_raw_data());  // free the copy the protobuf may hold
    if (release_window) release_mapped_pages(*raw_data);
    return t;
  }
  // Typed fields hold one value per element, except 4-bit types: one byte (two values) each.
  const uint64_t numel = shape_numel(shape);
  const uint64_t expected = dtype_bits(dtype) == 4 ? (numel + 1) / 2 : numel;
  if (typed_count != expected) {
    fail_invalid(where + " has " + std::to_string(typed_count) + " values in " +
                 std::string(typed_field_name(field)) + " but its shape " +
                 shape_to_string(shape) + " needs " + std::to_string(expected) +
                 "; the file is corrupt");
  }
  Tensor t(dtype, std::move(shape));
  const auto out = t.mutable_bytes();
  switch (field) {
    case TypedField::Float: store_values<float>(proto.float_data(), out); break;
    case TypedField::Double: store_values<double>(proto.double_data(), out); break;
    case TypedField::Int64: store_values<int64_t>(proto.int64_data(), out); break;
    case TypedField::Int32: store_int32_data(proto, dtype, out); break;
  }
  return t;
}

}  // namespace qforge
