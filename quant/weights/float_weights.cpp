#include "quant/weights/float_weights.h"

#include <algorithm>
#include <cstdint>
#include <set>
#include <unordered_map>
#include <unordered_set>

namespace qforge {

namespace {

// Every value name a subgraph (If/Loop/Scan body) mentions: a superset of what it reads from
// outside, which is all that matters to decide whether a float weight may be removed.
void collect_subgraph_names(const Graph& g, std::unordered_set<std::string>& names) {
  auto visit = [&](const Graph& sub) {
    for (const Node& n : sub.nodes) names.insert(n.inputs.begin(), n.inputs.end());
    for (const ValueInfo& v : sub.outputs) names.insert(v.name);
    collect_subgraph_names(sub, names);
  };
  for (const Node& node : g.nodes) {
    for (const Attribute& a : node.attributes) {
      if (a.g) visit(*a.g);
      for (const auto& sub : a.graphs) visit(*sub);
    }
  }
}

}  // namespace

void drop_unused_float_weights(Graph& graph, std::span<const std::string> weights,
                               std::string_view form, PassReport& report) {
  std::unordered_map<std::string, std::string> reader;  // value -> who still reads it
  for (const Node& node : graph.nodes) {
    for (const std::string& in : node.inputs) reader.try_emplace(in, node.label());
  }
  for (const ValueInfo& v : graph.outputs) reader.try_emplace(v.name, "a graph output");
  std::unordered_set<std::string> subgraph_names;
  collect_subgraph_names(graph, subgraph_names);
  for (const std::string& n : subgraph_names) reader.try_emplace(n, "a subgraph");

  int64_t before = 0, after = 0;
  std::set<std::string> seen;
  auto& rows = report.stats["tensors"];
  for (size_t i = 0; i < weights.size(); ++i) {
    auto& row = rows[i];
    const std::string& weight = weights[i];
    const auto r = reader.find(weight);
    const bool kept = r != reader.end();
    row["float_kept"] = kept;
    const int64_t float_bytes = row["bytes_before"].get<int64_t>();
    after += row["bytes_after"].get<int64_t>();
    if (!seen.insert(weight).second) continue;
    before += float_bytes;
    if (kept) {
      after += float_bytes;
      report.warn("weight '" + weight + "' is also read by " + r->second +
                  ", which stays float: its float copy is kept beside the " + std::string(form) +
                  " one");
      continue;
    }
    graph.remove_initializer(weight);
    std::erase_if(graph.value_info, [&](const ValueInfo& v) { return v.name == weight; });
  }
  report.stats["bytes_before"] = before;
  report.stats["bytes_after"] = after;
}

}  // namespace qforge
