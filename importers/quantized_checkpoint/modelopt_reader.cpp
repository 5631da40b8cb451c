#include "importers/quantized_checkpoint/modelopt_reader.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "importers/quantized_checkpoint/modelopt_int4.h"
#include "ir/error.h"
#include "ir/quantized_linear.h"

namespace qforge {

namespace {

using nlohmann::json;

constexpr std::string_view kScale = ".weight_scale";
constexpr std::string_view kPreQuant = ".pre_quant_scale";
constexpr std::string_view kWeight = ".weight";
constexpr int64_t kMaxDim = int64_t{1} << 31;
constexpr int64_t kInferGroup = -1;  // group size to be read off the scale's shape

struct Scheme {
  int bits = 4;
  int64_t group = kInferGroup;  // 0: per output channel
};

struct Config {
  std::string where;  // "'.../hf_quant_config.json' (modelopt): "
  std::string algo;
  std::optional<Scheme> scheme;            // one scheme for every quantized Linear
  std::map<std::string, Scheme> per_layer;  // MIXED_PRECISION: module -> scheme
  std::vector<std::string> exclude;
};

json parse_object(const std::string& text, const std::string& file) {
  const json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) fail_invalid("'" + file + "' is not a JSON object");
  return j;
}

const json* find_key(const json& j, const char* key) {
  const auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

std::string algo_of(const json& q, const std::string& where) {
  const json* a = find_key(q, "quant_algo");
  if (a == nullptr) {
    fail_unsupported(where + "quant_algo is null: the folder quantizes no weights qforge reads "
                     "(W4A16_AWQ, W8A16)");
  }
  if (!a->is_string()) fail_invalid(where + "quant_algo is " + a->dump() + ", not a string");
  return a->get<std::string>();
}

Scheme scheme_of(const std::string& algo, const json& q, const std::string& where) {
  if (const json* z = find_key(q, "has_zero_point")) {
    if (!z->is_boolean()) fail_invalid(where + "has_zero_point is " + z->dump());
    if (z->get<bool>()) {
      fail_unsupported(where + "has_zero_point is true (asymmetric int4); qforge reads "
                       "symmetric ModelOpt weights");
    }
  }
  if (algo == "W8A16") return Scheme{8, 0};
  if (algo != "W4A16_AWQ") {
    fail_unsupported(where + "quant_algo '" + algo + "'; qforge reads ModelOpt's weight-only "
                     "int schemes W4A16_AWQ and W8A16 (and MIXED_PRECISION of them)");
  }
  Scheme s{4, kInferGroup};
  if (const json* g = find_key(q, "group_size")) {
    if (!g->is_number_integer() || g->get<int64_t>() <= 0 || g->get<int64_t>() > kMaxDim) {
      fail_invalid(where + "group_size " + g->dump() + " is not a group size");
    }
    s.group = g->get<int64_t>();
  }
  return s;
}

std::vector<std::string> string_list(const json* v, const std::string& where, const char* key) {
  std::vector<std::string> out;
  if (v == nullptr) return out;
  if (!v->is_array()) fail_invalid(where + key + " is " + v->dump() + ", not a list of names");
  for (const json& e : *v) {
    if (!e.is_string()) fail_invalid(where + key + " holds " + e.dump() + ", not a name");
    out.push_back(e.get<std::string>());
  }
  return out;
}

// One of the two configurations, as the reader uses it.
Config parse_quantization(const json& q, const std::string& where, bool hf_quant) {
  Config c;
  c.where = where;
  if (const json* kv = find_key(q, hf_quant ? "kv_cache_quant_algo" : "kv_cache_scheme")) {
    fail_unsupported(where + (hf_quant ? "kv_cache_quant_algo " : "kv_cache_scheme ") +
                     kv->dump() + " quantizes the KV cache; qforge reads weight-only checkpoints");
  }
  c.algo = algo_of(q, where);
  c.exclude = string_list(find_key(q, hf_quant ? "exclude_modules" : "ignore"), where,
                          hf_quant ? "exclude_modules" : "ignore");
  if (c.algo == "MIXED_PRECISION") {
    const json* layers = find_key(q, "quantized_layers");
    if (layers == nullptr || !layers->is_object()) {
      fail_invalid(where + "quant_algo MIXED_PRECISION without a quantized_layers object");
    }
    for (const auto& [name, layer] : layers->items()) {
      const std::string at = where + "quantized_layers." + name + ": ";
      if (!layer.is_object()) fail_invalid(at + "is " + layer.dump() + ", not an object");
      c.per_layer[name] = scheme_of(algo_of(layer, at), layer, at);
    }
  } else {
    c.scheme = scheme_of(c.algo, q, where);
  }
  return c;
}

std::optional<DType> model_dtype(const json& root) {
  for (const char* key : {"dtype", "torch_dtype"}) {
    const json* d = find_key(root, key);
    if (d == nullptr || !d->is_string()) continue;
    const std::string s = d->get<std::string>();
    if (s == "float16") return DType::F16;
    if (s == "bfloat16") return DType::BF16;
    if (s == "float32") return DType::F32;
  }
  return std::nullopt;
}

std::string module_of(const std::string& name, std::string_view suffix) {
  return name.substr(0, name.size() - suffix.size());
}

std::string named(const std::string& module, std::string_view suffix) {
  std::string s;
  s.reserve(module.size() + suffix.size());
  s.append(module);
  s.append(suffix);
  return s;
}

}  // namespace

QuantizedCheckpoint read_modelopt(const std::string& config_text, const std::string& file,
                                  const std::string& hf_quant_text,
                                  const std::string& hf_quant_file, Graph& graph) {
  const json root = parse_object(config_text, file);
  const json* qc = find_key(root, "quantization_config");
  if (qc != nullptr && !qc->is_object()) {
    fail_invalid("'" + file + "': quantization_config is " + qc->dump() + ", not an object");
  }
  std::optional<Config> from_config;
  if (qc != nullptr) {
    const json* method = find_key(*qc, "quant_method");
    if (method == nullptr || *method != kModeloptMethod) {
      fail_invalid("'" + file + "': quantization_config.quant_method is " +
                   (method == nullptr ? std::string("missing") : method->dump()) +
                   ", not \"modelopt\"");
    }
    from_config = parse_quantization(*qc, "'" + file + "' (modelopt): quantization_config.", false);
  }
  std::optional<Config> from_side;
  if (!hf_quant_text.empty()) {
    const json side = parse_object(hf_quant_text, hf_quant_file);
    const json* q = find_key(side, "quantization");
    if (q == nullptr || !q->is_object()) {
      fail_invalid("'" + hf_quant_file + "' has no \"quantization\" object");
    }
    from_side = parse_quantization(*q, "'" + hf_quant_file + "' (modelopt): quantization.", true);
  }
  if (!from_config && !from_side) {
    fail_invalid("'" + file + "' has no modelopt quantization_config and the folder no " +
                 std::string(kHfQuantConfigFile));
  }
  // hf_quant_config.json is what TensorRT-LLM reads; config.json's copy must say the same.
  Config c = from_side ? *from_side : *from_config;
  if (from_side && from_config) {
    const Config& a = *from_side;
    const Config& b = *from_config;
    const bool group_differs = a.scheme && b.scheme && a.scheme->group != kInferGroup &&
                               b.scheme->group != kInferGroup && a.scheme->group != b.scheme->group;
    if (a.algo != b.algo || group_differs) {
      fail_invalid("'" + hf_quant_file + "' and '" + file + "' disagree: quant_algo " + a.algo +
                   (a.scheme ? " group_size " + std::to_string(a.scheme->group) : "") + " vs " +
                   b.algo + (b.scheme ? " group_size " + std::to_string(b.scheme->group) : "") +
                   "; remove the stale one");
    }
    if (c.scheme && c.scheme->group == kInferGroup && b.scheme) c.scheme->group = b.scheme->group;
  }
  const std::optional<DType> dtype = model_dtype(root);
  const std::string where = c.where.substr(0, c.where.find("(modelopt): ") + 12);
  const auto tensor_error = [&](const std::string& name, const std::string& what) {
    fail_invalid(where + "tensor '" + name + "' " + what);
  };

  QuantizedCheckpoint out;
  out.quant_method = std::string(kModeloptMethod);
  out.format = c.algo;
  out.ignore = c.exclude;
  std::set<std::string> modules;
  for (const auto& [name, t] : graph.initializers()) {
    if (name.ends_with(kScale)) modules.insert(module_of(name, kScale));
    for (std::string_view activation :
         {".input_scale", ".weight_scale_2", ".k_scale", ".v_scale"}) {
      if (name.ends_with(activation)) {
        fail_unsupported(where + "tensor '" + name + "' scales activations or a second weight "
                         "level (FP8, NVFP4, W4A8, KV cache); qforge reads weight-only int "
                         "ModelOpt checkpoints");
      }
    }
  }
  for (const auto& [name, t] : graph.initializers()) {
    if (name.ends_with(kPreQuant) && modules.count(module_of(name, kPreQuant)) == 0) {
      tensor_error(name, "has no " + named(module_of(name, kPreQuant), kScale) +
                             " beside it (the pre-quant scale of a quantized Linear)");
    }
    if (name.ends_with(kWeight) && (t.dtype() == DType::U8 || t.dtype() == DType::I8) &&
        modules.count(module_of(name, kWeight)) == 0) {
      tensor_error(name, "is " + std::string(dtype_name(t.dtype())) +
                             " (packed integers) with no " +
                             named(module_of(name, kWeight), kScale) + " beside it");
    }
  }
  if (modules.empty()) {
    fail_invalid(where + "quant_algo " + c.algo + ", but the folder holds no tensor named "
                 "<module>.weight_scale");
  }
  for (const auto& [name, layer] : c.per_layer) {
    if (modules.count(name) == 0) {
      fail_invalid(where + "quantized_layers lists '" + name + "', but the folder holds no '" +
                   named(name, kScale) + "'");
    }
  }
  std::map<std::pair<int, int64_t>, size_t> scheme_index;
  std::optional<int64_t> inferred;  // the group size read off the first scale, when not given
  for (const std::string& m : modules) {
    const std::string weight = named(m, kWeight), scale_name = named(m, kScale),
                      pqs_name = named(m, kPreQuant);
    Scheme s;
    if (c.scheme) {
      s = *c.scheme;
    } else if (const auto it = c.per_layer.find(m); it != c.per_layer.end()) {
      s = it->second;
    } else {
      tensor_error(scale_name, "quantizes '" + m + "', which quant_algo MIXED_PRECISION's "
                               "quantized_layers does not list");
    }
    for (const std::string& pattern : c.exclude) {
      if (module_pattern_match(pattern, m)) {
        tensor_error(scale_name, "quantizes '" + m + "', which the config's exclude list leaves "
                                 "float ('" + pattern + "')");
      }
    }
    const Tensor* w = graph.find_initializer(weight);
    if (w == nullptr) tensor_error(scale_name, "has no " + weight + " beside it");
    const Tensor& sc = *graph.find_initializer(scale_name);
    if (!dtype_is_float(sc.dtype())) {
      tensor_error(scale_name, "is " + std::string(dtype_name(sc.dtype())) + ", expected a float "
                               "scale");
    }
    Tensor values;
    Tensor scale = sc;
    int64_t n = 0, k = 0;
    if (s.bits == 4) {
      if ((w->dtype() != DType::U8 && w->dtype() != DType::I8) || w->rank() != 2 ||
          w->shape()[0] <= 0 || w->shape()[1] <= 0 || w->shape()[0] > kMaxDim / 2 ||
          w->shape()[1] > kMaxDim) {
        tensor_error(weight, "is " + std::string(dtype_name(w->dtype())) + " " +
                                 shape_to_string(w->shape()) + "; " + c.algo + " stores int4 as "
                                 "uint8 [N / 2, K] (two output rows per byte)");
      }
      n = 2 * w->shape()[0];
      k = w->shape()[1];
      if (sc.rank() != 2 || sc.shape()[0] != n || sc.shape()[1] <= 0) {
        tensor_error(scale_name, "has shape " + shape_to_string(sc.shape()) + "; " + weight + " " +
                                     shape_to_string(w->shape()) + " holds " + std::to_string(n) +
                                     " output rows, so it is [" + std::to_string(n) +
                                     ", K / group_size]");
      }
      int64_t group = s.group;
      if (group == kInferGroup) {
        if (k % sc.shape()[1] != 0) {
          tensor_error(scale_name, "has " + std::to_string(sc.shape()[1]) + " groups, which do "
                                   "not divide the " + std::to_string(k) + " input features");
        }
        group = k / sc.shape()[1];
        if (inferred && *inferred != group) {
          tensor_error(scale_name, "has groups of " + std::to_string(group) + " inputs, the "
                                   "Linears before it " + std::to_string(*inferred) + " (the "
                                   "config gives no group_size)");
        }
        inferred = group;
      }
      if (k % group != 0 || sc.shape()[1] != k / group) {
        tensor_error(scale_name, "has shape " + shape_to_string(sc.shape()) + "; group_size " +
                                     std::to_string(group) + " and " + weight + " " +
                                     shape_to_string(w->shape()) + " make it [" +
                                     std::to_string(n) + ", " +
                                     (k % group == 0 ? std::to_string(k / group)
                                                     : std::to_string(k) + " / " +
                                                           std::to_string(group)) + "]");
      }
      s.group = group;
      const auto bytes = w->data<uint8_t>();
      values = linear_values_tensor(unpack_int4_row_pairs(bytes, n, k), 4, n, k);
    } else {
      if (w->dtype() != DType::I8 || w->rank() != 2 || w->shape()[0] <= 0 ||
          w->shape()[1] <= 0 || w->shape()[0] > kMaxDim || w->shape()[1] > kMaxDim) {
        tensor_error(weight, "is " + std::string(dtype_name(w->dtype())) + " " +
                                 shape_to_string(w->shape()) + "; W8A16 stores int8 [N, K]");
      }
      n = w->shape()[0];
      k = w->shape()[1];
      if (sc.shape() != Shape{n} && sc.shape() != Shape{n, 1}) {
        tensor_error(scale_name, "has shape " + shape_to_string(sc.shape()) + "; W8A16 and " +
                                     weight + " " + shape_to_string(w->shape()) + " make it [" +
                                     std::to_string(n) + "] (one scale per output channel)");
      }
      scale = Tensor(sc.dtype(), {n}, sc.storage(), sc.offset());
      values = Tensor(DType::I8, {n, k}, w->storage(), w->offset());
    }
    if (const Tensor* pqs = graph.find_initializer(pqs_name)) {
      scale = fold_pre_quant_scale(scale, s.group, k, *pqs, pqs_name, where);
    }
    scale = narrow_scale(scale, dtype);
    graph.remove_initializer(pqs_name);
    store_quantized_linear(graph, weight, std::move(values), std::move(scale), s.group);
    const std::pair<int, int64_t> key{s.bits, s.group};
    auto it = scheme_index.find(key);
    if (it == scheme_index.end()) {
      it = scheme_index.emplace(key, out.schemes.size()).first;
      QuantizedScheme q;
      q.bits = s.bits;
      q.group_size = s.group;
      out.schemes.push_back(q);
    }
    ++out.schemes[it->second].linears;
    ++out.quantized_linears;
  }
  return out;
}

QuantizedCheckpoint read_modelopt_folder(const std::string& config_text, const std::string& file,
                                         Graph& graph) {
  const std::filesystem::path side = std::filesystem::path(file).parent_path() / kHfQuantConfigFile;
  std::string text;
  std::error_code ec;
  if (std::filesystem::is_regular_file(side, ec)) {
    std::ifstream in(side, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    if (!in.good() && !in.eof()) fail_io("cannot read '" + side.string() + "'");
    text = s.str();
    if (text.empty()) fail_invalid("'" + side.string() + "' is empty");
  }
  return read_modelopt(config_text, file, text, side.string(), graph);
}

}  // namespace qforge
