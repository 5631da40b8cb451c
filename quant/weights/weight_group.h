#pragma once
// One weight quantized along one axis and the node inputs that will read its quantized form: a
// weight read by several nodes is quantized once per axis they need (weight_int8, w4a16).
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ir/graph.h"
#include "ir/pass.h"

namespace qforge {

struct WeightGroup {
  std::string weight;
  std::optional<int64_t> axis;                  // none: per-tensor
  std::vector<std::pair<size_t, size_t>> uses;  // (node index, input index)
};

// Groups in the order of their first use.
class WeightGroups {
 public:
  void add_use(const std::string& weight, std::optional<int64_t> axis, size_t node, size_t input) {
    const auto [it, added] = index_.try_emplace({weight, axis}, groups_.size());
    if (added) groups_.push_back({weight, axis, {}});
    groups_[it->second].uses.emplace_back(node, input);
  }
  std::vector<WeightGroup> take() { return std::move(groups_); }

 private:
  std::vector<WeightGroup> groups_;
  std::map<std::pair<std::string, std::optional<int64_t>>, size_t> index_;
};

// The weights a pass leaves float, each counted and warned about once however many nodes read it.
class SkippedWeights {
 public:
  explicit SkippedWeights(PassReport& report) : report_(report) {}
  void skip(const std::string& weight, const Node& node, const std::string& why) {
    if (!skipped_.insert(weight).second) return;
    report_.count("skipped");
    report_.warn("weight '" + weight + "' of " + node.label() + " " + why + ": left float");
  }

 private:
  PassReport& report_;
  std::set<std::string> skipped_;
};

}  // namespace qforge
