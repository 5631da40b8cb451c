#pragma once
// The value tree a restricted unpickler builds. Values live in a PickleArena and refer to
// each other by pointer, as Python objects do: the memo hands out the same object twice (tied
// weights), containers may even hold themselves. The arena owns every value and frees them
// without recursion, however deep or cyclic the tree.
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "ir/dtype.h"
#include "ir/tensor.h"

namespace qforge {

struct PickleValue;

struct PickleNone {};
struct PickleBytes {
  std::string data;
};
struct PickleTuple {
  std::vector<PickleValue*> items;
};
struct PickleList {
  std::vector<PickleValue*> items;
};
// Insertion-ordered; a str or int key set twice keeps its first place and takes the new value.
struct PickleDict {
  std::vector<std::pair<PickleValue*, PickleValue*>> items;
  std::unordered_map<std::string, size_t> index;  // str/int keys -> position in items
  void set(PickleValue* key, PickleValue* value);
};
// A reference to a module attribute (GLOBAL / STACK_GLOBAL), only ever one the allow-list
// admits. Nothing is imported or called.
struct PickleGlobal {
  std::string module;
  std::string name;
  std::string qualified() const { return module + "." + name; }
};
// A torch storage named by a persistent id: ('storage', type, key, location, numel).
struct PickleStorage {
  std::string key;
  std::string type_name;   // "torch.FloatStorage", "torch.storage.UntypedStorage", ...
  bool typed = true;       // false for UntypedStorage: numel counts bytes, the tensor has the dtype
  std::string dtype_name;  // torch's name ("float32"); empty when untyped
  uint64_t numel = 0;
  std::string location;
};
// A tensor rebuilt by torch._utils._rebuild_tensor_v2/v3: a strided view of a storage.
struct PickleTensor {
  const PickleValue* storage = nullptr;  // holds a PickleStorage
  uint64_t storage_offset = 0;           // in elements
  Shape size;
  std::vector<int64_t> stride;  // in elements
  std::string dtype_name;       // torch's name ("float32", "bfloat16", ...)
};

using PickleVariant =
    std::variant<PickleNone, bool, int64_t, double, std::string, PickleBytes, PickleTuple,
                 PickleList, PickleDict, PickleGlobal, PickleStorage, PickleTensor>;

struct PickleValue {
  PickleVariant v;

  template <typename T>
  bool is() const {
    return std::holds_alternative<T>(v);
  }
  template <typename T>
  const T* as() const {
    return std::get_if<T>(&v);
  }
  template <typename T>
  T* as() {
    return std::get_if<T>(&v);
  }
};

// Python's type name of a value, for messages ("str", "tuple", "torch tensor", ...).
std::string_view pickle_type_name(const PickleValue& value);

class PickleArena {
 public:
  PickleValue* make(PickleVariant v) {
    values_.push_back(PickleValue{std::move(v)});
    return &values_.back();
  }
  size_t size() const { return values_.size(); }

 private:
  std::deque<PickleValue> values_;  // stable addresses
};

}  // namespace qforge
