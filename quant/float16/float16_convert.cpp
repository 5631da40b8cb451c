// Float16 conversion: see quant/float16_convert.h. Steps: infer every value's dtype (op rules,
// then value_info), decide per node whether it is converted or kept in f32, rename graph
// outputs whose type changes, rebuild the node list inserting Casts (memoized per value and
// target type) in front of the first reader that needs them, then drop no-op and round-trip
// Casts.
#include "quant/float16/float16_convert.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "ir/error.h"
#include "ir/half.h"

namespace qforge {

namespace {

bool default_domain(const Node& node) { return node.domain.empty() || node.domain == "ai.onnx"; }

bool is_matmulnbits(const Node& node) {
  return node.domain == "com.microsoft" && node.op_type == "MatMulNBits";
}

bool has_subgraph(const Node& node) {
  return std::any_of(node.attributes.begin(), node.attributes.end(),
                     [](const Attribute& a) { return a.g != nullptr || !a.graphs.empty(); });
}

// Ops whose output type is fixed, or comes from an attribute or another input than the first.
const std::set<std::string, std::less<>> kI64Outputs = {"Shape",  "Size",   "NonZero",
                                                        "ArgMax", "ArgMin", "NonMaxSuppression"};
const std::set<std::string, std::less<>> kBoolOutputs = {
    "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Not",
    "And",   "Or",   "Xor",         "IsNaN",   "IsInf"};
// Ops that never run in 16 bits: Range has no f16 type in ONNX, NonMaxSuppression and
// DynamicQuantizeLinear take f32 only.
const std::set<std::string, std::less<>> kAlwaysF32 = {"Range", "NonMaxSuppression",
                                                       "DynamicQuantizeLinear"};
// Inputs that ONNX types as f32 whatever the data's type (Resize's roi and scales).
bool fixed_f32_input(const Node& node, size_t input) {
  return (node.op_type == "Resize" && (input == 1 || input == 2)) ||
         (node.op_type == "Upsample" && input == 1);
}
// Inputs of any type: the op does not tie them to its float type.
bool untyped_input(const Node& node, size_t input) {
  return input == 0 && (node.op_type == "Cast" || node.op_type == "Shape" ||
                        node.op_type == "Size" || node.op_type == "CastLike");
}

std::optional<DType> onnx_attr_dtype(const Node& node, std::string_view attr) {
  const Attribute* a = node.attr(attr);
  if (a == nullptr || a->type != AttrType::Int || a->i == 0) return std::nullopt;
  return dtype_from_onnx(static_cast<int>(a->i));
}

// The dtype of output k of `node`, from the op's rule; nullopt when the rule does not know.
template <typename In>
std::optional<DType> output_dtype(const Node& node, size_t k, In in) {
  if (is_matmulnbits(node)) return in(0);
  if (!default_domain(node)) return std::nullopt;
  const std::string& op = node.op_type;
  if (op == "Cast") return onnx_attr_dtype(node, "to");
  if (op == "CastLike") return in(1);
  if (kI64Outputs.count(op)) return DType::I64;
  if (kBoolOutputs.count(op)) return DType::Bool;
  if (op == "TopK") return k == 1 ? std::optional(DType::I64) : in(0);
  if (op == "Unique") return k == 0 ? in(0) : std::optional(DType::I64);
  if (op == "Dropout") return k == 1 ? std::optional(DType::Bool) : in(0);
  if (op == "MatMulInteger" || op == "ConvInteger") return DType::I32;
  if (op == "DequantizeLinear") return in(1);
  if (op == "QuantizeLinear") {
    if (auto zp = in(2)) return zp;
    if (auto d = onnx_attr_dtype(node, "output_dtype")) return d;
    return DType::U8;
  }
  if (op == "DynamicQuantizeLinear") return k == 1 ? DType::F32 : DType::U8;
  if (op == "Where") return in(1);
  if (op == "OneHot") return in(2);
  if (op == "LayerNormalization" && k > 0) {
    return dtype_from_onnx(static_cast<int>(node.attr_int("stash_type", 1)));
  }
  if (op == "Constant") {
    const Attribute* v = node.attr("value");
    if (v != nullptr && v->type == AttrType::Tensor) return v->t.dtype();
    if (node.attr("value_float") || node.attr("value_floats")) return DType::F32;
    if (node.attr("value_int") || node.attr("value_ints")) return DType::I64;
    return std::nullopt;
  }
  if (op == "ConstantOfShape") {
    const Attribute* v = node.attr("value");
    return v != nullptr && v->type == AttrType::Tensor ? v->t.dtype() : DType::F32;
  }
  if (auto d = onnx_attr_dtype(node, "dtype")) return d;
  if (op == "RandomNormal" || op == "RandomUniform") return DType::F32;
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    if (auto d = in(i)) return d;
  }
  return std::nullopt;
}

std::unordered_map<std::string, DType> infer_dtypes(const Graph& graph) {
  std::unordered_map<std::string, DType> types;
  for (const auto& [name, tensor] : graph.initializers()) types[name] = tensor.dtype();
  for (const ValueInfo& v : graph.inputs)
    if (v.dtype) types[v.name] = *v.dtype;
  std::unordered_map<std::string, DType> declared;
  for (const auto* list : {&graph.value_info, &graph.outputs})
    for (const ValueInfo& v : *list)
      if (v.dtype) declared[v.name] = *v.dtype;
  for (const Node& node : graph.nodes) {
    const auto in = [&](size_t i) -> std::optional<DType> {
      if (i >= node.inputs.size() || node.inputs[i].empty()) return std::nullopt;
      const auto it = types.find(node.inputs[i]);
      return it == types.end() ? std::nullopt : std::optional(it->second);
    };
    for (size_t k = 0; k < node.outputs.size(); ++k) {
      if (node.outputs[k].empty()) continue;
      std::optional<DType> d = output_dtype(node, k, in);
      if (!d) {
        const auto it = declared.find(node.outputs[k]);
        if (it != declared.end()) d = it->second;
      }
      if (d) types[node.outputs[k]] = *d;
    }
  }
  return types;
}

// f32 -> f16/bf16, nearest even; finite values past the range saturate. `clamped` counts them.
uint16_t narrow(float v, DType to, int64_t& clamped) {
  const uint16_t h = to == DType::F16 ? f32_to_f16(v) : f32_to_bf16(v);
  const uint16_t exp_mask = to == DType::F16 ? 0x7c00 : 0x7f80;
  const bool inf = (h & 0x7fff) == exp_mask;
  if (inf && std::isfinite(v)) {
    ++clamped;
    return static_cast<uint16_t>((h & 0x8000) | (exp_mask - 1));  // largest finite
  }
  return h;
}

Tensor narrow_tensor(const Tensor& t, DType to, int64_t& clamped) {
  Tensor out(to, t.shape());
  const std::vector<float> v = t.to_f32();
  auto dst = out.mutable_data<uint16_t>();
  for (size_t i = 0; i < v.size(); ++i) dst[i] = narrow(v[i], to, clamped);
  return out;
}

bool lossless_widening(DType from, DType to) {
  return from == to || (to == DType::F32 && (from == DType::F16 || from == DType::BF16)) ||
         (to == DType::F64 && (from == DType::F16 || from == DType::BF16 || from == DType::F32));
}

class Float16ConvertPass final : public Pass {
 public:
  explicit Float16ConvertPass(Float16ConvertOptions options) : options_(std::move(options)) {
    if (options_.act_dtype != DType::F16 && options_.act_dtype != DType::BF16) {
      fail_usage("float16 conversion: activation dtype " +
                 std::string(dtype_name(options_.act_dtype)) + " is not f16 or bf16");
    }
    for (const std::string& op : options_.keep_fp32_ops) {
      if (op == kKeepOutputProjection) {
        keep_output_projection_ = true;
      } else if (op == kKeepEmbeddings) {
        keep_embeddings_ = true;
      } else {
        keep_ops_.insert(op);
      }
    }
  }

