#include "quant/static/static_int8_plan.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "ir/error.h"
#include "quant/static/shared_scales.h"
#include "quant/weights/weight_slots.h"

namespace qforge {

namespace {

// What each op reads, by input slot; the weight, its axis and the bias come from the weight-slot
// table (quant/weights/weight_slots.h). A Gemm or MatMul whose B is not constant quantizes it
// as a second activation instead. Concat reads every input (`variadic`), all with one scale
// (quant/static/shared_scales.h).
struct OpRule {
  std::string_view op_type;
  std::vector<size_t> data_slots;  // inputs that must be activations
  bool has_weight = false;
  bool weight_may_be_activation = false;
  bool variadic = false;  // every input is a data input
};

const std::vector<OpRule>& rules() {
  static const std::vector<OpRule> kRules = {
      {"Conv", {0}, true, false},
      {"ConvTranspose", {0}, true, false},
      {"Gemm", {0}, true, true},
      {"MatMul", {0}, true, true},
      {"Add", {0, 1}, false, false},
      {"MaxPool", {0}, false, false},
      {"AveragePool", {0}, false, false},
      {"GlobalAveragePool", {0}, false, false},
      {"Concat", {}, false, false, true},
  };
  return kRules;
}

bool default_domain(const Node& node) { return node.domain.empty() || node.domain == "ai.onnx"; }

class Planner {
 public:
  Planner(const Graph& graph, const StaticInt8Options& options, PassReport& report)
      : graph_(graph), options_(options), report_(report) {
    for (const ValueInfo& v : graph.inputs) graph_inputs_.insert(v.name);
    for (const auto* list : {&graph.inputs, &graph.value_info, &graph.outputs}) {
      for (const ValueInfo& v : *list) {
        if (v.dtype) declared_[v.name] = *v.dtype;
      }
    }
    check_static_int8_options(graph, options);
    nlohmann::ordered_json groups = nlohmann::ordered_json::array();
    for (const SharedScaleGroup& g : shared_scale_groups(graph, options)) {
      for (const std::string& m : g.members) shared_[m] = g.amax;
      groups.push_back({{"members", g.members}, {"amax", g.amax}});
    }
    report_.stats["concat_shared_scale"] = options.concat_shared_scale;
    report_.stats["add_shared_scale"] = options.add_shared_scale;
    report_.stats["shared_scale_groups"] = std::move(groups);
  }

  // The group amax when `name` shares its scale (shared_scales.h).
  [[nodiscard]] std::optional<float> shared_amax(const std::string& name) const {
    const auto it = shared_.find(name);
    if (it == shared_.end()) return std::nullopt;
    return it->second;
  }

  std::vector<NodePlan> run() {
    std::vector<NodePlan> plans;
    for (size_t i = 0; i < graph_.nodes.size(); ++i) {
      const Node& node = graph_.nodes[i];
      const auto rule = std::find_if(rules().begin(), rules().end(),
                                     [&](const OpRule& r) { return r.op_type == node.op_type; });
      if (rule == rules().end() || !default_domain(node)) continue;
      if (!options_.op_types.empty() &&
          std::find(options_.op_types.begin(), options_.op_types.end(), node.op_type) ==
              options_.op_types.end()) {
        continue;
      }
      if (options_.exclude && std::regex_search(node.name, *options_.exclude)) {
        report_.count("excluded");
        continue;
      }
      if (rule->variadic) {  // Concat: only with one shared scale, when every input has a range
        if (!options_.concat_shared_scale) continue;
        if (!concat_shares_scale(graph_, node, options_)) {
          report_.count("concat_left_float");
          continue;
        }
      }
      if (auto plan = plan_node(i, *rule)) {
        plans.push_back(std::move(*plan));
        report_.count("nodes_quantized");
      }
    }
    summarize_missing_ranges();
    for (const auto& [name, o] : options_.overrides) {
      if (!used_overrides_.count(name)) {
        report_.warn("--override " + name + " is not an input of any quantized node: unused");
      }
    }
    return plans;
  }

