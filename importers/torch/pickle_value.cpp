#include "importers/torch/pickle_value.h"

namespace qforge {

namespace {
// Dict keys that compare by value in Python and that torch files use: str and int.
bool index_key(const PickleValue& key, std::string& out) {
  if (const auto* s = key.as<std::string>()) {
    out = *s;
    out.insert(out.begin(), 's');
    return true;
  }
  if (const auto* i = key.as<int64_t>()) {
    out = std::to_string(*i);
    out.insert(out.begin(), 'i');
    return true;
  }
  return false;
}
}  // namespace

void PickleDict::set(PickleValue* key, PickleValue* value) {
  std::string k;
  if (index_key(*key, k)) {
    const auto [it, inserted] = index.emplace(std::move(k), items.size());
    if (!inserted) {
      items[it->second].second = value;
      return;
    }
  }
  items.emplace_back(key, value);
}

std::string_view pickle_type_name(const PickleValue& value) {
  struct Namer {
    std::string_view operator()(const PickleNone&) const { return "None"; }
    std::string_view operator()(bool) const { return "bool"; }
    std::string_view operator()(int64_t) const { return "int"; }
    std::string_view operator()(double) const { return "float"; }
    std::string_view operator()(const std::string&) const { return "str"; }
    std::string_view operator()(const PickleBytes&) const { return "bytes"; }
    std::string_view operator()(const PickleTuple&) const { return "tuple"; }
    std::string_view operator()(const PickleList&) const { return "list"; }
    std::string_view operator()(const PickleDict&) const { return "dict"; }
    std::string_view operator()(const PickleGlobal&) const { return "global"; }
    std::string_view operator()(const PickleStorage&) const { return "torch storage"; }
    std::string_view operator()(const PickleTensor&) const { return "torch tensor"; }
  };
  return std::visit(Namer{}, value.v);
}

}  // namespace qforge