  [[nodiscard]] std::string_view name() const override { return "float16"; }

  void run(Graph& graph, PassReport& report) override {
    for (const Node& node : graph.nodes) {
      if (has_subgraph(node)) {
        fail_unsupported("--act-dtype " + std::string(dtype_name(options_.act_dtype)) + ": " +
                         node.label() +
                         " has a subgraph; converting If/Loop/Scan bodies is not supported "
                         "(use --act-dtype fp32)");
      }
    }
    low_ = options_.act_dtype;
    const uint64_t bytes_before = graph.parameter_bytes();
    report.stats["act_dtype"] = std::string(dtype_name(low_));
    report.stats["keep_io_types"] = options_.keep_io_types;
    for (const char* key :
         {"converted_nodes", "kept_nodes", "initializers_converted", "initializers_kept_f32",
          "casts_inserted", "casts_removed", "clamped_values"})
      report.stats[key] = 0;

    orig_ = infer_dtypes(graph);
    int64_t unknown = 0;
    std::string first_unknown;
    for (const Node& node : graph.nodes) {
      for (const std::string& out : node.outputs) {
        if (out.empty() || orig_.count(out)) continue;
        if (unknown++ == 0) first_unknown = "'" + out + "' of " + node.label();
      }
    }
    if (unknown > 0) {
      report.warn(std::to_string(unknown) + " values have no known dtype (first: " + first_unknown +
                  "; no value_info declares it): they are left as they are, so a float one "
                  "read by a converted node would not type-check; add value_info or keep "
                  "that op in fp32");
    }
    for (const auto& [name, tensor] : graph.initializers()) used_names_.insert(name);
    for (const Node& node : graph.nodes) {
      used_names_.insert(node.name);
      used_names_.insert(node.outputs.begin(), node.outputs.end());
    }
    for (const ValueInfo& v : graph.inputs) used_names_.insert(v.name);
    for (const ValueInfo& v : graph.outputs) used_names_.insert(v.name);

    decide_kept(graph, report);
    types_ = orig_;
    for (const ValueInfo& v : graph.inputs) {
      if (is_f32(v.name) && !options_.keep_io_types && !graph.has_initializer(v.name))
        types_[v.name] = low_;
    }
    for (size_t i = 0; i < graph.nodes.size(); ++i) {
      if (!kept_[i]) set_output_types(graph.nodes[i]);
    }
    convert_initializers_in_place(graph, report);
    const auto renamed = rename_boundary_outputs(graph);
    rebuild(graph, renamed, report);
    remove_redundant_casts(graph, report);
    drop_unread_initializers(graph);
    update_value_info(graph);

    const uint64_t bytes_after = graph.parameter_bytes();
    report.stats["bytes_before"] = bytes_before;
    report.stats["bytes_after"] = bytes_after;
    if (report.stats["clamped_values"].get<int64_t>() > 0) {
      report.warn(std::to_string(report.stats["clamped_values"].get<int64_t>()) +
                  " constant values exceed the " + std::string(dtype_name(low_)) +
                  " range and were saturated to its largest finite value");
    }
    graph.check();
  }

