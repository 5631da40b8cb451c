#include "quant/static/shared_scales.h"

#include <algorithm>
#include <cmath>
#include <map>

namespace qforge {

namespace {

bool default_domain(const Node& node) { return node.domain.empty() || node.domain == "ai.onnx"; }

bool op_allowed(const StaticInt8Options& options, const Node& node) {
  if (!default_domain(node)) return false;
  if (!options.op_types.empty() &&
      std::find(options.op_types.begin(), options.op_types.end(), node.op_type) ==
          options.op_types.end()) {
    return false;
  }
  return !(options.exclude && std::regex_search(node.name, *options.exclude));
}

// Activations (no initializer) with usable ranges, every one of `names`.
bool all_ranged(const Graph& graph, const StaticInt8Options& options,
                const std::vector<std::string>& names) {
  return !names.empty() && std::all_of(names.begin(), names.end(), [&](const std::string& n) {
    return !n.empty() && !graph.has_initializer(n) && usable_activation_amax(options, n);
  });
}

// Union-find over activation names, with the smallest name as each set's root so that the
// result does not depend on the order of the unions.
class NameSets {
 public:
  std::string find(const std::string& n) {
    auto it = parent_.try_emplace(n, n).first;
    if (it->second == n) return n;
    std::string root = find(it->second);
    parent_[n] = root;
    return root;
  }
  void join(const std::string& a, const std::string& b) {
    const std::string ra = find(a), rb = find(b);
    if (ra == rb) return;
    if (ra < rb) {
      parent_[rb] = ra;
    } else {
      parent_[ra] = rb;
    }
  }
  [[nodiscard]] std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& [n, p] : parent_) out.push_back(n);
    return out;
  }

 private:
  std::map<std::string, std::string> parent_;
};

}  // namespace

std::optional<float> usable_activation_amax(const StaticInt8Options& options,
                                            const std::string& name) {
  std::optional<float> amax;
  const auto o = options.overrides.find(name);
  if (o != options.overrides.end()) amax = o->second.amax;
  if (!amax) {
    const auto it = options.activation_amax.find(name);
    if (it == options.activation_amax.end()) return std::nullopt;
    amax = it->second;
  }
  if (!std::isfinite(*amax) || *amax <= 0.0f) return std::nullopt;
  return amax;
}

bool concat_shares_scale(const Graph& graph, const Node& node, const StaticInt8Options& options) {
  return node.op_type == "Concat" && options.concat_shared_scale && op_allowed(options, node) &&
         node.outputs.size() == 1 && all_ranged(graph, options, node.inputs);
}

std::vector<SharedScaleGroup> shared_scale_groups(const Graph& graph,
                                                  const StaticInt8Options& options) {
  NameSets sets;
  for (const Node& node : graph.nodes) {
    if (concat_shares_scale(graph, node, options)) {
      for (const std::string& in : node.inputs) sets.join(node.inputs.front(), in);
      // The output's range is the union of the inputs' too; it joins when it has one.
      if (usable_activation_amax(options, node.outputs.front())) {
        sets.join(node.inputs.front(), node.outputs.front());
      }
    } else if (node.op_type == "Add" && options.add_shared_scale && op_allowed(options, node) &&
               node.inputs.size() == 2 && all_ranged(graph, options, node.inputs)) {
      sets.join(node.inputs[0], node.inputs[1]);
    }
  }
  std::map<std::string, SharedScaleGroup> by_root;
  for (const std::string& n : sets.names()) {
    SharedScaleGroup& g = by_root[sets.find(n)];
    g.members.push_back(n);  // names() is sorted, so members are too
    g.amax = std::max(g.amax, *usable_activation_amax(options, n));
  }
  std::vector<SharedScaleGroup> out;
  for (auto& [root, g] : by_root) {
    if (g.members.size() > 1) out.push_back(std::move(g));
  }
  return out;
}

int64_t share_table_ranges(const Graph& graph, const StaticInt8Options& options,
                           CalibrationTable& table) {
  int64_t changed = 0;
  for (const SharedScaleGroup& g : shared_scale_groups(graph, options)) {
    for (const std::string& m : g.members) {
      const auto it = table.ranges.find(m);
      if (it == table.ranges.end() || it->second.amax == g.amax) continue;
      it->second.amax = g.amax;
      ++changed;
    }
  }
  return changed;
}

}  // namespace qforge
