#include "cli/inspect_hf.h"

#include <cstdio>
#include <set>
#include <string>
#include <vector>

namespace qforge::cli {

namespace {

template <typename T>
Json optional_json(const std::optional<T>& v) {
  return v ? Json(*v) : Json(nullptr);
}

// The scheme of a quantized checkpoint (importers/quantized_checkpoint): format, bits, group size
// per scheme, how many Linears each holds, and which Linear-shaped weights stayed float.
Json describe_quantization(const LoadedModel& loaded) {
  const QuantizedCheckpoint& q = *loaded.quantized;
  Json schemes = Json::array();
  for (const QuantizedScheme& s : q.schemes) {
    schemes.push_back({{"bits", s.bits},
                       {"group_size", s.group_size > 0 ? Json(s.group_size) : Json(nullptr)},
                       {"strategy", s.group_size > 0 ? "group" : "channel"},
                       {"symmetric", s.symmetric},
                       {"linears", s.linears}});
  }
  // 2-D float weights other than the embeddings: the Linears left float.
  std::vector<std::string> float_linears;
  for (const auto& [name, t] : loaded.graph.initializers()) {
    if (t.rank() == 2 && dtype_is_float(t.dtype()) && name.ends_with(".weight") &&
        name.find("embed") == std::string::npos && !loaded.graph.find_quant_record(name) &&
        !name.ends_with("_scale")) {
      float_linears.push_back(name.substr(0, name.size() - 7));
    }
  }
  return {{"quant_method", q.quant_method},
          {"format", q.format},
          {"schemes", schemes},
          {"quantized_linears", q.quantized_linears},
          {"ignore", q.ignore},
          {"float_linears", float_linears}};
}

}  // namespace

Json describe_hf_folder(const LoadedModel& loaded) {
  const HfConfig& c = *loaded.hf_config;
  std::set<std::string> stored;
  for (const auto& [name, t] : loaded.graph.initializers()) {
    stored.insert(std::string(dtype_name(t.dtype())));
  }
  return {{"architectures", c.architectures},
          {"model_type", c.model_type},
          {"num_hidden_layers", optional_json(c.num_hidden_layers)},
          {"hidden_size", optional_json(c.hidden_size)},
          {"intermediate_size", optional_json(c.intermediate_size)},
          {"num_attention_heads", optional_json(c.num_attention_heads)},
          {"num_key_value_heads", optional_json(c.num_key_value_heads)},
          {"head_dim", optional_json(c.head_dim)},
          {"vocab_size", optional_json(c.vocab_size)},
          {"max_position_embeddings", optional_json(c.max_position_embeddings)},
          {"rope_theta", optional_json(c.rope_theta)},
          {"tie_word_embeddings", c.tie_word_embeddings},
          {"lm_head_stored", loaded.graph.has_initializer("lm_head.weight")},
          {"config_dtype", c.dtype.empty() ? Json(nullptr) : Json(c.dtype)},
          {"stored_dtypes", stored},
          {"weights_format", std::string(format_name(loaded.weights_format))},
          {"quantization", loaded.quantized ? describe_quantization(loaded) : Json(nullptr)}};
}

void print_hf_text(const Json& j) {
  const auto num = [](const Json& v) { return v.is_null() ? std::string("?") : v.dump(); };
  std::string archs;
  for (const auto& a : j["architectures"]) {
    archs += (archs.empty() ? "" : ", ") + a.get<std::string>();
  }
  std::printf("  %s (model_type %s), weights %s\n", archs.empty() ? "?" : archs.c_str(),
              j["model_type"].get<std::string>().c_str(),
              j["weights_format"].get<std::string>().c_str());
  std::printf("  layers %s, hidden %s, intermediate %s, heads %s, kv heads %s, head_dim %s, "
              "vocab %s\n",
              num(j["num_hidden_layers"]).c_str(), num(j["hidden_size"]).c_str(),
              num(j["intermediate_size"]).c_str(), num(j["num_attention_heads"]).c_str(),
              num(j["num_key_value_heads"]).c_str(), num(j["head_dim"]).c_str(),
              num(j["vocab_size"]).c_str());
  std::string stored;
  for (const auto& d : j["stored_dtypes"]) {
    stored += (stored.empty() ? "" : ", ") + d.get<std::string>();
  }
  std::printf("  tie_word_embeddings %s, lm_head.weight %s; dtype %s, stored %s\n",
              j["tie_word_embeddings"].get<bool>() ? "true" : "false",
              j["lm_head_stored"].get<bool>() ? "stored" : "not stored",
              j["config_dtype"].is_null() ? "?" : j["config_dtype"].get<std::string>().c_str(),
              stored.c_str());
  if (const Json& q = j["quantization"]; !q.is_null()) {
    std::printf("  quantized: %s %s, %lld Linears\n", q["quant_method"].get<std::string>().c_str(),
                q["format"].get<std::string>().c_str(), q["quantized_linears"].get<long long>());
    for (const auto& s : q["schemes"]) {
      std::printf("    int%d %s, symmetric %s: %lld Linears\n", s["bits"].get<int>(),
                  s["group_size"].is_null()
                      ? "per channel"
                      : ("group " + s["group_size"].dump()).c_str(),
                  s["symmetric"].get<bool>() ? "yes" : "no", s["linears"].get<long long>());
    }
    std::string ignore;
    for (const auto& m : q["ignore"]) ignore += (ignore.empty() ? "" : ", ") + m.get<std::string>();
    std::string kept;
    for (const auto& m : q["float_linears"]) {
      kept += (kept.empty() ? "" : ", ") + m.get<std::string>();
    }
    std::printf("    ignore (left float): %s; float Linear weights stored: %s\n",
                ignore.empty() ? "none" : ignore.c_str(), kept.empty() ? "none" : kept.c_str());
  }
}

}  // namespace qforge::cli
