#include "importers/quantized_checkpoint/compressed_tensors_reader.h"

#include <algorithm>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "ir/error.h"
#include "ir/quantized_linear.h"

namespace qforge {

namespace {

using nlohmann::json;

constexpr std::string_view kPacked = ".weight_packed";
constexpr std::string_view kScale = ".weight_scale";
constexpr std::string_view kShape = ".weight_shape";
constexpr std::string_view kZeroPoint = ".weight_zero_point";
constexpr std::string_view kGIdx = ".weight_g_idx";
constexpr int64_t kMaxDim = int64_t{1} << 31;  // no Linear is wider; keeps N * K far from overflow

// A config-group or ignore target: a module name, "re:<regex>" (matched from the name's start,
// as Python's re.match), or a class name ("Linear": every packed module is one).
struct Target {
  std::string text;
  std::optional<std::regex> regex;
};

struct Group {
  std::string name;  // "group_0"
  std::vector<Target> targets;
  QuantizedScheme scheme;
  size_t index = 0;  // into QuantizedCheckpoint::schemes
};

struct Config {
  std::string file;
  std::vector<Group> groups;
  std::vector<Target> ignore;
  std::vector<std::string> ignore_text;
  std::string format;
};

[[noreturn]] void bad(const Config& c, const std::string& what) {
  fail_invalid("'" + c.file + "': quantization_config " + what);
}

const json* find_key(const json& j, const char* key) {
  const auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

std::string string_of(const Config& c, const json& j, const char* key, const std::string& where) {
  const json* v = find_key(j, key);
  if (v == nullptr) return {};
  if (!v->is_string()) bad(c, where + "\"" + key + "\" is " + v->dump() + ", expected a string");
  return v->get<std::string>();
}

Target parse_target(const Config& c, const json& t, const std::string& where) {
  if (!t.is_string()) bad(c, where + " holds " + t.dump() + ", expected a string");
  Target target{t.get<std::string>(), std::nullopt};
  if (target.text.starts_with("re:")) {
    try {
      // __polynomial (libstdc++): matched by breadth-first search, in time polynomial in the
      // name's length. The default backtracking search takes exponential time on nested
      // quantifiers ("re:(.*)*!"), so a config could hang the reader; back-references, which
      // that search cannot take, are refused here instead.
      target.regex.emplace(target.text.substr(3),
                           std::regex::ECMAScript | std::regex_constants::__polynomial);
    } catch (const std::regex_error& e) {
      bad(c, where + " '" + target.text + "' is not a regular expression qforge reads: " +
                 e.what());
    }
  }
  return target;
}

std::vector<Target> parse_targets(const Config& c, const json& j, const std::string& where) {
  std::vector<Target> out;
  if (j.is_string()) {
    out.push_back(parse_target(c, j, where));
  } else if (j.is_array()) {
    for (const json& t : j) out.push_back(parse_target(c, t, where));
  } else {
    bad(c, where + " is " + j.dump() + ", expected a list of names");
  }
  return out;
}

// 0: no match; 3: exact name; 2: regex; 1: class name Linear.
int match_rank(const Target& t, const std::string& module) {
  if (t.regex) {
    try {
      return std::regex_search(module, *t.regex, std::regex_constants::match_continuous) ? 2 : 0;
    } catch (const std::regex_error&) {
      return 0;  // too complex to evaluate (error_complexity, error_stack): no match
    }
  }
  if (t.text == module) return 3;
  return t.text == "Linear" ? 1 : 0;
}

int best_rank(const std::vector<Target>& targets, const std::string& module) {
  int best = 0;
  for (const Target& t : targets) best = std::max(best, match_rank(t, module));
  return best;
}

QuantizedScheme parse_weights(const Config& c, const json& w, const std::string& where) {
  if (!w.is_object()) bad(c, where + " is " + w.dump() + ", expected an object");
  QuantizedScheme s;
  const json* bits = find_key(w, "num_bits");
  if (bits == nullptr || !bits->is_number_integer()) bad(c, where + " has no integer num_bits");
  const int64_t b = bits->get<int64_t>();
  const std::string type = string_of(c, w, "type", where + ": ");
  if (!type.empty() && type != "int") {
    fail_unsupported("'" + c.file + "': " + where + " quantizes to type '" + type +
                     "'; qforge reads int weights (compressed-tensors pack-quantized)");
  }
  if (b != 4 && b != 8) {
    fail_unsupported("'" + c.file + "': " + where + " has num_bits " + std::to_string(b) +
                     "; qforge reads 4- and 8-bit weights");
  }
  s.bits = static_cast<int>(b);
  if (const json* sym = find_key(w, "symmetric")) {
    if (!sym->is_boolean()) bad(c, where + " \"symmetric\" is " + sym->dump());
    s.symmetric = sym->get<bool>();
  }
  if (!s.symmetric) {
    fail_unsupported("'" + c.file + "': " + where + " is asymmetric (weight_zero_point); qforge "
                     "reads symmetric compressed-tensors weights only");
  }
  // Set: present and anything but false ("group", true, ...).
  const auto set = [](const json* v) {
    return v != nullptr && !(v->is_boolean() && !v->get<bool>());
  };
  // Only actorder "group" (true in older configs) stores a permutation (weight_g_idx); "weight"
  // and "static" reorder the quantization, not the stored layout.
  if (const json* a = find_key(w, "actorder");
      set(a) && !(a->is_string() && (*a == "weight" || *a == "static"))) {
    fail_unsupported("'" + c.file + "': " + where + " has actorder " + a->dump() +
                     " (weight_g_idx); qforge reads checkpoints without activation order");
  }
  if (const json* d = find_key(w, "dynamic"); set(d)) {
    fail_unsupported("'" + c.file + "': " + where + " has dynamic " + d->dump() +
                     "; qforge reads static weight scales");
  }
  const std::string strategy = string_of(c, w, "strategy", where + ": ");
  const json* gs = find_key(w, "group_size");
  if (strategy == "group") {
    if (gs == nullptr || !gs->is_number_integer() || gs->get<int64_t>() <= 0 ||
        gs->get<int64_t>() > kMaxDim) {
      bad(c, where + " has strategy group without a positive integer group_size");
    }
    s.group_size = gs->get<int64_t>();
  } else if (strategy == "channel") {
    s.group_size = 0;
  } else {
    fail_unsupported("'" + c.file + "': " + where + " has strategy '" + strategy +
                     "'; qforge reads group and channel weight scales");
  }
  return s;
}

Config parse_config(const std::string& text, const std::string& file,
                    QuantizedCheckpoint& out) {
  Config c;
  c.file = file;
  const json root = json::parse(text, nullptr, false);
  if (root.is_discarded() || !root.is_object()) fail_invalid("'" + file + "' is not a JSON object");
  const json* q = find_key(root, "quantization_config");
  if (q == nullptr || !q->is_object()) fail_invalid("'" + file + "' has no quantization_config");
  out.quant_method = string_of(c, *q, "quant_method", "");
  if (out.quant_method != kCompressedTensorsMethod) {
    bad(c, "quant_method is '" + out.quant_method + "', not compressed-tensors");
  }
  c.format = string_of(c, *q, "format", "");
  out.format = c.format;
  const std::string status = string_of(c, *q, "quantization_status", "");
  if (!status.empty() && status != "compressed") {
    fail_unsupported("'" + file + "': quantization_status is '" + status +
                     "'; qforge reads compressed checkpoints (weights packed)");
  }
  if (const json* a = find_key(*q, "kv_cache_scheme")) {
    fail_unsupported("'" + file + "': kv_cache_scheme " + a->dump() +
                     " quantizes the KV cache; qforge reads weight-only checkpoints");
  }
  if (const json* ig = find_key(*q, "ignore")) {
    c.ignore = parse_targets(c, *ig, "\"ignore\"");
    for (const Target& t : c.ignore) c.ignore_text.push_back(t.text);
  }
  out.ignore = c.ignore_text;
  const json* groups = find_key(*q, "config_groups");
  if (groups == nullptr || !groups->is_object() || groups->empty()) {
    bad(c, "has no config_groups");
  }
  for (const auto& [name, g] : groups->items()) {
    const std::string where = "config_groups." + name;
    if (!g.is_object()) bad(c, where + " is " + g.dump() + ", expected an object");
    std::string format = string_of(c, g, "format", where + ": ");
    if (format.empty()) format = c.format;
    if (format != "pack-quantized") {
      fail_unsupported("'" + file + "': " + where + " has format '" + format +
                       "'; qforge reads compressed-tensors pack-quantized");
    }
    for (const char* act : {"input_activations", "output_activations"}) {
      if (const json* a = find_key(g, act)) {
        fail_unsupported("'" + file + "': " + where + " quantizes " + act + " (" + a->dump() +
                         "); qforge reads weight-only checkpoints");
      }
    }
    const json* targets = find_key(g, "targets");
    if (targets == nullptr) bad(c, where + " has no targets");
    const json* weights = find_key(g, "weights");
    if (weights == nullptr) bad(c, where + " has no weights scheme");
    Group group;
    group.name = name;
    group.targets = parse_targets(c, *targets, where + ".targets");
    group.scheme = parse_weights(c, *weights, where + ".weights");
    group.index = out.schemes.size();
    out.schemes.push_back(group.scheme);
    c.groups.push_back(std::move(group));
  }
  return c;
}

// module + suffix (appended, not operator+: GCC 12's -Wrestrict misfires on the latter at -O3).
std::string named(const std::string& module, std::string_view suffix) {
  std::string s;
  s.reserve(module.size() + suffix.size());
  s.append(module);
  s.append(suffix);
  return s;
}

std::string module_of(const std::string& name, std::string_view suffix) {
  return name.substr(0, name.size() - suffix.size());
}

// weight_shape's (N, K), checked.
std::pair<int64_t, int64_t> read_weight_shape(const Config& c, const std::string& name,
                                              const Tensor& t) {
  if ((t.dtype() != DType::I64 && t.dtype() != DType::I32) || t.shape() != Shape{2}) {
    fail_invalid("'" + c.file + "': tensor '" + name + "' is " +
                 std::string(dtype_name(t.dtype())) + " " + shape_to_string(t.shape()) +
                 ", expected int64 [2] (the weight's [N, K])");
  }
  int64_t n = 0, k = 0;
  if (t.dtype() == DType::I64) {
    n = t.data<int64_t>()[0];
    k = t.data<int64_t>()[1];
  } else {
    n = t.data<int32_t>()[0];
    k = t.data<int32_t>()[1];
  }
  if (n <= 0 || k <= 0 || n > kMaxDim || k > kMaxDim) {
    fail_invalid("'" + c.file + "': tensor '" + name + "' holds [" + std::to_string(n) + ", " +
                 std::to_string(k) + "], not a Linear weight's shape");
  }
  return {n, k};
}

// int32 words [N, ceil(K * bits / 32)] -> i4 or i8 [N, K].
Tensor unpack_int32(const Tensor& packed, int bits, int64_t n, int64_t k) {
  const int64_t words = (k * bits + 31) / 32;
  const int per_word = 32 / bits;
  const uint32_t mask = (1u << bits) - 1;
  const int32_t offset = 1 << (bits - 1);
  Tensor values(bits == 4 ? DType::I4 : DType::I8, {n, k});
  const auto in = packed.data<uint32_t>();
  auto out = values.mutable_data<uint8_t>();
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t col = 0; col < k; ++col) {
      const uint32_t word = in[static_cast<size_t>(r * words + col / per_word)];
      const int32_t q = static_cast<int32_t>((word >> (bits * (col % per_word))) & mask) - offset;
      const int64_t e = r * k + col;
      if (bits == 4) {
        out[static_cast<size_t>(e / 2)] |=
            static_cast<uint8_t>((static_cast<uint32_t>(q) & 0x0f) << (4 * (e % 2)));
      } else {
        out[static_cast<size_t>(e)] = static_cast<uint8_t>(static_cast<int8_t>(q));
      }
    }
  }
  return values;
}

const Group* group_of(const Config& c, const std::string& module) {
  const Group* best = nullptr;
  int best_r = 0;
  for (const Group& g : c.groups) {
    const int r = best_rank(g.targets, module);
    if (r > best_r) {
      best = &g;
      best_r = r;
    }
  }
  return best;
}

}  // namespace