 private:
  bool is_f32(const std::string& value) const {
    const auto it = orig_.find(value);
    return it != orig_.end() && it->second == DType::F32;
  }

  // Output projection: a MatMul/Gemm/MatMulNBits whose result, directly or through one Add,
  // is a graph output, or whose name or weight names an lm_head; and that bias Add.
  static bool is_output_projection(
      const Graph& graph, const Node& node, const std::unordered_set<std::string>& outputs,
      const std::unordered_map<std::string, std::vector<size_t>>& readers) {
    const auto matmul = [](const Node& n) {
      return n.op_type == "MatMul" || n.op_type == "Gemm" || is_matmulnbits(n);
    };
    if (node.outputs.empty()) return false;
    if (node.op_type == "Add" && outputs.count(node.outputs[0])) {  // its bias Add
      const auto producers = graph.producers();
      return std::any_of(node.inputs.begin(), node.inputs.end(), [&](const std::string& in) {
        const auto p = producers.find(in);
        return p != producers.end() && matmul(graph.nodes[p->second]);
      });
    }
    if (!matmul(node)) return false;
    const auto lm_head = [](const std::string& s) {
      return s.find("lm_head") != std::string::npos;
    };
    if (lm_head(node.name) || std::any_of(node.inputs.begin(), node.inputs.end(), lm_head))
      return true;
    const std::string& out = node.outputs[0];
    if (outputs.count(out)) return true;
    const auto r = readers.find(out);
    if (r == readers.end() || r->second.size() != 1) return false;
    const Node& next = graph.nodes[r->second[0]];
    return next.op_type == "Add" && !next.outputs.empty() && outputs.count(next.outputs[0]) > 0;
  }

