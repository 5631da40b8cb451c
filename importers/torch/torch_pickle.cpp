#include "importers/torch/torch_pickle.h"

#include <array>

#include "importers/torch/byte_io.h"
#include "importers/torch/torch_types.h"
#include "ir/error.h"

namespace qforge {

using torch_detail::printable;

namespace {

constexpr std::string_view kRebuildV2 = "torch._utils._rebuild_tensor_v2";
constexpr std::string_view kRebuildV3 = "torch._utils._rebuild_tensor_v3";
constexpr std::string_view kRebuildParameter = "torch._utils._rebuild_parameter";
constexpr std::string_view kRebuildParameterState = "torch._utils._rebuild_parameter_with_state";
constexpr std::string_view kRebuildFromType = "torch._tensor._rebuild_from_type_v2";
constexpr std::string_view kOrderedDict = "collections.OrderedDict";
constexpr std::string_view kParameter = "torch.nn.parameter.Parameter";
constexpr std::string_view kTensorType = "torch.Tensor";
constexpr std::string_view kUntypedStorage = "torch.storage.UntypedStorage";

constexpr std::array<std::string_view, 9> kNamedGlobals = {
    kRebuildV2,   kRebuildV3, kRebuildParameter, kRebuildParameterState, kRebuildFromType,
    kOrderedDict, kParameter, kTensorType,       kUntypedStorage};

// Reads the arguments of one interpreted call, with messages naming the call and argument.
class Args {
 public:
  Args(std::string fn, const PickleTuple& args, const std::string& where)
      : fn_(std::move(fn)), args_(args), where_(where) {}

  void expect_count(size_t lo, size_t hi) const {
    if (args_.items.size() < lo || args_.items.size() > hi) {
      std::string range = std::to_string(lo);
      if (hi != lo) range += " to " + std::to_string(hi);
      bad("takes " + range + " arguments, not " + std::to_string(args_.items.size()));
    }
  }
  const PickleValue& at(size_t i) const { return *args_.items.at(i); }
  PickleValue* ref(size_t i) const { return args_.items.at(i); }

  template <typename T>
  const T& get(size_t i, std::string_view what) const {
    const T* v = at(i).as<T>();
    if (v == nullptr) {
      bad("argument " + std::to_string(i) + " (" + std::string(what) + ") is a " +
          std::string(pickle_type_name(at(i))));
    }
    return *v;
  }
  uint64_t non_negative(size_t i, std::string_view what) const {
    const int64_t v = get<int64_t>(i, what);
    if (v < 0) bad("argument " + std::to_string(i) + " (" + std::string(what) + ") is negative");
    return static_cast<uint64_t>(v);
  }
  std::vector<int64_t> ints(size_t i, std::string_view what) const {
    std::vector<int64_t> out;
    for (const PickleValue* item : get<PickleTuple>(i, what).items) {
      const auto* v = item->as<int64_t>();
      if (v == nullptr || *v < 0) {
        bad("argument " + std::to_string(i) + " (" + std::string(what) +
            ") must hold non-negative ints");
      }
      out.push_back(*v);
    }
    return out;
  }
  [[noreturn]] void bad(const std::string& what) const {
    fail_invalid(where_ + ": " + fn_ + " " + what + "; the file is corrupt or not from torch.save");
  }

