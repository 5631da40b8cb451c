#include "ir/weight_inventory.h"

#include <algorithm>
#include <unordered_set>

#include "ir/error.h"

namespace qforge {

WeightInventory take_weight_inventory(const Graph& graph) {
  WeightInventory inv;
  inv.weights_only = graph.nodes.empty();
  inv.tensors.reserve(graph.initializers().size());
  for (const auto& [name, tensor] : graph.initializers()) {
    inv.tensors.emplace_back(name, tensor.shape());
    inv.dtypes.emplace(name, tensor.dtype());
  }
  for (const Node& node : graph.nodes) {
    for (const std::string& in : node.inputs) {
      if (!in.empty() && graph.has_initializer(in)) inv.readers[in].push_back(node.name);
    }
  }
  return inv;
}

namespace {

// A weights-only tensor kept under its name: same shape, and same dtype unless a quantized-Linear
// record stands for it with its scale present (the float values are then q * scale).
bool kept_in_place(const Graph& after, const std::string& name, const Tensor& t, const Shape& shape,
                   DType dtype) {
  if (t.shape() != shape) return false;
  if (t.dtype() == dtype) return true;
  const QuantRecord* r = after.find_quant_record(name);
  return r != nullptr && r->kind == QuantKind::Weight && r->source == name &&
         r->dtype == t.dtype() && after.has_initializer(r->scale);
}

}  // namespace

WeightAccount account_weights(const WeightInventory& before, const Graph& after) {
  WeightAccount account;
  std::unordered_set<std::string> nodes_after;
  for (const Node& node : after.nodes) nodes_after.insert(node.name);
  // Derived names sorted, so that "<name>_" prefixes are found by one lower_bound each.
  std::vector<std::string> names;
  names.reserve(after.initializers().size());
  for (const auto& [name, tensor] : after.initializers()) names.push_back(name);
  std::sort(names.begin(), names.end());
  auto derived = [&names](const std::string& name) {
    const std::string prefix = name + "_";
    const auto it = std::lower_bound(names.begin(), names.end(), prefix);
    return it != names.end() && it->starts_with(prefix);
  };
  for (const auto& [name, shape] : before.tensors) {
    if (const Tensor* t = after.find_initializer(name)) {
      const auto dtype = before.dtypes.find(name);
      if (!before.weights_only ||
          kept_in_place(after, name, *t, shape,
                        dtype == before.dtypes.end() ? t->dtype() : dtype->second)) {
        continue;
      }
      account.lost.push_back(name);
      continue;
    }
    if (before.weights_only) {
      account.lost.push_back(name);
      continue;
    }
    if (derived(name)) continue;
    const auto r = before.readers.find(name);
    if (r == before.readers.end()) {
      account.unread.push_back(name);
      continue;
    }
    // Folded with its readers: every named reader is gone from the output.
    const bool folded = std::none_of(r->second.begin(), r->second.end(), [&](const std::string& n) {
      return !n.empty() && nodes_after.count(n) > 0;
    });
    if (!folded) account.lost.push_back(name);
  }
  return account;
}

std::vector<std::string> check_nothing_lost(const WeightInventory& before, const Graph& after,
                                            const std::string& what) {
  WeightAccount account = account_weights(before, after);
  if (!account.lost.empty()) {
    std::string names;
    for (size_t i = 0; i < account.lost.size() && i < 8; ++i) {
      names += (i ? ", " : "") + account.lost[i];
    }
    if (account.lost.size() > 8) {
      names += " (and " + std::to_string(account.lost.size() - 8) + " more)";
    }
    fail_internal(what + " would leave " + std::to_string(account.lost.size()) + " of the " +
                  std::to_string(before.tensors.size()) + " tensors it read out of its output (" +
                  names + "); nothing was written: report this with the command line");
  }
  return std::move(account.unread);
}

}  // namespace qforge
