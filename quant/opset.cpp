#include "quant/opset.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <map>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ir/error.h"

namespace qforge {

namespace {

constexpr int64_t kNewestOpset = 21;

bool default_domain(const Node& node) { return node.domain.empty() || node.domain == "ai.onnx"; }

// One node being rewritten in graph `g` (the model root or a subgraph): the adapter edits
// `node` and may add initializers to `g` and nodes to run before or after it.
struct Site {
  const Graph& root;
  Graph& g;
  Node& node;
  std::unordered_set<std::string>& names;
  std::vector<Node> before;
  std::vector<Node> after;

  std::string fresh(const std::string& hint) {
    std::string name = hint;
    for (int i = 1; names.count(name); ++i) name = hint + "_" + std::to_string(i);
    names.insert(name);
    return name;
  }
  [[nodiscard]] std::string base() const { return node.name.empty() ? node.op_type : node.name; }

  std::string add_initializer(const std::string& what, Tensor t) {
    std::string name = fresh(base() + "_" + what);
    g.set_initializer(name, std::move(t));
    return name;
  }
  std::string add_ints(const std::string& what, const std::vector<int64_t>& v, bool scalar) {
    Tensor t(DType::I64, scalar ? Shape{} : Shape{static_cast<int64_t>(v.size())});
    if (!v.empty()) std::memcpy(t.mutable_bytes().data(), v.data(), v.size() * sizeof(int64_t));
    return add_initializer(what, std::move(t));
  }
  // A scalar with the dtype of value `like`: stored directly when that dtype is known, else
  // stored as f32 and cast with CastLike (opset 15+) so it matches whatever the input is.
  std::string add_scalar_like(const std::string& what, float v, const std::string& like) {
    const std::optional<DType> dt = dtype_of(like);
    if (dt && (*dt == DType::F32 || *dt == DType::F16 || *dt == DType::BF16)) {
      return add_initializer(what, Tensor::from_f32(std::span<const float>(&v, 1), {}, *dt));
    }
    if (dt && *dt == DType::F64) {
      Tensor t(DType::F64, {});
      const double d = v;
      std::memcpy(t.mutable_bytes().data(), &d, sizeof d);
      return add_initializer(what, std::move(t));
    }
    const std::string f32 =
        add_initializer(what + "_f32", Tensor::from_f32(std::span<const float>(&v, 1), {}));
    Node cast;
    cast.op_type = "CastLike";
    cast.name = fresh(base() + "_" + what + "_cast");
    cast.inputs = {f32, like};
    cast.outputs = {fresh(base() + "_" + what)};
    before.push_back(cast);
    return cast.outputs[0];
  }

  [[nodiscard]] std::array<const Graph*, 2> scopes() const { return {&g, &root}; }
  [[nodiscard]] const ValueInfo* info_of(const std::string& name) const {
    for (const Graph* scope : scopes()) {
      for (const auto* list : {&scope->inputs, &scope->value_info, &scope->outputs}) {
        for (const ValueInfo& v : *list)
          if (v.name == name) return &v;
      }
    }
    return nullptr;
  }
  [[nodiscard]] std::optional<DType> dtype_of(const std::string& name) const {
    for (const Graph* scope : scopes())
      if (const Tensor* t = scope->find_initializer(name)) return t->dtype();
    const ValueInfo* v = info_of(name);
    return v ? v->dtype : std::nullopt;
  }
  [[nodiscard]] std::optional<size_t> rank_of(const std::string& name) const {
    for (const Graph* scope : scopes())
      if (const Tensor* t = scope->find_initializer(name)) return t->shape().size();
    const ValueInfo* v = info_of(name);
    if (v == nullptr || !v->shape) return std::nullopt;
    return v->shape->size();
  }