  void decide_kept(const Graph& graph, PassReport& report) {
    std::unordered_set<std::string> outputs;
    for (const ValueInfo& v : graph.outputs) outputs.insert(v.name);
    const auto readers = graph.consumers();
    std::map<std::string, int64_t> kept_by;
    kept_.assign(graph.nodes.size(), false);
    for (size_t i = 0; i < graph.nodes.size(); ++i) {
      const Node& node = graph.nodes[i];
      std::string why;
      if (!default_domain(node) && !is_matmulnbits(node)) {
        why = "domain " + node.domain;
      } else if (default_domain(node) && keep_ops_.count(node.op_type)) {
        why = node.op_type;
      } else if (kAlwaysF32.count(node.op_type) || node.attr("dtype") != nullptr) {
        why = node.op_type + " (f32 only)";
      } else if (keep_output_projection_ && is_output_projection(graph, node, outputs, readers)) {
        why = std::string(kKeepOutputProjection);
      } else if (keep_embeddings_ && node.op_type == "Gather" && !node.inputs.empty() &&
                 graph.has_initializer(node.inputs[0]) && is_f32(node.inputs[0])) {
        why = std::string(kKeepEmbeddings);
      }
      if (why.empty()) {
        report.count("converted_nodes");
        continue;
      }
      kept_[i] = true;
      report.count("kept_nodes");
      ++kept_by[why];
    }
    // A Cast/Constant making an f32 value that only f32 readers take stays f32 (an int64
    // length cast for Range must not pass through 16 bits).
    for (size_t i = 0; i < graph.nodes.size(); ++i) {
      const Node& node = graph.nodes[i];
      const bool source =
          node.op_type == "Cast" || node.op_type == "Constant" || node.op_type == "ConstantOfShape";
      if (kept_[i] || !source || !default_domain(node) || node.outputs.size() != 1 ||
          !is_f32(node.outputs[0]))
        continue;
      const auto r = readers.find(node.outputs[0]);
      const bool is_output = outputs.count(node.outputs[0]) > 0;
      if ((r == readers.end() && !is_output) || (is_output && !options_.keep_io_types)) continue;
      bool all_f32 = true;
      for (size_t j : r == readers.end() ? std::vector<size_t>{} : r->second) {
        const Node& reader = graph.nodes[j];
        for (size_t k = 0; k < reader.inputs.size(); ++k) {
          if (reader.inputs[k] == node.outputs[0] && !kept_[j] && !fixed_f32_input(reader, k))
            all_f32 = false;
        }
      }
      if (!all_f32) continue;
      kept_[i] = true;
      report.count("converted_nodes", -1);
      report.count("kept_nodes");
      ++kept_by[node.op_type + " (f32 readers)"];
    }
    report.stats["kept"] = nlohmann::ordered_json::object();
    for (const auto& [why, n] : kept_by) report.stats["kept"][why] = n;
  }

  // A converted node's f32 outputs take the activation dtype when the node computes from f32
  // inputs or makes its float value itself (Cast, Constant, ConstantOfShape).
  void set_output_types(const Node& node) {
    const bool source = node.op_type == "Cast" || node.op_type == "Constant" ||
                        node.op_type == "ConstantOfShape" || node.op_type == "CastLike";
    bool f32_input = false;
    for (size_t k = 0; k < node.inputs.size(); ++k) {
      if (!node.inputs[k].empty() && is_f32(node.inputs[k]) && !fixed_f32_input(node, k) &&
          !untyped_input(node, k))
        f32_input = true;
    }
    if (!source && !f32_input) return;
    for (size_t k = 0; k < node.outputs.size(); ++k) {
      if (node.op_type == "LayerNormalization" && k > 0) continue;  // stash_type
      if (!node.outputs[k].empty() && is_f32(node.outputs[k])) types_[node.outputs[k]] = low_;
    }
  }

  // The dtype input k of node i must have, or nullopt when it is not an f32 value or any type
  // will do.
  std::optional<DType> required(const Node& node, size_t i, size_t k) const {
    const std::string& v = node.inputs[k];
    if (v.empty() || !is_f32(v)) return std::nullopt;
    if (kept_[i] || fixed_f32_input(node, k)) return DType::F32;
    if (untyped_input(node, k)) return std::nullopt;
    return low_;
  }

