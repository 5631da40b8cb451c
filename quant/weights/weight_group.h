#pragma once
// One weight quantized along one axis and the node inputs that will read its quantized form: a
// weight read by several nodes is quantized once per axis they need (weight_int8, w4a16).
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

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

}  // namespace qforge
