#include "runtime/op_context.h"

#include "ir/error.h"

namespace qforge::ops {

const Tensor& OpContext::input(size_t i) const {
  if (!has_input(i)) {
    const std::string name = i < node_.inputs.size() ? " '" + node_.inputs[i] + "'" : "";
    fail_invalid("needs input " + std::to_string(i) + name + ", which is absent");
  }
  return *inputs[i];
}

bool OpContext::wants_output(size_t i) const {
  return i < node_.outputs.size() && !node_.outputs[i].empty();
}

void OpContext::set_output(size_t i, Tensor t) {
  if (i >= outputs.size()) {
    fail_internal(label() + " set output " + std::to_string(i) + " of " +
                  std::to_string(outputs.size()));
  }
  outputs[i] = std::move(t);
}

const Attribute* OpContext::typed_attr(std::string_view name, AttrType type) const {
  const Attribute* a = node_.attr(name);
  if (a != nullptr && a->type != type) {
    fail_invalid("attribute '" + std::string(name) + "' has the wrong type");
  }
  return a;
}

int64_t OpContext::attr_int(std::string_view name, int64_t fallback) const {
  const Attribute* a = typed_attr(name, AttrType::Int);
  return a ? a->i : fallback;
}

float OpContext::attr_float(std::string_view name, float fallback) const {
  const Attribute* a = typed_attr(name, AttrType::Float);
  return a ? a->f : fallback;
}

std::string OpContext::attr_string(std::string_view name, std::string_view fallback) const {
  const Attribute* a = typed_attr(name, AttrType::String);
  return a ? a->s : std::string(fallback);
}

std::optional<std::vector<int64_t>> OpContext::attr_ints(std::string_view name) const {
  const Attribute* a = typed_attr(name, AttrType::Ints);
  if (!a) return std::nullopt;
  return a->ints;
}

std::optional<std::vector<float>> OpContext::attr_floats(std::string_view name) const {
  const Attribute* a = typed_attr(name, AttrType::Floats);
  if (!a) return std::nullopt;
  return a->floats;
}

const Tensor* OpContext::attr_tensor(std::string_view name) const {
  const Attribute* a = typed_attr(name, AttrType::Tensor);
  return a ? &a->t : nullptr;
}

std::string OpContext::label() const {
  std::string op = node_.domain.empty() || node_.domain == "ai.onnx"
                       ? node_.op_type
                       : node_.domain + "." + node_.op_type;
  std::string out = "op '";
  out.append(op).append("' (node ");
  if (node_.name.empty()) {
    out.append("#").append(std::to_string(node_index_));
  } else {
    out.append("'").append(node_.name).append("'");
  }
  return out.append(")");
}

void OpContext::fail_invalid(const std::string& what) const {
  throw Error(ErrorCategory::InvalidInput, label() + ": " + what);
}

void OpContext::fail_unsupported(const std::string& what) const {
  throw Error(ErrorCategory::Unsupported, label() + ": " + what);
}

void OpContext::fail_dtype(size_t input_index) const {
  const std::string name =
      input_index < node_.inputs.size() ? " '" + node_.inputs[input_index] + "'" : "";
  fail_dtype_of("input " + std::to_string(input_index) + name, input(input_index).dtype());
}

void OpContext::fail_dtype_of(const std::string& what, DType dtype) const {
  fail_unsupported(what + " has dtype " + std::string(dtype_name(dtype)) +
                   ", which the qforge runtime does not support for this op");
}

}  // namespace qforge::ops