 private:
  std::optional<NodePlan> plan_node(size_t index, const OpRule& rule) {
    const Node& node = graph_.nodes[index];
    NodePlan plan;
    plan.node = index;
    std::vector<size_t> slots = rule.data_slots;
    if (rule.variadic) {
      for (size_t k = 0; k < node.inputs.size(); ++k) slots.push_back(k);
    }
    const WeightSlot* weight = rule.has_weight ? find_weight_slot(node) : nullptr;
    if (weight != nullptr && weight->weight_input < node.inputs.size()) {
      const std::string& w = node.inputs[weight->weight_input];
      if (graph_.has_initializer(w) && !graph_inputs_.count(w)) {
        if (!plan_weight(node, *weight, plan)) return std::nullopt;
      } else if (rule.weight_may_be_activation) {
        slots.push_back(weight->weight_input);
      } else {
        return left_float(node, "its weight '" + w + "' is not a constant");
      }
    }
    for (size_t slot : slots) {
      if (slot >= node.inputs.size() || node.inputs[slot].empty()) {
        return left_float(node, "input " + std::to_string(slot) + " is missing");
      }
      const std::string& name = node.inputs[slot];
      if (graph_.has_initializer(name)) {
        if (node.op_type == "Add") {  // a bias add: runtimes fuse it into the op before
          report_.count("add_with_constant");
          return std::nullopt;
        }
        return left_float(node, "input '" + name + "' is a constant where an activation goes");
      }
      const auto declared = declared_.find(name);
      if (declared != declared_.end() && declared->second != DType::F32) {
        report_.count("not_float");
        return std::nullopt;
      }
      const auto amax = activation_amax(name);
      if (!amax) return std::nullopt;
      plan.activations.push_back({slot, name, *amax});
    }
    if (options_.int32_bias && weight != nullptr && weight->bias_input &&
        *weight->bias_input < node.inputs.size() && plan.weight_slot) {
      const std::string& b = node.inputs[*weight->bias_input];
      const Tensor* t = graph_.find_initializer(b);
      if (t != nullptr && !graph_inputs_.count(b) && t->dtype() == DType::F32 && t->rank() == 1) {
        plan.bias_slot = weight->bias_input;
      } else if (!b.empty()) {
        report_.warn("bias '" + b + "' of " + node.label() +
                     " is not a constant f32 vector: kept float");
      }
    }
    return plan;
  }

  bool plan_weight(const Node& node, const WeightSlot& slot, NodePlan& plan) {
    const std::string& w = node.inputs[slot.weight_input];
    const Tensor& t = *graph_.find_initializer(w);
    const auto rank = static_cast<int64_t>(t.rank());
    const int64_t min_rank = node.op_type == "Conv" || node.op_type == "ConvTranspose" ? 3 : 2;
    if (t.dtype() != DType::F32) {
      left_float(node, "its weight '" + w + "' is " + std::string(dtype_name(t.dtype())) +
                           "; static INT8 handles float32 models");
      return false;
    }
    if (rank < min_rank || (node.op_type == "Gemm" && rank != 2) || t.numel() == 0) {
      left_float(node, "its weight '" + w + "' has shape " + shape_to_string(t.shape()));
      return false;
    }
    plan.weight_slot = slot.weight_input;
    plan.axis = slot.channel_axis(node, rank);
    const auto o = options_.overrides.find(w);
    if (o != options_.overrides.end()) {
      used_overrides_.insert(w);
      if (o->second.per_tensor) plan.axis.reset();
      if (o->second.amax) {
        if (!(*o->second.amax > 0.0f)) {
          left_float(node, "--override gives weight '" + w + "' amax 0");
          return false;
        }
        plan.axis.reset();
        plan.weight_amax = o->second.amax;
      }
    }
    return true;
  }

  // The range of an activation, or none (with a count and, once per tensor, a warning).
  std::optional<float> activation_amax(const std::string& name) {
    std::optional<float> amax;
    const auto o = options_.overrides.find(name);
    if (o != options_.overrides.end()) {
      used_overrides_.insert(name);
      if (o->second.per_tensor && warned_.insert(name + "#pt").second) {
        report_.warn("--override " + name + "=per-tensor: activations are always per-tensor");
      }
      amax = o->second.amax;
    }
    if (!amax) {
      const auto it = options_.activation_amax.find(name);
      if (it == options_.activation_amax.end()) {
        missing_.insert(name);
        report_.count("skipped_no_range");
        return std::nullopt;
      }
      amax = it->second;
    }
    if (!std::isfinite(*amax) || *amax <= 0.0f) {
      report_.count(*amax == 0.0f ? "skipped_amax_zero" : "skipped_bad_range");
      if (warned_.insert(name).second) {
        report_.warn("activation '" + name + "' has amax " + std::to_string(*amax) +
                     " (constant zero or not finite): its readers stay float; calibrate with "
                     "data that reaches it or give a range with --override " +
                     name + "=amax:X");
      }
      return std::nullopt;
    }
    if (const auto shared = shared_amax(name)) return shared;
    return amax;
  }