 private:
  std::string fn_;
  const PickleTuple& args_;
  const std::string& where_;
};

PickleValue* tensor_arg(const Args& a, size_t i) {
  a.get<PickleTensor>(i, "tensor");
  return a.ref(i);
}

PickleValue* rebuild_tensor(const Args& a, bool v3, PickleArena& arena) {
  a.expect_count(v3 ? 7 : 6, v3 ? 8 : 7);
  const auto& storage = a.get<PickleStorage>(0, "storage");
  PickleTensor t;
  t.storage = a.ref(0);
  t.storage_offset = a.non_negative(1, "storage offset");
  t.size = a.ints(2, "size");
  t.stride = a.ints(3, "stride");
  if (t.size.size() != t.stride.size()) {
    a.bad("has " + std::to_string(t.size.size()) + " sizes but " + std::to_string(t.stride.size()) +
          " strides");
  }
  if (v3) {
    const auto& dtype = a.get<PickleGlobal>(6, "dtype");
    t.dtype_name = dtype.name;
    if (dtype.module != "torch" || torch_dtype_by_name(dtype.name) == nullptr) {
      a.bad("argument 6 (dtype) is '" + printable(dtype.qualified()) + "', not a torch dtype");
    }
    if (storage.typed && storage.dtype_name != t.dtype_name) {
      a.bad("views a " + storage.dtype_name + " storage as " + t.dtype_name);
    }
  } else {
    if (!storage.typed) a.bad("views an untyped storage without naming a dtype");
    t.dtype_name = storage.dtype_name;
  }
  return arena.make(std::move(t));
}

}  // namespace

bool torch_pickle_allows_global(std::string_view module, std::string_view name) {
  if (module == "torch" && (torch_dtype_by_name(name) || torch_dtype_by_storage(name))) {
    return true;
  }
  const std::string qualified = std::string(module) + "." + std::string(name);
  for (const auto g : kNamedGlobals) {
    if (g == qualified) return true;
  }
  return false;
}

bool TorchPickleHooks::allows_global(std::string_view module, std::string_view name) const {
  return torch_pickle_allows_global(module, name);
}

PickleValue* TorchPickleHooks::call(const PickleGlobal& callable, const PickleTuple& args,
                                    bool newobj, PickleArena& arena, const std::string& where) {
  const std::string fn = callable.qualified();
  const Args a(fn, args, where);
  if (fn == kOrderedDict) {
    a.expect_count(0, 0);  // torch writes OrderedDict() and then SETITEMS
    return arena.make(PickleDict{});
  }
  if (fn == kParameter) {  // Parameter(data[, requires_grad]): the tensor itself
    a.expect_count(1, 2);
    return tensor_arg(a, 0);
  }
  if (!newobj) {
    if (fn == kRebuildV2 || fn == kRebuildV3) return rebuild_tensor(a, fn == kRebuildV3, arena);
    if (fn == kRebuildParameter || fn == kRebuildParameterState) {
      a.expect_count(fn == kRebuildParameter ? 3 : 4, fn == kRebuildParameter ? 3 : 4);
      return tensor_arg(a, 0);
    }
    if (fn == kRebuildFromType) {  // (func, new_type, args, state): func(*args) as new_type
      a.expect_count(4, 4);
      const auto& inner = a.get<PickleGlobal>(0, "function");
      const auto& type = a.get<PickleGlobal>(1, "type").qualified();
      if (inner.qualified() == kRebuildFromType || (type != kTensorType && type != kParameter)) {
        a.bad("rebuilds '" + printable(inner.qualified()) + "' as '" + printable(type) +
              "'; qforge reads plain tensors and parameters only");
      }
      PickleValue* rebuilt = call(inner, a.get<PickleTuple>(2, "arguments"), false, arena, where);
      if (!rebuilt->is<PickleTensor>()) {
        a.bad("rebuilds a " + std::string(pickle_type_name(*rebuilt)) + ", not a tensor");
      }
      return rebuilt;
    }
  }
  fail_invalid(where + (newobj ? " instantiates '" : " calls '") + printable(fn) +
               "', which qforge does not interpret (pickle data is parsed, never executed)");
}

PickleValue* TorchPickleHooks::persistent_load(const PickleValue& pid, PickleArena& arena,
                                               const std::string& where) {
  const auto* tuple = pid.as<PickleTuple>();
  if (tuple == nullptr) {
    fail_invalid(where + ": persistent id is a " + std::string(pickle_type_name(pid)) +
                 ", not torch's ('storage', type, key, location, numel) tuple");
  }
  const Args a("persistent id", *tuple, where);
  a.expect_count(5, 5);
  if (a.get<std::string>(0, "kind") != "storage") {
    a.bad("names a '" + printable(a.get<std::string>(0, "kind")) + "', not a storage");
  }
  PickleStorage s;
  const auto& type = a.get<PickleGlobal>(1, "storage type");
  s.type_name = type.qualified();
  s.key = a.get<std::string>(2, "key");
  s.location = a.get<std::string>(3, "location");
  s.numel = a.non_negative(4, "numel");
  if (s.type_name == kUntypedStorage) {
    s.typed = false;
  } else if (const TorchDType* t =
                 type.module == "torch" ? torch_dtype_by_storage(type.name) : nullptr) {
    s.dtype_name = t->name;
  } else {
    a.bad("names storage type '" + printable(s.type_name) + "'");
  }
  const bool plain_key = !s.key.empty() && s.key.size() <= 64 &&
                         s.key.find_first_not_of(
                             "0123456789abcdefghijklmnopqrstuvwxyz"
                             "ABCDEFGHIJKLMNOPQRSTUVWXYZ_") == std::string::npos;
  if (!plain_key) a.bad("has storage key '" + printable(s.key) + "', which is not a plain name");
  const auto [it, inserted] = storages_.emplace(s.key, nullptr);
  if (!inserted) {
    const auto& seen = *it->second->as<PickleStorage>();
    if (seen.type_name != s.type_name || seen.numel != s.numel) {
      a.bad("declares storage '" + s.key + "' twice with different types or sizes");
    }
    return it->second;
  }
  it->second = arena.make(std::move(s));
  return it->second;
}

void TorchPickleHooks::build(PickleValue& object, const PickleValue& state,
                             const std::string& where) {
  // torch sets OrderedDict._metadata and Python attributes of tensors this way; neither
  // changes a tensor's data.
  if (object.is<PickleDict>() || object.is<PickleTensor>()) return;
  fail_invalid(where + ": BUILD sets the state of a " + std::string(pickle_type_name(object)) +
               " from a " + std::string(pickle_type_name(state)) +
               ", which torch.save does not write; the file is corrupt");
}

TorchPickle parse_torch_pickle(std::span<const std::byte> data, std::string_view label) {
  TorchPickle out;
  TorchPickleHooks hooks;
  out.root = unpickle(data, label, hooks, out.arena);
  return out;
}

}  // namespace qforge