  // Initializers that only converted nodes read (and that are not graph inputs or outputs) are
  // rounded in place, keeping their names.
  void convert_initializers_in_place(Graph& graph, PassReport& report) {
    std::unordered_set<std::string> exposed;
    for (const ValueInfo& v : graph.inputs) exposed.insert(v.name);
    for (const ValueInfo& v : graph.outputs) exposed.insert(v.name);
    std::map<std::string, std::set<DType>> needs;
    for (size_t i = 0; i < graph.nodes.size(); ++i) {
      const Node& node = graph.nodes[i];
      for (size_t k = 0; k < node.inputs.size(); ++k) {
        if (!graph.has_initializer(node.inputs[k])) continue;
        if (auto r = required(node, i, k)) needs[node.inputs[k]].insert(*r);
      }
    }
    int64_t clamped = 0;
    for (const auto& [name, types] : needs) {
      if (exposed.count(name)) continue;
      if (types.size() == 1 && *types.begin() == low_) {
        graph.set_initializer(name, narrow_tensor(*graph.find_initializer(name), low_, clamped));
        types_[name] = low_;
        report.count("initializers_converted");
      } else if (types.count(DType::F32)) {
        report.count("initializers_kept_f32");
      }
    }
    report.count("clamped_values", clamped);
  }

  std::string fresh(const std::string& hint) {
    std::string name = hint;
    for (int n = 1; used_names_.count(name); ++n) name = hint + "_" + std::to_string(n);
    used_names_.insert(name);
    return name;
  }

  // Graph outputs whose new type is not the boundary type: the producer writes a renamed
  // value and a Cast after it produces the output under its own name. Returns new -> old.
  std::unordered_map<std::string, std::string> rename_boundary_outputs(Graph& graph) {
    std::unordered_map<std::string, std::string> renamed;
    std::unordered_map<std::string, std::string> rename;
    for (const ValueInfo& v : graph.outputs) {
      if (!is_f32(v.name)) continue;
      const DType boundary = options_.keep_io_types ? DType::F32 : low_;
      if (types_[v.name] == boundary) continue;
      bool produced = false;
      for (const Node& node : graph.nodes)
        produced = produced || std::find(node.outputs.begin(), node.outputs.end(), v.name) !=
                                   node.outputs.end();
      if (!produced) continue;
      const std::string inner = fresh(v.name + "_" + std::string(dtype_name(types_[v.name])));
      types_[inner] = types_[v.name];
      orig_[inner] = DType::F32;
      types_[v.name] = boundary;
      rename[v.name] = inner;
      renamed[inner] = v.name;
    }
    if (rename.empty()) return renamed;
    for (Node& node : graph.nodes) {
      for (auto* list : {&node.inputs, &node.outputs})
        for (std::string& s : *list)
          if (auto it = rename.find(s); it != rename.end()) s = it->second;
    }
    for (ValueInfo& v : graph.value_info)
      if (auto it = rename.find(v.name); it != rename.end()) v.name = it->second;
    for (const auto& [from, to] : rename) graph.rename_in_quant_records(from, to);
    return renamed;
  }

  Node make_cast(const std::string& from, const std::string& to_value, DType to) {
    Node cast;
    cast.op_type = "Cast";
    cast.name = fresh(to_value + "_Cast");
    cast.inputs = {from};
    cast.outputs = {to_value};
    cast.set_attr(Attribute::make_int("to", dtype_to_onnx(to)));
    types_[to_value] = to;
    return cast;
  }

  // `value` as dtype `to`: itself, a converted initializer copy, or the output of a Cast
  // appended to `nodes` (memoized, so each value is cast once per type).
  std::string as_type(Graph& graph, const std::string& value, DType to, std::vector<Node>& nodes,
                      PassReport& report) {
    if (types_[value] == to) return value;
    const auto key = std::make_pair(value, to);
    if (auto it = memo_.find(key); it != memo_.end()) return it->second;
    std::string result;
    const auto p = cast_source_.find(value);
    if (p != cast_source_.end() && lossless_widening(types_[p->second], to)) {
      // value was Cast(src, to f32) from 16 bits in the original graph: cast src directly.
      result = as_type(graph, p->second, to, nodes, report);
    } else if (graph.has_initializer(value) && !graph_input_names_.count(value)) {
      int64_t clamped = 0;
      const Tensor* t = graph.find_initializer(value);
      result = fresh(value + "_" + std::string(dtype_name(to)));
      graph.set_initializer(result, to == DType::F32 ? Tensor::from_f32(t->to_f32(), t->shape())
                                                     : narrow_tensor(*t, to, clamped));
      types_[result] = to;
      report.count("clamped_values", clamped);
      report.count("initializers_converted");
    } else {
      result = fresh(value + "_" + std::string(dtype_name(to)));
      nodes.push_back(make_cast(value, result, to));
      report.count("casts_inserted");
    }
    memo_[key] = result;
    return result;
  }

