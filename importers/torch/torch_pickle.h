#pragma once
// torch's pickle policy: the globals torch.save emits for a state dict (rebuild functions,
// storage classes, dtypes, OrderedDict, Parameter) and what each call stands for. A call
// builds a PickleTensor or PickleStorage record; nothing is imported or executed.
#include <cstddef>
#include <span>
#include <string_view>

#include "importers/torch/pickle_value.h"
#include "importers/torch/unpickler.h"

namespace qforge {

// True for a global torch.save emits in a file of tensors and plain containers.
bool torch_pickle_allows_global(std::string_view module, std::string_view name);

class TorchPickleHooks final : public PickleHooks {
 public:
  bool allows_global(std::string_view module, std::string_view name) const override;
  PickleValue* call(const PickleGlobal& callable, const PickleTuple& args, bool newobj,
                    PickleArena& arena, const std::string& where) override;
  PickleValue* persistent_load(const PickleValue& pid, PickleArena& arena,
                               const std::string& where) override;
  void build(PickleValue& object, const PickleValue& state, const std::string& where) override;

 private:
  // One record per storage key, so every tensor of a storage points at the same record.
  std::unordered_map<std::string, PickleValue*> storages_;
};

struct TorchPickle {
  PickleArena arena;
  PickleValue* root = nullptr;
};

// Unpickles torch's data.pkl held in `data`; `label` names it in messages. Throws
// Error(InvalidInput) for malformed or disallowed content.
TorchPickle parse_torch_pickle(std::span<const std::byte> data, std::string_view label);

}  // namespace qforge
