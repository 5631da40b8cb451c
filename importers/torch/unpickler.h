#pragma once
// A restricted unpickler: it reads the opcodes torch.save emits and builds a PickleValue tree.
// It never imports or calls anything. Which globals may be named and what a REDUCE, NEWOBJ,
// BUILD or persistent id stands for is decided by a PickleHooks policy (torch_pickle.h holds
// torch's); everything else is an error naming the opcode and its byte offset.
#include <cstddef>
#include <span>
#include <string>
#include <string_view>

#include "importers/torch/pickle_opcodes.h"
#include "importers/torch/pickle_value.h"

namespace qforge {

class PickleHooks {
 public:
  virtual ~PickleHooks() = default;
  // Whether GLOBAL / STACK_GLOBAL may name module.name. A refused name is an InvalidInput
  // error naming it; the unpickler writes the message.
  virtual bool allows_global(std::string_view module, std::string_view name) const = 0;
  // REDUCE (callable(*args)) or NEWOBJ (cls.__new__(cls, *args), when `newobj`): returns the
  // value the call stands for, or throws. `where` locates the opcode for messages.
  virtual PickleValue* call(const PickleGlobal& callable, const PickleTuple& args, bool newobj,
                            PickleArena& arena, const std::string& where) = 0;
  // BINPERSID: the value a persistent id refers to.
  virtual PickleValue* persistent_load(const PickleValue& pid, PickleArena& arena,
                                       const std::string& where) = 0;
  // BUILD: applies `state` to `object` (typically by ignoring it) or throws.
  virtual void build(PickleValue& object, const PickleValue& state, const std::string& where) = 0;
};

struct UnpickleLimits {
  size_t max_stack = size_t{1} << 22;  // values on the stack and marks, each
  size_t max_memo = size_t{1} << 24;   // memo entries
};

// Runs `data` and returns the value STOP leaves on top of the stack. `label` names the pickle
// in messages, e.g. "'model.pt' entry 'archive/data.pkl'". Throws Error(InvalidInput) for a
// malformed or disallowed pickle and Error(Unsupported) for opcodes it does not handle.
PickleValue* unpickle(std::span<const std::byte> data, std::string_view label, PickleHooks& hooks,
                      PickleArena& arena, const UnpickleLimits& limits = {});

}  // namespace qforge