  // Converted nodes' float attributes follow the activation dtype.
  void convert_attributes(Node& node, PassReport& report) const {
    const int low_onnx = dtype_to_onnx(low_);
    int64_t clamped = 0;
    if (node.op_type == "Cast" && node.attr_int("to", 0) == dtype_to_onnx(DType::F32)) {
      node.set_attr(Attribute::make_int("to", low_onnx));
    } else if (node.op_type == "Constant" || node.op_type == "ConstantOfShape") {
      const Attribute* v = node.attr("value");
      Attribute value;
      value.name = "value";
      value.type = AttrType::Tensor;
      if (v != nullptr && v->type == AttrType::Tensor && v->t.dtype() == DType::F32) {
        value.t = narrow_tensor(v->t, low_, clamped);
      } else if (const Attribute* f = node.attr("value_float")) {
        value.t = narrow_tensor(Tensor::from_f32({&f->f, 1}, {}), low_, clamped);
      } else if (const Attribute* fs = node.attr("value_floats")) {
        value.t = narrow_tensor(
            Tensor::from_f32(fs->floats, {static_cast<int64_t>(fs->floats.size())}), low_, clamped);
      } else if (node.op_type == "ConstantOfShape" && v == nullptr) {
        value.t = Tensor(low_, {1});  // the default f32 zero
      } else {
        return;
      }
      std::erase_if(node.attributes, [](const Attribute& a) {
        return a.name == "value_float" || a.name == "value_floats";
      });
      node.set_attr(std::move(value));
    }
    report.count("clamped_values", clamped);
  }

  void rebuild(Graph& graph, const std::unordered_map<std::string, std::string>& renamed,
               PassReport& report) {
    for (const ValueInfo& v : graph.inputs) graph_input_names_.insert(v.name);
    for (const Node& node : graph.nodes) {
      if (node.op_type == "Cast" && default_domain(node) && !node.outputs.empty() &&
          is_f32(node.outputs[0]) && !node.inputs.empty()) {
        const auto src = orig_.find(node.inputs[0]);
        if (src != orig_.end() && (src->second == DType::F16 || src->second == DType::BF16))
          cast_source_[node.outputs[0]] = node.inputs[0];
      }
    }
    std::vector<Node> nodes;
    nodes.reserve(graph.nodes.size());
    for (size_t i = 0; i < graph.nodes.size(); ++i) {
      Node node = graph.nodes[i];
      for (size_t k = 0; k < node.inputs.size(); ++k) {
        const auto r = required(node, i, k);
        if (!r) continue;
        const std::string read = node.inputs[k];
        node.inputs[k] = as_type(graph, read, *r, nodes, report);
        // A converted copy of a record's scale: the record names what its reader now reads.
        if (node.inputs[k] != read && !node.outputs.empty())
          graph.retarget_quant_records(node.outputs[0], read, node.inputs[k]);
      }
      if (!kept_[i]) convert_attributes(node, report);
      std::vector<std::string> boundary;
      for (const std::string& out : node.outputs)
        if (renamed.count(out)) boundary.push_back(out);
      nodes.push_back(std::move(node));
      for (const std::string& inner : boundary) {
        const std::string& outer = renamed.at(inner);
        nodes.push_back(make_cast(inner, outer, types_[outer]));
        report.count("casts_inserted");
      }
    }
    graph.nodes = std::move(nodes);
  }

  DType type_of(const std::string& v) const {
    const auto it = types_.find(v);
    return it == types_.end() ? DType::U8 : it->second;  // U8: unknown, never a float match
  }

