#include "importers/hf/hf_folder.h"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "ir/error.h"

namespace qforge {

namespace {

using nlohmann::json;

std::optional<int64_t> int_key(const json& j, const char* key, const std::string& file) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_integer() && !it->is_number_unsigned()) {
    fail_invalid("'" + file + "': \"" + key + "\" is " + it->dump() + ", expected an integer");
  }
  const int64_t v = it->get<int64_t>();
  if (v < 0) fail_invalid("'" + file + "': \"" + key + "\" is negative (" + it->dump() + ")");
  return v;
}

std::string string_key(const json& j, const char* key, const std::string& file) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return {};
  if (!it->is_string()) {
    fail_invalid("'" + file + "': \"" + key + "\" is " + it->dump() + ", expected a string");
  }
  return it->get<std::string>();
}

std::optional<double> number_key(const json& j, const char* key, const std::string& file) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) {
    fail_invalid("'" + file + "': \"" + key + "\" is " + it->dump() + ", expected a number");
  }
  return it->get<double>();
}

}  // namespace

HfConfig parse_hf_config(const std::string& text, const std::string& file) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) fail_invalid("'" + file + "' is not valid JSON");
  if (!j.is_object()) fail_invalid("'" + file + "' is not a JSON object");
  HfConfig c;
  if (const auto it = j.find("architectures"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) fail_invalid("'" + file + "': \"architectures\" is not a list");
    for (const auto& a : *it) {
      if (!a.is_string()) fail_invalid("'" + file + "': \"architectures\" holds " + a.dump());
      c.architectures.push_back(a.get<std::string>());
    }
  }
  c.model_type = string_key(j, "model_type", file);
  c.num_hidden_layers = int_key(j, "num_hidden_layers", file);
  c.hidden_size = int_key(j, "hidden_size", file);
  c.intermediate_size = int_key(j, "intermediate_size", file);
  c.num_attention_heads = int_key(j, "num_attention_heads", file);
  c.num_key_value_heads = int_key(j, "num_key_value_heads", file);
  if (!c.num_key_value_heads) c.num_key_value_heads = c.num_attention_heads;
  c.head_dim = int_key(j, "head_dim", file);
  if (!c.head_dim && c.hidden_size && c.num_attention_heads && *c.num_attention_heads > 0) {
    c.head_dim = *c.hidden_size / *c.num_attention_heads;
  }
  c.vocab_size = int_key(j, "vocab_size", file);
  c.max_position_embeddings = int_key(j, "max_position_embeddings", file);
  c.rope_theta = number_key(j, "rope_theta", file);
  if (const auto it = j.find("rope_parameters"); !c.rope_theta && it != j.end() &&
                                                 it->is_object()) {
    c.rope_theta = number_key(*it, "rope_theta", file);
  }
  if (const auto it = j.find("tie_word_embeddings"); it != j.end() && !it->is_null()) {
    if (!it->is_boolean()) {
      fail_invalid("'" + file + "': \"tie_word_embeddings\" is " + it->dump() +
                   ", expected true or false");
    }
    c.tie_word_embeddings = it->get<bool>();
  }
  c.dtype = string_key(j, "dtype", file);
  if (c.dtype.empty()) c.dtype = string_key(j, "torch_dtype", file);
  return c;
}

bool is_hf_folder(const std::filesystem::path& dir) {
  std::error_code ec;
  return std::filesystem::is_directory(dir, ec) &&
         !std::filesystem::exists(dir / "adapter_config.json", ec) &&
         std::filesystem::exists(dir / "config.json", ec);
}

std::string read_config_json(const std::filesystem::path& dir) {
  const std::filesystem::path file = dir / "config.json";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec)) {
    fail_io("'" + file.string() + "' does not exist: a Hugging Face model folder needs its "
            "config.json");
  }
  std::ifstream in(file, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in.good() && !in.eof()) fail_io("cannot read '" + file.string() + "'");
  return text.str();
}

HfConfig read_hf_config(const std::filesystem::path& dir) {
  return parse_hf_config(read_config_json(dir), (dir / "config.json").string());
}

std::filesystem::path hf_weights_file(const std::filesystem::path& dir) {
  std::error_code ec;
  for (const char* name : {"model.safetensors.index.json", "model.safetensors",
                           "pytorch_model.bin.index.json", "pytorch_model.bin"}) {
    if (std::filesystem::is_regular_file(dir / name, ec)) return dir / name;
  }
  std::string message = dir.string();
  message.insert(0, 1, '\'');
  message += "' has no weights: expected model.safetensors, model.safetensors.index.json, "
             "pytorch_model.bin or pytorch_model.bin.index.json";
  fail_io(message);
}

}  // namespace qforge
