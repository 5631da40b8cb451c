// Identity / Dropout removal in one sweep. Two kinds of rewiring:
// - `alias`: a removed node's output that is not a graph output is replaced by its input
//   wherever it is read (applied while sweeping, so chains collapse);
// - `rename`: a removed node's output that is a graph output keeps its name; the value it
//   copied is renamed to it everywhere (producer output and readers), applied after the sweep.
#include "quant/static/cleanup.h"

#include <algorithm>
#include <unordered_map>

#include "ir/error.h"

namespace qforge {

namespace {

bool default_domain(const Node& node) { return node.domain.empty() || node.domain == "ai.onnx"; }

void collect_names(const Graph& g, std::unordered_set<std::string>& names) {
  for (const Node& node : g.nodes) {
    for (const Attribute& a : node.attributes) {
      std::vector<const Graph*> subs;
      if (a.g) subs.push_back(a.g.get());
      for (const auto& s : a.graphs) subs.push_back(s.get());
      for (const Graph* sub : subs) {
        for (const Node& n : sub->nodes) {
          names.insert(n.inputs.begin(), n.inputs.end());
          names.insert(n.outputs.begin(), n.outputs.end());
        }
        for (const ValueInfo& v : sub->outputs) names.insert(v.name);
        collect_names(*sub, names);
      }
    }
  }
}

// Why a Dropout cannot be removed as the identity, or "" when it can.
std::string dropout_blocker(const Graph& graph, const Node& node,
                            const std::unordered_map<std::string, std::vector<size_t>>& readers,
                            const std::unordered_set<std::string>& graph_outputs) {
  if (node.outputs.size() > 1 && !node.outputs[1].empty()) {
    const std::string& mask = node.outputs[1];
    if (readers.count(mask) || graph_outputs.count(mask)) return "its mask output is used";
  }
  if (node.inputs.size() > 2 && !node.inputs[2].empty()) {
    const Tensor* mode = graph.find_initializer(node.inputs[2]);
    if (mode == nullptr) return "its training_mode input is not a constant";
    const std::vector<float> v = mode->to_f32();
    if (!v.empty() && v[0] != 0.0f) return "its training_mode input is true";
  }
  return "";
}

class CleanupPass final : public Pass {
 public:
  [[nodiscard]] std::string_view name() const override { return "cleanup"; }

  void run(Graph& graph, PassReport& report) override {
    for (const char* key : {"identity_removed", "dropout_removed", "kept"}) report.stats[key] = 0;
    const auto readers = graph.consumers();
    const std::unordered_set<std::string> subgraph_names = subgraph_value_names(graph);
    std::unordered_set<std::string> graph_outputs;
    for (const ValueInfo& v : graph.outputs) graph_outputs.insert(v.name);
    std::unordered_set<std::string> pinned;  // values whose name must stay: inputs, initializers
    for (const ValueInfo& v : graph.inputs) pinned.insert(v.name);
    for (const auto& [n, t] : graph.initializers()) pinned.insert(n);

    std::unordered_map<std::string, std::string> alias;   // removed output -> its input
    std::unordered_map<std::string, std::string> rename;  // copied value -> graph output name
    auto resolve = [&](const std::string& v) {
      const auto it = alias.find(v);
      return it == alias.end() ? v : it->second;
    };
    std::vector<Node> kept;
    kept.reserve(graph.nodes.size());
    for (Node& node : graph.nodes) {
      for (std::string& in : node.inputs) in = resolve(in);
      const bool identity = node.op_type == "Identity";
      if (!default_domain(node) || (!identity && node.op_type != "Dropout") ||
          node.inputs.empty() || node.outputs.empty() || node.inputs[0].empty()) {
        kept.push_back(std::move(node));
        continue;
      }
      const std::string in = node.inputs[0];
      const std::string out = node.outputs[0];
      std::string blocker = identity ? "" : dropout_blocker(graph, node, readers, graph_outputs);
      if (blocker.empty() && subgraph_names.count(out)) blocker = "a subgraph reads its output";
      if (blocker.empty() && graph_outputs.count(out)) {
        if (pinned.count(in) || graph_outputs.count(in) || rename.count(in) ||
            subgraph_names.count(in)) {
          blocker = "it copies '" + in + "' to graph output '";
          blocker += out;
          blocker += "' and the copied value's name must stay";
        }
      }
      if (!blocker.empty()) {
        report.count("kept");
        report.warn(node.label() + " kept: " + blocker);
        kept.push_back(std::move(node));
        continue;
      }
      if (graph_outputs.count(out)) {
        rename.emplace(in, out);
      } else {
        alias.emplace(out, in);
      }
      report.count(identity ? "identity_removed" : "dropout_removed");
    }
    if (!rename.empty()) {
      auto apply = [&](std::string& v) {
        const auto it = rename.find(v);
        if (it != rename.end()) v = it->second;
      };
      for (Node& node : kept) {
        std::for_each(node.inputs.begin(), node.inputs.end(), apply);
        std::for_each(node.outputs.begin(), node.outputs.end(), apply);
      }
    }
    graph.nodes = std::move(kept);
    // Quantized-tensor records (a model read already quantized) follow the values they name.
    for (const auto& [out, in] : alias) graph.rename_in_quant_records(out, resolve(in));
    for (const auto& [in, out] : rename) graph.rename_in_quant_records(in, out);
    // Declared types of values that no longer exist would mislead shape inference.
    std::erase_if(graph.value_info, [&](const ValueInfo& v) {
      return alias.count(v.name) != 0 || rename.count(v.name) != 0;
    });
    graph.check();
  }
};

}  // namespace

std::unique_ptr<Pass> make_cleanup_pass() { return std::make_unique<CleanupPass>(); }

std::unordered_set<std::string> subgraph_value_names(const Graph& graph) {
  std::unordered_set<std::string> names;
  collect_names(graph, names);
  names.erase("");
  return names;
}

int64_t drop_unused_initializers(Graph& graph, std::span<const std::string> candidates) {
  std::unordered_set<std::string> read = subgraph_value_names(graph);
  for (const Node& node : graph.nodes) read.insert(node.inputs.begin(), node.inputs.end());
  for (const ValueInfo& v : graph.outputs) read.insert(v.name);
  for (const ValueInfo& v : graph.inputs) read.insert(v.name);
  int64_t dropped = 0;
  for (const std::string& name : candidates) {
    if (read.count(name) || !graph.has_initializer(name)) continue;
    graph.remove_initializer(name);
    std::erase_if(graph.value_info, [&](const ValueInfo& v) { return v.name == name; });
    ++dropped;
  }
  return dropped;
}

}  // namespace qforge