QuantizedCheckpoint read_compressed_tensors(const std::string& config_text,
                                            const std::string& file, Graph& graph) {
  QuantizedCheckpoint out;
  const Config c = parse_config(config_text, file, out);
  const auto tensor_error = [&](const std::string& name, const std::string& what) {
    fail_invalid("'" + file + "' (compressed-tensors): tensor '" + name + "' " + what);
  };

  // Modules with a packed weight, and the side tensors each must come with.
  std::set<std::string> modules;
  for (const auto& [name, t] : graph.initializers()) {
    if (name.ends_with(kPacked)) modules.insert(module_of(name, kPacked));
  }
  if (modules.empty()) {
    fail_invalid("'" + file + "' declares compressed-tensors pack-quantized weights, but the "
                 "folder holds no tensor named <module>.weight_packed");
  }
  for (const auto& [name, t] : graph.initializers()) {
    for (std::string_view suffix : {kScale, kShape, kZeroPoint, kGIdx}) {
      if (name.ends_with(suffix) && modules.count(module_of(name, suffix)) == 0) {
        tensor_error(name, "has no " + named(module_of(name, suffix), kPacked) +
                               " beside it (a side tensor of a packed weight)");
      }
    }
  }

  for (const std::string& module : modules) {
    const std::string packed_name = named(module, kPacked);
    const std::string weight = module + ".weight";
    const Group* group = group_of(c, module);
    if (group == nullptr) {
      tensor_error(packed_name, "is packed, but no config group's targets match '" + module + "'");
    }
    if (best_rank(c.ignore, module) > 1) {  // a name or regex; "Linear" in ignore is a class
      tensor_error(packed_name, "is packed, but quantization_config.ignore lists '" + module +
                                    "' as left float");
    }
    if (graph.has_initializer(weight)) {
      tensor_error(weight, "is stored float beside " + packed_name + ": one of the two is stray");
    }
    if (graph.has_initializer(named(module, kZeroPoint))) {
      tensor_error(named(module, kZeroPoint),
                   "is a zero point, but config_groups." + group->name + " is symmetric");
    }
    if (graph.has_initializer(named(module, kGIdx))) {
      tensor_error(named(module, kGIdx), "is an act-order index, but config_groups." +
                                                    group->name + " has no actorder");
    }
    const std::string shape_name = named(module, kShape);
    const std::string scale_name = named(module, kScale);
    const Tensor* shape_t = graph.find_initializer(shape_name);
    if (shape_t == nullptr) tensor_error(packed_name, "has no " + shape_name + " beside it");
    const Tensor* scale_t = graph.find_initializer(scale_name);
    if (scale_t == nullptr) tensor_error(packed_name, "has no " + scale_name + " beside it");
    const auto [n, k] = read_weight_shape(c, shape_name, *shape_t);
    const QuantizedScheme& s = group->scheme;
    const std::string scheme_text = "config_groups." + group->name + " (" +
                                    std::to_string(s.bits) + " bits, " +
                                    (s.group_size > 0 ? "group " + std::to_string(s.group_size)
                                                      : std::string("per channel")) +
                                    ") and " + shape_name + " [" + std::to_string(n) + ", " +
                                    std::to_string(k) + "]";
    const Tensor& packed = *graph.find_initializer(packed_name);
    const Shape packed_shape{n, (k * s.bits + 31) / 32};
    if (packed.dtype() != DType::I32 || packed.shape() != packed_shape) {
      tensor_error(packed_name, "is " + std::string(dtype_name(packed.dtype())) + " " +
                                    shape_to_string(packed.shape()) + "; " + scheme_text +
                                    " make it i32 " + shape_to_string(packed_shape));
    }
    if (!dtype_is_float(scale_t->dtype())) {
      tensor_error(scale_name, "is " + std::string(dtype_name(scale_t->dtype())) +
                                   ", expected a float scale");
    }
    Tensor scale = *scale_t;
    if (s.group_size > 0) {
      if (k % s.group_size != 0) {
        fail_unsupported("'" + file + "': " + packed_name + " has K = " + std::to_string(k) +
                         ", not a multiple of the group size " + std::to_string(s.group_size) +
                         " (a partial last group); qforge reads whole groups");
      }
      const Shape want{n, k / s.group_size};
      if (scale.shape() != want) {
        tensor_error(scale_name, "has shape " + shape_to_string(scale.shape()) + "; " +
                                     scheme_text + " make it " + shape_to_string(want));
      }
    } else {
      if (scale.shape() != Shape{n, 1} && scale.shape() != Shape{n}) {
        tensor_error(scale_name, "has shape " + shape_to_string(scale.shape()) + "; " +
                                     scheme_text + " make it " + shape_to_string(Shape{n, 1}));
      }
      scale = Tensor(scale.dtype(), {n}, scale.storage(), scale.offset());  // [N, 1] -> [N]
    }
    Tensor values = unpack_int32(packed, s.bits, n, k);
    graph.remove_initializer(packed_name);
    graph.remove_initializer(shape_name);
    graph.remove_initializer(scale_name);
    // Scale name stays "<module>.weight_scale" (ir/quantized_linear.h's "<weight>_scale").
    store_quantized_linear(graph, weight, std::move(values), std::move(scale), s.group_size);
    ++out.schemes[group->index].linears;
    ++out.quantized_linears;
  }
  return out;
}

}  // namespace qforge