  // Casts to the type their input already has, and lossless round trips a -> wide -> a.
  void remove_redundant_casts(Graph& graph, PassReport& report) {
    std::unordered_set<std::string> outputs;
    for (const ValueInfo& v : graph.outputs) outputs.insert(v.name);
    std::unordered_map<std::string, std::string> alias;
    std::unordered_map<std::string, size_t> producer;
    const auto resolve = [&](std::string v) {
      for (auto it = alias.find(v); it != alias.end(); it = alias.find(v)) v = it->second;
      return v;
    };
    for (size_t i = 0; i < graph.nodes.size(); ++i) {
      Node& node = graph.nodes[i];
      for (std::string& in : node.inputs)
        if (!in.empty()) in = resolve(in);
      for (const std::string& out : node.outputs) producer[out] = i;
      if (node.op_type != "Cast" || !default_domain(node) || node.inputs.empty() ||
          node.outputs.empty() || outputs.count(node.outputs[0]))
        continue;
      const std::string& src = node.inputs[0];
      const auto to = dtype_from_onnx(static_cast<int>(node.attr_int("to", 0)));
      if (!to) continue;
      if (type_of(src) == *to) {
        alias[node.outputs[0]] = src;
        continue;
      }
      const auto p = producer.find(src);
      if (p == producer.end()) continue;
      const Node& prev = graph.nodes[p->second];
      if (prev.op_type == "Cast" && default_domain(prev) && !prev.inputs.empty() &&
          type_of(prev.inputs[0]) == *to && lossless_widening(*to, type_of(src))) {
        alias[node.outputs[0]] = prev.inputs[0];
      }
    }
    // Drop Casts nobody reads any more (repeat: removing one can orphan its source Cast).
    for (bool changed = true; changed;) {
      changed = false;
      std::unordered_set<std::string> read(outputs.begin(), outputs.end());
      for (const Node& node : graph.nodes) read.insert(node.inputs.begin(), node.inputs.end());
      const size_t before = graph.nodes.size();
      std::erase_if(graph.nodes, [&](const Node& node) {
        return node.op_type == "Cast" && default_domain(node) && node.outputs.size() == 1 &&
               !read.count(node.outputs[0]);
      });
      const auto removed = static_cast<int64_t>(before - graph.nodes.size());
      if (removed > 0) {
        changed = true;
        report.count("casts_removed", removed);
      }
    }
  }

  static void drop_unread_initializers(Graph& graph) {
    std::unordered_set<std::string> read;
    for (const Node& node : graph.nodes) read.insert(node.inputs.begin(), node.inputs.end());
    for (const ValueInfo& v : graph.outputs) read.insert(v.name);
    for (const ValueInfo& v : graph.inputs) read.insert(v.name);
    std::vector<std::string> unread;
    for (const auto& [name, tensor] : graph.initializers())
      if (!read.count(name)) unread.push_back(name);
    for (const std::string& name : unread) graph.remove_initializer(name);
    // value_info of values that no longer exist (dropped initializers, removed Casts).
    std::unordered_set<std::string> defined(read.begin(), read.end());
    for (const Node& node : graph.nodes) defined.insert(node.outputs.begin(), node.outputs.end());
    std::erase_if(graph.value_info, [&](const ValueInfo& v) {
      return !defined.count(v.name) && !graph.has_initializer(v.name);
    });
  }

  void update_value_info(Graph& graph) const {
    for (auto* list : {&graph.inputs, &graph.outputs, &graph.value_info}) {
      for (ValueInfo& v : *list) {
        const auto it = types_.find(v.name);
        if (it != types_.end() && v.dtype && dtype_is_float(*v.dtype)) v.dtype = it->second;
      }
    }
    // Initializers converted in place are declared with their new dtype where listed.
    for (ValueInfo& v : graph.value_info) {
      if (const Tensor* t = graph.find_initializer(v.name)) v.dtype = t->dtype();
    }
  }

  Float16ConvertOptions options_;
  std::set<std::string, std::less<>> keep_ops_;
  bool keep_output_projection_ = false;
  bool keep_embeddings_ = false;
  DType low_ = DType::F16;
  std::unordered_map<std::string, DType> orig_;   // dtypes before the pass
  std::unordered_map<std::string, DType> types_;  // dtypes after it
  std::vector<bool> kept_;
  std::unordered_set<std::string> used_names_;
  std::unordered_set<std::string> graph_input_names_;
  std::unordered_map<std::string, std::string> cast_source_;  // Cast(16-bit src -> f32): src
  std::map<std::pair<std::string, DType>, std::string> memo_;
};

}  // namespace

std::vector<std::string> default_keep_fp32_ops() {
  return {"LayerNormalization",
          "Softmax",
          "LogSoftmax",
          "ReduceMean",
          "ReduceSum",
          "ReduceMax",
          "ReduceSumSquare",
          "ReduceL2",
          "ReduceLogSumExp",
          "Pow",
          "Sqrt",
          "Exp",
          std::string(kKeepOutputProjection),
          std::string(kKeepEmbeddings)};
}

std::unique_ptr<Pass> make_float16_convert_pass(Float16ConvertOptions options) {
  return std::make_unique<Float16ConvertPass>(std::move(options));
}

}  // namespace qforge
