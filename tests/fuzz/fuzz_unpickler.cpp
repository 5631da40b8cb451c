// Fuzzes the restricted unpickler with torch's policy: any input either unpickles into a value
// tree whose torch records are well formed, or is refused with a qforge::Error; never a crash,
// a hang, unbounded memory, or anything executed.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <unordered_set>
#include <vector>

#include "importers/torch/torch_pickle.h"
#include "ir/error.h"

#include "abort_on_internal.h"

namespace {

void check(bool ok) {
  if (!ok) std::abort();  // libFuzzer reports the input that got here
}

// Visits every value reachable from the root once (the tree may share values or hold cycles).
void walk(const qforge::PickleValue* root) {
  std::vector<const qforge::PickleValue*> todo = {root};
  std::unordered_set<const qforge::PickleValue*> seen;
  while (!todo.empty()) {
    const auto* v = todo.back();
    todo.pop_back();
    check(v != nullptr);
    if (!seen.insert(v).second) continue;
    if (const auto* t = v->as<qforge::PickleTuple>())
      todo.insert(todo.end(), t->items.begin(), t->items.end());
    if (const auto* l = v->as<qforge::PickleList>())
      todo.insert(todo.end(), l->items.begin(), l->items.end());
    if (const auto* d = v->as<qforge::PickleDict>()) {
      for (const auto& [key, value] : d->items) todo.insert(todo.end(), {key, value});
    }
    if (const auto* tensor = v->as<qforge::PickleTensor>()) {
      check(tensor->storage != nullptr && tensor->storage->is<qforge::PickleStorage>());
      check(tensor->size.size() == tensor->stride.size());
      check(!tensor->dtype_name.empty());
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    const auto pickle = qforge::parse_torch_pickle(bytes, "'fuzz.pkl'");
    walk(pickle.root);
  } catch (const qforge::Error& e) {
    qforge::fuzz::abort_on_internal(e);
  }
  return 0;
}
