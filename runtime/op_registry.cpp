#include "runtime/op_registry.h"

#include <algorithm>
#include <map>
#include <utility>

#include "ir/error.h"

namespace qforge::ops {

namespace {

std::string_view canonical_domain(std::string_view domain) {
  return domain == "ai.onnx" ? std::string_view() : domain;
}

using Table = std::map<std::pair<std::string, std::string>, OpFn, std::less<>>;

const Table& table() {
  static const Table t = [] {
    Table m;
    for (auto slice :
         {elementwise_ops(), logic_ops(), activation_ops(), matmul_ops(), conv_ops(), pool_ops(),
          norm_ops(), shape_ops(), tensor_ops(), reduce_ops(), quantize_ops()}) {
      for (const OpEntry& e : slice) {
        auto key = std::make_pair(std::string(e.domain), std::string(e.op_type));
        if (!m.emplace(std::move(key), e.fn).second) {
          fail_internal("op '" + std::string(e.op_type) + "' is registered twice");
        }
      }
    }
    return m;
  }();
  return t;
}

}  // namespace

OpFn find_op(std::string_view domain, std::string_view op_type) {
  const auto& t = table();
  const auto it =
      t.find(std::make_pair(std::string(canonical_domain(domain)), std::string(op_type)));
  return it == t.end() ? nullptr : it->second;
}

std::vector<std::string> registered_ops() {
  std::vector<std::string> out;
  for (const auto& [key, fn] : table()) {
    out.push_back(key.first.empty() ? key.second : key.first + "." + key.second);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace qforge::ops