  std::nullopt_t left_float(const Node& node, const std::string& why) {
    report_.count("skipped");
    report_.warn(node.label() + " left float: " + why);
    return std::nullopt;
  }

  void summarize_missing_ranges() {
    if (missing_.empty()) return;
    std::string names;
    size_t shown = 0;
    for (const std::string& n : missing_) {
      if (shown++ == 5) {
        names += ", ...";
        break;
      }
      names += (names.empty() ? "'" : ", '") + n + "'";
    }
    report_.warn(
        std::to_string(missing_.size()) + " activation(s) have no calibrated range (" + names +
        "): their readers stay float; they are not float32, calibration never reached them, or the "
        "table was made for another model");
  }

  const Graph& graph_;
  const StaticInt8Options& options_;
  PassReport& report_;
  std::unordered_set<std::string> graph_inputs_;
  std::unordered_map<std::string, DType> declared_;
  std::set<std::string> missing_;
  std::unordered_set<std::string> warned_;
  std::unordered_set<std::string> used_overrides_;
  std::map<std::string, float> shared_;  // activation -> its shared-scale group's amax
};

}  // namespace

std::span<const std::string_view> static_int8_op_types() {
  static const std::vector<std::string_view> kNames = [] {
    std::vector<std::string_view> names;
    for (const OpRule& r : rules()) names.push_back(r.op_type);
    return names;
  }();
  return kNames;
}

std::set<std::string> static_int8_range_needs(const Graph& graph, StaticInt8Options options) {
  options.activation_amax.clear();
  for (const ValueInfo& v : graph.inputs) {
    if (!graph.has_initializer(v.name)) options.activation_amax[v.name] = 1.0f;
  }
  for (const Node& node : graph.nodes) {
    for (const std::string& o : node.outputs) {
      if (!o.empty()) options.activation_amax[o] = 1.0f;
    }
  }
  std::set<std::string> needs;
  PassReport scratch;  // the planner's counts and warnings belong to the real run
  for (const NodePlan& plan : plan_static_int8(graph, options, scratch)) {
    for (const PlannedActivation& a : plan.activations) needs.insert(a.name);
  }
  for (const SharedScaleGroup& g : shared_scale_groups(graph, options)) {
    needs.insert(g.members.begin(), g.members.end());
  }
  return needs;
}

void check_static_int8_options(const Graph& graph, const StaticInt8Options& options) {
  for (const std::string& op : options.op_types) {
    if (std::none_of(rules().begin(), rules().end(),
                     [&](const OpRule& r) { return r.op_type == op; })) {
      std::string known;
      for (const OpRule& r : rules()) known += (known.empty() ? "" : ", ") + std::string(r.op_type);
      std::string message =
          "static-int8: op type '" + op + "' is not quantized by static INT8; use ";
      message += known;
      fail_usage(message);
    }
  }
  std::unordered_set<std::string> values;
  for (const ValueInfo& v : graph.inputs) values.insert(v.name);
  for (const auto& [n, t] : graph.initializers()) values.insert(n);
  for (const Node& node : graph.nodes) values.insert(node.outputs.begin(), node.outputs.end());
  for (const auto& [name, o] : options.overrides) {
    if (!values.count(name)) {
      fail_usage("--override names '" + name +
                 "', which is no value of the model (after BatchNorm folding and clean-up); use "
                 "a tensor name that 'qforge calibrate' lists or Netron shows");
    }
  }
}

std::vector<NodePlan> plan_static_int8(const Graph& graph, const StaticInt8Options& options,
                                       PassReport& report) {
  return Planner(graph, options, report).run();
}

}  // namespace qforge