  // Removes attribute `name` and returns it (nullopt when absent).
  std::optional<Attribute> take(std::string_view name) {
    auto& attrs = node.attributes;
    auto it = std::find_if(attrs.begin(), attrs.end(),
                           [&](const Attribute& a) { return a.name == name; });
    if (it == attrs.end()) return std::nullopt;
    Attribute a = std::move(*it);
    attrs.erase(it);
    return a;
  }
  // Puts `value` at input `index`, padding skipped optional inputs with "".
  void set_input(size_t index, const std::string& value) {
    if (node.inputs.size() <= index) node.inputs.resize(index + 1);
    node.inputs[index] = value;
  }
  // An ints attribute that became an int64 input at `index`.
  void ints_to_input(std::string_view attr, size_t index) {
    if (auto a = take(attr)) set_input(index, add_ints(std::string(attr), a->ints, false));
  }
};

using Adapter = void (*)(Site&);
// Returns why the node cannot be converted, or nullopt.
using Refusal = std::optional<std::string> (*)(const Node&, int64_t from);

// Axes attribute -> int64 input 1 (Reduce* at 18, ReduceSum/Squeeze/Unsqueeze at 13).
void axes_to_input(Site& s) { s.ints_to_input("axes", 1); }

// Split: split attribute -> input 1 at 13.
void split_to_input(Site& s) { s.ints_to_input("split", 1); }

// Split at 18: equal parts need num_outputs when there is no split input.
void split_num_outputs(Site& s) {
  const bool has_split = s.node.inputs.size() > 1 && !s.node.inputs[1].empty();
  if (!has_split && s.node.attr("num_outputs") == nullptr) {
    s.node.set_attr(
        Attribute::make_int("num_outputs", static_cast<int64_t>(s.node.outputs.size())));
  }
}

// Clip at 11: min/max attributes -> scalar inputs of X's type. An absent attribute meant
// -/+FLT_MAX (so infinities were clamped to it), an absent input means no bound: both are
// written out.
void clip_to_inputs(Site& s) {
  const std::string x = s.node.inputs.at(0);
  auto lo = s.take("min");
  auto hi = s.take("max");
  constexpr float kFloatMax = std::numeric_limits<float>::max();
  s.node.inputs.resize(1);
  s.set_input(1, s.add_scalar_like("min", lo ? lo->f : -kFloatMax, x));
  s.set_input(2, s.add_scalar_like("max", hi ? hi->f : kFloatMax, x));
}

// Pad at 11: pads -> int64 input 1, value -> scalar input 2 (mode stays an attribute).
void pad_to_inputs(Site& s) {
  const std::string x = s.node.inputs.at(0);
  auto pads = s.take("pads");
  auto value = s.take("value");
  if (!pads) return;  // invalid already; Graph checks report it
  s.node.inputs.resize(1);
  s.set_input(1, s.add_ints("pads", pads->ints, false));
  if (value && value->f != 0.0f) s.set_input(2, s.add_scalar_like("value", value->f, x));
}

// Slice at 10: starts/ends/axes attributes -> inputs 1..3.
void slice_to_inputs(Site& s) {
  auto starts = s.take("starts");
  auto ends = s.take("ends");
  auto axes = s.take("axes");
  s.node.inputs.resize(1);
  s.set_input(1, s.add_ints("starts", starts ? starts->ints : std::vector<int64_t>{}, false));
  s.set_input(2, s.add_ints("ends", ends ? ends->ints : std::vector<int64_t>{}, false));
  if (axes) s.set_input(3, s.add_ints("axes", axes->ints, false));
}

// TopK at 10: k attribute -> int64 input of shape [1].
void topk_to_input(Site& s) {
  auto k = s.take("k");
  s.node.inputs.resize(1);
  s.set_input(1, s.add_ints("k", {k ? k->i : 1}, false));
}

// Dropout at 12: ratio attribute -> scalar float input (inference ignores it either way).
void dropout_to_input(Site& s) {
  auto ratio = s.take("ratio");
  if (!ratio) return;
  s.node.inputs.resize(1);
  const float r = ratio->f;
  s.set_input(1, s.add_initializer("ratio", Tensor::from_f32(std::span<const float>(&r, 1), {})));
}

// Softmax/LogSoftmax/Hardmax at 13: before, the input was flattened to 2-D at `axis`
// (default 1) and the op ran over the second dimension; from 13 it runs over `axis` alone.
// The same when axis is the last dimension; otherwise Flatten -> op over the last axis ->
// Reshape back to the input's shape.
void softmax_to_one_axis(Site& s) {
  const int64_t axis = s.node.attr_int("axis", 1);
  const std::string x = s.node.inputs.at(0);
  if (const auto rank = s.rank_of(x)) {
    const auto r = static_cast<int64_t>(*rank);
    if (r > 0 && (axis == r - 1 || axis == -1)) {
      s.node.set_attr(Attribute::make_int("axis", axis));
      return;
    }
  }
  Node shape;
  shape.op_type = "Shape";
  shape.name = s.fresh(s.base() + "_shape");
  shape.inputs = {x};
  shape.outputs = {s.fresh(s.base() + "_in_shape")};
  Node flatten;
  flatten.op_type = "Flatten";
  flatten.name = s.fresh(s.base() + "_flatten");
  flatten.inputs = {x};
  flatten.outputs = {s.fresh(s.base() + "_2d")};
  flatten.set_attr(Attribute::make_int("axis", axis));
  const std::string y = s.node.outputs.at(0);
  const std::string y2d = s.fresh(s.base() + "_out_2d");
  Node reshape;
  reshape.op_type = "Reshape";
  reshape.name = s.fresh(s.base() + "_reshape");
  reshape.inputs = {y2d, shape.outputs[0]};
  reshape.outputs = {y};
  s.node.inputs[0] = flatten.outputs[0];
  s.node.outputs[0] = y2d;
  s.node.set_attr(Attribute::make_int("axis", -1));
  s.before.push_back(std::move(shape));
  s.before.push_back(std::move(flatten));
  s.after.push_back(std::move(reshape));
}

// Scatter (deprecated at 11) is ScatterElements under another name.
void scatter_rename(Site& s) { s.node.op_type = "ScatterElements"; }

// RoiAlign at 16: the default coordinate_transformation_mode became half_pixel; the old
// behaviour is written out.
void roi_align_mode(Site& s) {
  if (s.node.attr("coordinate_transformation_mode") == nullptr) {
    s.node.set_attr(Attribute::make_string("coordinate_transformation_mode", "output_half_pixel"));
  }
}

// GridSample at 20 renamed its modes.
void grid_sample_modes(Site& s) {
  const Attribute* mode = s.node.attr("mode");
  if (mode == nullptr || mode->s == "bilinear") {  // "bilinear" was also the default
    s.node.set_attr(Attribute::make_string("mode", "linear"));
  } else if (mode->s == "bicubic") {
    s.node.set_attr(Attribute::make_string("mode", "cubic"));
  }
}

// DFT at 20: axis attribute (default 1) -> int64 scalar input 2 (whose default is -2).
void dft_axis_to_input(Site& s) {
  auto axis = s.take("axis");
  s.set_input(2, s.add_ints("axis", {axis ? axis->i : 1}, true));
}

std::optional<std::string> refuse_always(const Node& node, int64_t) {
  if (node.op_type == "Upsample") {
    return "Upsample was removed at opset 10 and its scales/mode mapping to Resize is not "
           "converted";
  }
  return "Resize below opset 11 maps coordinates differently (no roi, asymmetric) and is not "
         "converted";
}

std::optional<std::string> refuse_training_batchnorm(const Node& node, int64_t) {
  for (size_t i = 1; i < node.outputs.size(); ++i) {
    if (!node.outputs[i].empty()) {
      return "BatchNormalization with training outputs (mean/var) changed at opset 14 and is not "
             "converted";
    }
  }
  return std::nullopt;
}

std::optional<std::string> refuse_group_norm(const Node&, int64_t) {
  return "GroupNormalization's scale and bias went from per-group to per-channel at opset 21 and "
         "are not converted";
}

struct Change {
  std::string_view op;
  int64_t since;   // the opset whose schema differs from the one before
  Adapter adapt;   // rewrites the node (nullptr: nothing to rewrite)
  Refusal refuse;  // says why it cannot be rewritten (nullptr: always can)
};

// Schema changes between opset 9 and 21 for which the old form is not valid or not the same
// at the new version, in the order they apply. Ops whose changes only added types or optional
// inputs/attributes with compatible defaults are absent (they need nothing).
constexpr Change kChanges[] = {
    {"Upsample", 10, nullptr, refuse_always},
    {"Slice", 10, slice_to_inputs, nullptr},
    {"TopK", 10, topk_to_input, nullptr},
    {"Resize", 11, nullptr, refuse_always},
    {"Clip", 11, clip_to_inputs, nullptr},
    {"Pad", 11, pad_to_inputs, nullptr},
    {"Scatter", 11, scatter_rename, nullptr},
    {"Dropout", 12, dropout_to_input, nullptr},
    {"Softmax", 13, softmax_to_one_axis, nullptr},
    {"LogSoftmax", 13, softmax_to_one_axis, nullptr},
    {"Hardmax", 13, softmax_to_one_axis, nullptr},
    {"Split", 13, split_to_input, nullptr},
    {"Squeeze", 13, axes_to_input, nullptr},
    {"Unsqueeze", 13, axes_to_input, nullptr},
    {"ReduceSum", 13, axes_to_input, nullptr},
    {"BatchNormalization", 14, nullptr, refuse_training_batchnorm},
    {"RoiAlign", 16, roi_align_mode, nullptr},
    {"Split", 18, split_num_outputs, nullptr},
    {"ReduceMean", 18, axes_to_input, nullptr},
    {"ReduceMax", 18, axes_to_input, nullptr},
    {"ReduceMin", 18, axes_to_input, nullptr},
    {"ReduceProd", 18, axes_to_input, nullptr},
    {"ReduceL1", 18, axes_to_input, nullptr},
    {"ReduceL2", 18, axes_to_input, nullptr},
    {"ReduceLogSum", 18, axes_to_input, nullptr},
    {"ReduceLogSumExp", 18, axes_to_input, nullptr},
    {"ReduceSumSquare", 18, axes_to_input, nullptr},
    {"GridSample", 20, grid_sample_modes, nullptr},
    {"DFT", 20, dft_axis_to_input, nullptr},
    {"GroupNormalization", 21, nullptr, refuse_group_norm},
};

// Calls f(graph, node_index, scope) for every default-domain node, subgraphs first.
template <typename F>
void for_each_graph(Graph& g, const std::string& scope, F&& f) {
  for (Node& node : g.nodes) {
    for (Attribute& a : node.attributes) {
      if (a.g) for_each_graph(*a.g, scope + node.label() + " > ", f);
      for (auto& sub : a.graphs) for_each_graph(*sub, scope + node.label() + " > ", f);
    }
  }
  f(g, scope);
}

bool applies(const Change& c, const Node& node, int64_t from, int64_t to) {
  return default_domain(node) && node.op_type == c.op && from < c.since && c.since <= to;
}

}  // namespace

std::optional<std::string> upgrade_default_opset(Graph& graph, int64_t needed,
                                                 const std::string& why) {
  const int64_t current = graph.opset("");
  if (current >= needed) return std::nullopt;
  if (needed > kNewestOpset) {
    fail_internal("opset upgrade to " + std::to_string(needed) +
                  " requested; qforge converts up "
                  "to " +
                  std::to_string(kNewestOpset));
  }
  const std::string head = "cannot raise the opset from " + std::to_string(current) + " to " +
                           std::to_string(needed) + " (needed for " + why + "): ";
  if (current > 0 && current < 9) {
    fail_unsupported(head +
                     "qforge converts models from opset 9 on; re-export the model at "
                     "opset " +
                     std::to_string(needed));
  }
  // Refusals first, so a model that cannot be converted is left as it was.
  for_each_graph(graph, "", [&](Graph& g, const std::string& scope) {
    for (const Node& node : g.nodes) {
      for (const Change& c : kChanges) {
        if (!applies(c, node, current, needed) || c.refuse == nullptr) continue;
        if (auto reason = c.refuse(node, current)) {
          fail_unsupported(head + scope + node.label() + ": " + *reason +
                           "; re-export the model at opset " + std::to_string(needed));
        }
      }
    }
  });

  std::unordered_set<std::string> names = graph.names_in_use();
  std::map<std::string, int> converted;  // op -> nodes rewritten
  for_each_graph(graph, "", [&](Graph& g, const std::string&) {
    std::vector<Node> nodes;
    nodes.reserve(g.nodes.size());
    for (Node& node : g.nodes) {
      Site site{graph, g, node, names, {}, {}};
      bool changed = false;
      for (const Change& c : kChanges) {
        if (!applies(c, node, current, needed) || c.adapt == nullptr) continue;
        c.adapt(site);
        changed = true;
      }
      if (changed) ++converted[node.op_type];
      for (Node& n : site.before) nodes.push_back(std::move(n));
      nodes.push_back(std::move(node));
      for (Node& n : site.after) nodes.push_back(std::move(n));
    }
    g.nodes = std::move(nodes);
  });

  const bool alias =
      graph.opset_imports.count("") == 0 && graph.opset_imports.count("ai.onnx") != 0;
  graph.set_opset(alias ? "ai.onnx" : "", needed);
  std::string message = "raised the default-domain opset from " + std::to_string(current) + " to " +
                        std::to_string(needed) + " for " + why;
  if (!converted.empty()) {
    message += "; converted to the new form:";
    for (const auto& [op, n] : converted) message += " " + op + " x" + std::to_string(n);
  }
  return message;
}

}  // namespace qforge
