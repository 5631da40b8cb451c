#include "exporters/safetensors/safetensors_file_writer.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include <nlohmann/json.hpp>

#include "exporters/write_pieces.h"
#include "ir/error.h"

namespace qforge::safetensors_out {

namespace {

struct StoredAs {
  std::string_view name;  // safetensors dtype
  int rank;               // the Rust library's order: larger alignment first
};

StoredAs stored_as(DType dtype) {
  switch (dtype) {
    case DType::I64:
      return {"I64", 10};
    case DType::F64:
      return {"F64", 9};
    case DType::F32:
      return {"F32", 8};
    case DType::I32:
      return {"I32", 7};
    case DType::BF16:
      return {"BF16", 6};
    case DType::F16:
      return {"F16", 5};
    case DType::I16:
      return {"I16", 4};
    case DType::I8:
      return {"I8", 3};
    case DType::U8:
    case DType::I4:  // packed bytes
    case DType::U4:
      return {"U8", 2};
    case DType::Bool:
      return {"BOOL", 1};
  }
  fail_internal("safetensors writer: unhandled dtype " + std::to_string(static_cast<int>(dtype)));
}

bool is_packed(DType dtype) { return dtype_bits(dtype) == 4; }

// A JSON string literal, escaped as serde_json escapes it (the same rules as nlohmann's).
// `what` and `whose` name the string in the error: "tensor name", "value of metadata key" + key.
std::string quoted(const std::string& s, std::string_view what, std::string_view whose = {}) {
  try {
    return nlohmann::json(s).dump();
  } catch (const nlohmann::json::type_error&) {
    std::string msg = "cannot write safetensors: a ";
    msg.append(what).append(whose.empty() ? "" : " '").append(whose);
    msg.append(whose.empty() ? "" : "'").append(" is not valid UTF-8; fix or rename it");
    fail_invalid(msg);
  }
}

std::string dims_json(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

}  // namespace

std::string build_safetensors_header(std::vector<OutTensor>& tensors,
                                     std::map<std::string, std::string> metadata) {
  std::stable_sort(tensors.begin(), tensors.end(), [](const OutTensor& a, const OutTensor& b) {
    const int ra = stored_as(a.tensor->dtype()).rank;
    const int rb = stored_as(b.tensor->dtype()).rank;
    return ra != rb ? ra > rb : a.name < b.name;
  });
  for (const auto& t : tensors) {
    if (!is_packed(t.tensor->dtype())) continue;
    metadata[std::string(kPackedDTypePrefix) + t.name] = std::string(dtype_name(t.tensor->dtype()));
    metadata[std::string(kPackedShapePrefix) + t.name] = dims_json(t.tensor->shape());
  }

  std::string h = "{";
  if (!metadata.empty()) {
    h += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [key, value] : metadata) {
      if (!first) h += ',';
      first = false;
      h += quoted(key, "metadata key");
      h += ':';
      h += quoted(value, "value of metadata key", key);
    }
    h += '}';
  }
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    const Tensor& x = *t.tensor;
    const Shape shape = is_packed(x.dtype()) ? Shape{static_cast<int64_t>(x.nbytes())} : x.shape();
    if (h.size() > 1) h += ',';
    h += quoted(t.name, "tensor name");
    h += R"(:{"dtype":")";
    h += stored_as(x.dtype()).name;
    h += R"(","shape":)";
    h += dims_json(shape);
    h += R"(,"data_offsets":[)";
    h += std::to_string(offset);
    h += ',';
    h += std::to_string(offset + x.nbytes());
    h += "]}";
    offset += x.nbytes();
  }
  h += '}';
  h.append((8 - h.size() % 8) % 8, ' ');
  return h;
}

void write_safetensors_file(const std::filesystem::path& path, std::vector<OutTensor> tensors,
                            const std::map<std::string, std::string>& metadata) {
  const std::string header = build_safetensors_header(tensors, metadata);
  const auto closer = [](std::FILE* f) { std::fclose(f); };
  std::unique_ptr<std::FILE, decltype(closer)> file(std::fopen(path.c_str(), "wb"), closer);
  if (!file) fail_io("cannot create '" + path.string() + "': " + std::strerror(errno));
  const auto put = [&](const void* data, size_t size) {
    if (!fwrite_pieces(file.get(), data, size)) {
      fail_io("cannot write '" + path.string() + "': " + std::strerror(errno) + " (disk full?)");
    }
  };
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(header.size() >> (8 * i));
  put(len, sizeof len);
  put(header.data(), header.size());
  for (const auto& t : tensors) put(t.tensor->bytes().data(), t.tensor->nbytes());
  if (std::fclose(file.release()) != 0) {
    fail_io("cannot write '" + path.string() + "': " + std::strerror(errno) + " (disk full?)");
  }
}

}  // namespace qforge::safetensors_out
