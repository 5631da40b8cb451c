#include "importers/hf/decoder_config.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <sstream>

#include <nlohmann/json.hpp>

#include "importers/hf/hf_folder.h"
#include "ir/error.h"

namespace qforge {

namespace {

using nlohmann::json;

struct FamilyName {
  DecoderFamily family;
  std::string_view name;
};
constexpr FamilyName kFamilies[] = {
    {DecoderFamily::Llama, "llama"}, {DecoderFamily::Mistral, "mistral"},
    {DecoderFamily::Qwen2, "qwen2"}, {DecoderFamily::Qwen3, "qwen3"},
    {DecoderFamily::Phi3, "phi3"},
};

// Reads keys of one JSON object, naming the file (and the object, for nested ones) in errors.
class Keys {
 public:
  Keys(const json& j, std::string file, std::string where = "")
      : j_(j), file_(std::move(file)), where_(std::move(where)) {}

  [[nodiscard]] bool has(const char* key) const {
    const auto it = j_.find(key);
    return it != j_.end() && !it->is_null();
  }
  // Present in the file, null included.
  [[nodiscard]] bool present(const char* key) const { return j_.contains(key); }

  [[nodiscard]] std::optional<double> number(const char* key) const {
    if (!has(key)) return std::nullopt;
    const json& v = j_.at(key);
    if (!v.is_number()) bad(key, v, "a number");
    return v.get<double>();
  }
  [[nodiscard]] std::optional<int64_t> integer(const char* key) const {
    if (!has(key)) return std::nullopt;
    const json& v = j_.at(key);
    if (!v.is_number_integer() && !v.is_number_unsigned()) bad(key, v, "an integer");
    return v.get<int64_t>();
  }
  [[nodiscard]] std::optional<bool> boolean(const char* key) const {
    if (!has(key)) return std::nullopt;
    const json& v = j_.at(key);
    if (!v.is_boolean()) bad(key, v, "true or false");
    return v.get<bool>();
  }
  [[nodiscard]] std::optional<std::string> string(const char* key) const {
    if (!has(key)) return std::nullopt;
    const json& v = j_.at(key);
    if (!v.is_string()) bad(key, v, "a string");
    return v.get<std::string>();
  }
  [[nodiscard]] const json* object(const char* key) const {
    if (!has(key)) return nullptr;
    const json& v = j_.at(key);
    if (!v.is_object()) bad(key, v, "an object");
    return &v;
  }
  [[nodiscard]] const json* array(const char* key) const {
    if (!has(key)) return nullptr;
    const json& v = j_.at(key);
    if (!v.is_array()) bad(key, v, "a list");
    return &v;
  }

  [[nodiscard]] std::string name(const char* key) const {
    return "'" + file_ + "': \"" + where_ + key + "\"";
  }

 private:
  [[noreturn]] void bad(const char* key, const json& v, const char* expected) const {
    std::string text = v.dump();
    if (text.size() > 60) text = text.substr(0, 57) + "...";
    fail_invalid(name(key) + " is " + text + ", expected " + expected);
  }

