#include "cli/inspect_gguf.h"

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "importers/gguf/gguf_reader.h"
#include "ir/gguf_decoder_names.h"

namespace qforge::cli {

namespace {

const char* value_type_name(gguf::ValueType t) {
  static const char* names[] = {"u8",  "i8",   "u16",    "i16",   "u32", "i32", "f32",
                                "bool", "string", "array", "u64", "i64", "f64"};
  const auto i = static_cast<uint32_t>(t);
  return i < std::size(names) ? names[i] : "?";
}

// Strings from the file need not be UTF-8 (a byte-level token can be half a character): invalid
// bytes become U+FFFD so that the JSON can be printed.
Json sanitized(const nlohmann::json& v) {
  return Json::parse(v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

// The scheme view `inspect` shows for a quantized folder, from the tensor types alone: how
// `convert model.gguf` reads the layer Linears back (Q4_0 int4 and Q8_0 int8, group 32,
// symmetric; Q4_1 asymmetric, refused by the symmetric layouts), which stay float, and the
// output projection (always read as float). Null when no layer Linear is quantized.
Json describe_gguf_scheme(const gguf::GgufFile& g) {
  std::map<std::string, int64_t> by_type;
  std::vector<std::string> float_linears;
  int64_t quantized = 0;
  for (const auto& t : g.tensors) {
    bool linear = false;
    if (t.name.starts_with("blk.")) {
      const auto dot = t.name.find('.', 4);
      const std::string rest = dot == std::string::npos ? "" : t.name.substr(dot + 1);
      for (const auto& lt : gguf::decoder_layer_tensors()) {
        if (lt.shape.size() == 2 && rest == lt.gguf) linear = true;
      }
    }
    if (!linear && t.name != "output.weight") continue;
    const bool q = t.type == gguf::TensorType::Q4_0 || t.type == gguf::TensorType::Q8_0 ||
                   t.type == gguf::TensorType::Q4_1;
    if (!linear || !q) {
      float_linears.push_back(sanitized(t.name).get<std::string>());
      continue;
    }
    ++by_type[std::string(gguf::tensor_type_info(t.type).name)];
    ++quantized;
  }
  if (quantized == 0) return Json(nullptr);
  Json schemes = Json::array();
  std::string format;
  for (const auto& [type, n] : by_type) {
    format += (format.empty() ? "" : "+") + type;
    schemes.push_back({{"type", type},
                       {"bits", type == "Q8_0" ? 8 : 4},
                       {"group_size", 32},
                       {"strategy", "group"},
                       {"symmetric", type != "Q4_1"},
                       {"linears", n}});
  }
  return {{"quant_method", "gguf"},
          {"format", format},
          {"schemes", schemes},
          {"quantized_linears", quantized},
          {"float_linears", float_linears}};
}

}  // namespace

Json describe_gguf(const std::filesystem::path& file) {
  const gguf::GgufModel m = gguf::read_gguf(file);
  const gguf::GgufFile& g = m.file;
  Json j;
  j["file"] = file.string();
  j["format"] = "gguf";
  j["version"] = g.version;
  j["alignment"] = g.alignment;
  const gguf::KeyValue* arch = g.find("general.architecture");
  j["architecture"] =
      arch != nullptr && arch->value.is_string() ? sanitized(arch->value) : Json();
  Json meta = Json::object();
  for (const auto& kv : g.metadata) {
    if (kv.type == gguf::ValueType::Array) {
      const std::string type = std::string("array[") + value_type_name(kv.element_type) + "]";
      meta[sanitized(kv.key).get<std::string>()] = {{"type", type}, {"length", kv.value.size()}};
    } else {
      meta[sanitized(kv.key).get<std::string>()] = sanitized(kv.value);
    }
  }
  j["metadata"] = meta;
  std::map<std::string, std::pair<uint64_t, uint64_t>> by_type;  // tensors, bytes
  Json tensors = Json::array();
  for (const auto& t : g.tensors) {
    const std::string type(gguf::tensor_type_info(t.type).name);
    auto& [count, bytes] = by_type[type];
    ++count;
    bytes += t.nbytes;
    tensors.push_back(
        {{"name", sanitized(t.name)}, {"type", type}, {"ne", t.ne}, {"bytes", t.nbytes}});
  }
  Json types = Json::object();
  for (const auto& [type, cb] : by_type) {
    types[type] = {{"tensors", cb.first}, {"bytes", cb.second}};
  }
  j["tensor_count"] = g.tensors.size();
  j["types"] = types;
  j["tensors"] = tensors;
  j["quantization"] = describe_gguf_scheme(g);
  return j;
}

void print_gguf_text(const Json& j) {
  std::printf("%s: GGUF v%u, architecture %s, %zu tensors\n", j["file"].get<std::string>().c_str(),
              j["version"].get<unsigned>(),
              j["architecture"].is_null() ? "?" : j["architecture"].get<std::string>().c_str(),
              j["tensor_count"].get<size_t>());
  for (const auto& [type, cb] : j["types"].items()) {
    std::printf("  %-5s %llu tensors, %s\n", type.c_str(),
                cb["tensors"].get<unsigned long long>(), human_bytes(cb["bytes"]).c_str());
  }
  if (const Json& q = j["quantization"]; !q.is_null()) {
    std::printf("  quantized: gguf %s, %lld layer Linears (as `convert` reads them back)\n",
                q["format"].get<std::string>().c_str(), q["quantized_linears"].get<long long>());
    for (const auto& s : q["schemes"]) {
      std::printf("    %s: int%d group 32, symmetric %s: %lld Linears\n",
                  s["type"].get<std::string>().c_str(), s["bits"].get<int>(),
                  s["symmetric"].get<bool>() ? "yes" : "no", s["linears"].get<long long>());
    }
    std::string kept;
    for (const auto& m : q["float_linears"]) {
      kept += (kept.empty() ? "" : ", ") + m.get<std::string>();
    }
    std::printf("    float (read as float): %s\n", kept.empty() ? "none" : kept.c_str());
  }
  for (const auto& [key, value] : j["metadata"].items()) {
    std::string text = value.is_object() ? value["type"].get<std::string>() + " of " +
                                               value["length"].dump()
                                         : value.dump();
    if (text.size() > 100) text = text.substr(0, 97) + "...";
    std::printf("  %s = %s\n", key.c_str(), text.c_str());
  }
  for (const auto& t : j["tensors"]) {
    std::printf("  %s %s ne=%s %s\n", t["name"].get<std::string>().c_str(),
                t["type"].get<std::string>().c_str(), t["ne"].dump().c_str(),
                human_bytes(t["bytes"]).c_str());
  }
}

}  // namespace qforge::cli
