#include "cli/inspect_hf.h"

#include <cstdio>
#include <set>

namespace qforge::cli {

namespace {

template <typename T>
Json optional_json(const std::optional<T>& v) {
  return v ? Json(*v) : Json(nullptr);
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
          {"weights_format", std::string(format_name(loaded.weights_format))}};
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
}

}  // namespace qforge::cli