  const json& j_;
  std::string file_;
  std::string where_;
};

int64_t required_size(const std::optional<int64_t>& v, const Keys& keys, const char* key) {
  if (!v) fail_invalid(keys.name(key) + " is missing: the decoder graph needs it");
  if (*v <= 0) fail_invalid(keys.name(key) + " is " + std::to_string(*v) + ", expected > 0");
  return *v;
}

std::string format_double(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

void parse_rope(const Keys& top, DecoderConfig& c, const std::string& file) {
  // transformers 5 writes rope_parameters; 4 wrote rope_scaling (null when unscaled) beside a
  // top-level rope_theta. A rope_scaling object wins, as transformers' conversion has it.
  const json* params = top.object("rope_scaling");
  const char* params_key = "rope_scaling";
  if (params == nullptr) {
    params = top.object("rope_parameters");
    params_key = "rope_parameters";
  }
  const json empty = json::object();
  const Keys rope(params != nullptr ? *params : empty, file, std::string(params_key) + ".");
  if (params != nullptr) {
    for (const auto& [key, value] : params->items()) {
      if (value.is_object()) {
        fail_unsupported(top.name(params_key) + " holds per-layer-type RoPE parameters (\"" +
                         key + "\"); qforge builds one RoPE for every layer");
      }
    }
  }
  std::string type = rope.string("rope_type").value_or(rope.string("type").value_or("default"));
  c.rope_theta = rope.number("rope_theta").value_or(top.number("rope_theta").value_or(10000.0));
  if (!(c.rope_theta > 0.0)) {
    fail_invalid(top.name("rope_theta") + " is " + format_double(c.rope_theta) +
                 ", expected > 0");
  }
  const double partial = rope.number("partial_rotary_factor")
                             .value_or(top.number("partial_rotary_factor").value_or(1.0));
  if (partial != 1.0 && c.family != DecoderFamily::Phi3) {
    fail_unsupported(top.name("partial_rotary_factor") + " is " + format_double(partial) +
                     ": transformers' " + c.model_type +
                     " rotates whole heads (a partial rotary factor is Phi-3's)");
  }
  if (!(partial > 0.0 && partial <= 1.0)) {
    fail_invalid(top.name("partial_rotary_factor") + " is " + format_double(partial) +
                 ", expected in (0, 1]");
  }
  c.rotary_dim = static_cast<int64_t>(static_cast<double>(c.head_dim) * partial);
  if (c.rotary_dim <= 0 || c.rotary_dim % 2 != 0) {
    fail_invalid("'" + file + "': the rotary dimension (head_dim " + std::to_string(c.head_dim) +
                 " x partial_rotary_factor " + format_double(partial) + " = " +
                 std::to_string(c.rotary_dim) + ") must be even and positive");
  }
  const std::string supported = c.family == DecoderFamily::Phi3
                                    ? "default (Phi-3 takes no other RoPE scaling qforge builds)"
                                    : "default, linear, llama3";
  auto refuse = [&]() {
    fail_unsupported(rope.name("rope_type") + " is '" + type +
                     "', a RoPE scaling qforge does not build (supported: " + supported + ")");
  };
  auto factor = [&](const char* key) {
    const std::optional<double> v = rope.number(key);
    if (!v) fail_invalid(rope.name(key) + " is missing: RoPE type '" + type + "' needs it");
    if (!(*v > 0.0)) fail_invalid(rope.name(key) + " is " + format_double(*v) + ", expected > 0");
    return *v;
  };
  if (type == "default") {
    c.rope_scaling = RopeScaling::None;
  } else if (type == "linear" && c.family != DecoderFamily::Phi3) {
    c.rope_scaling = RopeScaling::Linear;
    c.rope_factor = factor("factor");
  } else if (type == "llama3" && c.family != DecoderFamily::Phi3) {
    c.rope_scaling = RopeScaling::Llama3;
    c.rope_factor = factor("factor");
    c.rope_low_freq_factor = factor("low_freq_factor");
    c.rope_high_freq_factor = factor("high_freq_factor");
    if (c.rope_high_freq_factor == c.rope_low_freq_factor) {
      fail_invalid(rope.name("high_freq_factor") + " equals low_freq_factor (" +
                   format_double(c.rope_low_freq_factor) + "): llama3 RoPE divides by their "
                   "difference");
    }
    // As transformers' standardize_rope_params: a top-level original_max_position_embeddings
    // first, then the RoPE parameters' own, then max_position_embeddings.
    std::optional<int64_t> original = top.integer("original_max_position_embeddings");
    if (!original) original = rope.integer("original_max_position_embeddings");
    if (!original) original = top.integer("max_position_embeddings");
    if (!original || *original <= 0) {
      fail_invalid(rope.name("original_max_position_embeddings") +
                   " is missing or not positive (and so is max_position_embeddings): llama3 "
                   "RoPE needs it");
    }
    c.rope_original_max_positions = *original;
  } else {
    refuse();
  }
}

void parse_sliding(const Keys& top, DecoderConfig& c) {
  c.sliding_layers.assign(static_cast<size_t>(c.num_layers), false);
  std::optional<int64_t> window;
  bool per_layer = false;
  switch (c.family) {
    case DecoderFamily::Llama:
      return;
    case DecoderFamily::Mistral:
      // MistralConfig's default is 4096; null turns it off.
      window = top.present("sliding_window") ? top.integer("sliding_window")
                                               : std::optional<int64_t>(4096);
      break;
    case DecoderFamily::Phi3:
      window = top.integer("sliding_window");
      break;
    case DecoderFamily::Qwen2:
    case DecoderFamily::Qwen3:
      if (!top.boolean("use_sliding_window").value_or(false)) return;
      window = top.present("sliding_window") ? top.integer("sliding_window")
                                               : std::optional<int64_t>(4096);
      per_layer = true;
      break;
  }
  if (!window) return;
  if (*window <= 0) {
    fail_invalid(top.name("sliding_window") + " is " + std::to_string(*window) +
                 ", expected > 0 or null");
  }
  c.sliding_window = window;
  if (!per_layer) {
    c.sliding_layers.assign(c.sliding_layers.size(), true);
    return;
  }
  if (const json* types = top.array("layer_types")) {
    if (static_cast<int64_t>(types->size()) != c.num_layers) {
      fail_invalid(top.name("layer_types") + " has " + std::to_string(types->size()) +
                   " entries for " + std::to_string(c.num_layers) + " layers");
    }
    for (size_t i = 0; i < types->size(); ++i) {
      const json& t = (*types)[i];
      const std::string s = t.is_string() ? t.get<std::string>() : t.dump();
      if (s == "sliding_attention") {
        c.sliding_layers[i] = true;
      } else if (s != "full_attention") {
        fail_unsupported(top.name("layer_types") + " holds '" + s + "' (layer " +
                         std::to_string(i) +
                         "): qforge builds full_attention and sliding_attention layers");
      }
    }
    return;
  }
  const int64_t first = top.integer("max_window_layers").value_or(28);
  for (int64_t i = first; i < c.num_layers; ++i) c.sliding_layers[static_cast<size_t>(i)] = true;
}

}  // namespace

std::string_view decoder_family_name(DecoderFamily family) {
  for (const FamilyName& f : kFamilies)
    if (f.family == family) return f.name;
  return "?";
}

std::string supported_decoder_families() {
  std::string s;
  for (const FamilyName& f : kFamilies) s += (s.empty() ? "" : ", ") + std::string(f.name);
  return s;
}

std::optional<DecoderFamily> decoder_family(std::string_view model_type) {
  for (const FamilyName& f : kFamilies)
    if (f.name == model_type) return f.family;
  return std::nullopt;
}

bool DecoderConfig::any_sliding() const {
  return sliding_window && std::find(sliding_layers.begin(), sliding_layers.end(), true) !=
                               sliding_layers.end();
}

bool DecoderConfig::all_sliding() const {
  return sliding_window && !sliding_layers.empty() &&
         std::find(sliding_layers.begin(), sliding_layers.end(), false) == sliding_layers.end();
}

std::vector<float> DecoderConfig::rope_inv_freq() const {
  // transformers: 1 / theta ** (arange(0, dim, 2).float() / dim), in float32.
  const int64_t half = rotary_dim / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(rotary_dim);
    const auto p = static_cast<float>(std::pow(rope_theta, static_cast<double>(exponent)));
    inv[static_cast<size_t>(i)] = 1.0f / p;
  }
  if (rope_scaling == RopeScaling::Linear) {
    for (float& f : inv) f = static_cast<float>(f / rope_factor);
  } else if (rope_scaling == RopeScaling::Llama3) {
    const auto old_len = static_cast<double>(rope_original_max_positions);
    const double low_wavelen = old_len / rope_low_freq_factor;
    const double high_wavelen = old_len / rope_high_freq_factor;
    for (float& f : inv) {
      const double inv_freq = f;
      const double wavelen = 2.0 * std::numbers::pi / inv_freq;
      double v = wavelen > low_wavelen ? inv_freq / rope_factor : inv_freq;
      const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
      if (medium) {
        const double smooth = (old_len / wavelen - rope_low_freq_factor) /
                              (rope_high_freq_factor - rope_low_freq_factor);
        v = (1.0 - smooth) * v / rope_factor + smooth * v;
      }
      f = static_cast<float>(v);
    }
  }
  return inv;
}

DecoderConfig parse_decoder_config(const std::string& text, const std::string& file) {
  const HfConfig hf = parse_hf_config(text, file);  // JSON object, common keys' types
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  const Keys top(j, file);
  DecoderConfig c;
  c.model_type = hf.model_type;
  if (c.model_type.empty()) {
    fail_unsupported(top.name("model_type") +
                     " is missing: qforge builds the decoder graph of these model types: " +
                     supported_decoder_families());
  }
  const std::optional<DecoderFamily> family = decoder_family(c.model_type);
  if (!family) {
    fail_unsupported("'" + file + "': model_type '" + c.model_type +
                     "' is not a decoder family qforge builds a graph for (supported: " +
                     supported_decoder_families() + ")");
  }
  c.family = *family;
  c.num_layers = required_size(hf.num_hidden_layers, top, "num_hidden_layers");
  c.hidden_size = required_size(hf.hidden_size, top, "hidden_size");
  c.intermediate_size = required_size(hf.intermediate_size, top, "intermediate_size");
  c.num_heads = required_size(hf.num_attention_heads, top, "num_attention_heads");
  c.num_kv_heads = required_size(hf.num_key_value_heads, top, "num_key_value_heads");
  c.vocab_size = required_size(hf.vocab_size, top, "vocab_size");
  if (c.num_heads % c.num_kv_heads != 0) {
    fail_invalid("'" + file + "': num_attention_heads " + std::to_string(c.num_heads) +
                 " is not a multiple of num_key_value_heads " + std::to_string(c.num_kv_heads));
  }
  if (top.has("head_dim")) {
    c.head_dim = required_size(top.integer("head_dim"), top, "head_dim");
  } else if (c.family == DecoderFamily::Qwen3) {
    c.head_dim = 128;  // Qwen3Config's default, whatever hidden / heads is
  } else {
    if (c.hidden_size % c.num_heads != 0) {
      fail_invalid("'" + file + "': hidden_size " + std::to_string(c.hidden_size) +
                   " is not a multiple of num_attention_heads " + std::to_string(c.num_heads) +
                   " and there is no head_dim");
    }
    c.head_dim = c.hidden_size / c.num_heads;
  }
  c.dtype = hf.dtype;
  c.tie_word_embeddings = top.boolean("tie_word_embeddings");

  const double eps_default = c.family == DecoderFamily::Phi3 ? 1e-5 : 1e-6;
  c.rms_norm_eps = top.number("rms_norm_eps").value_or(eps_default);
  if (!(c.rms_norm_eps >= 0.0)) {
    fail_invalid(top.name("rms_norm_eps") + " is " + format_double(c.rms_norm_eps) +
                 ", expected >= 0");
  }
  const std::string act = top.string("hidden_act").value_or("silu");
  if (act != "silu" && act != "swish") {
    fail_unsupported(top.name("hidden_act") + " is '" + act +
                     "': qforge builds the SiLU-gated MLP of these families (supported: silu)");
  }

  switch (c.family) {
    case DecoderFamily::Llama: {
      const bool attention_bias = top.boolean("attention_bias").value_or(false);
      c.qkv_bias = c.o_bias = attention_bias;
      c.mlp_bias = top.boolean("mlp_bias").value_or(false);
      break;
    }
    case DecoderFamily::Mistral:
      break;
    case DecoderFamily::Qwen2:
      c.qkv_bias = true;  // Qwen2Attention: q/k/v always, o_proj never
      break;
    case DecoderFamily::Qwen3: {
      const bool attention_bias = top.boolean("attention_bias").value_or(false);
      c.qkv_bias = c.o_bias = attention_bias;
      c.qk_norm = true;
      break;
    }
    case DecoderFamily::Phi3:
      c.fused_qkv = c.fused_gate_up = true;
      break;
  }
  parse_rope(top, c, file);
  parse_sliding(top, c);
  return c;
}

DecoderConfig read_decoder_config(const std::filesystem::path& dir) {
  return parse_decoder_config(read_config_json(dir), (dir / "config.json").string());
}

}  // namespace qforge
