#include "importers/torch/unpickler.h"

#include <bit>
#include <unordered_map>
#include <vector>

#include "importers/torch/byte_io.h"
#include "ir/error.h"

namespace qforge {

using torch_detail::as_chars;
using torch_detail::fits;
using torch_detail::load_le;
using torch_detail::printable;
using torch_detail::quote;

namespace {

std::string hex_byte(uint8_t b) {
  static constexpr char kHex[] = "0123456789abcdef";
  return std::string("0x") + kHex[b >> 4] + kHex[b & 15];
}

class Machine {
 public:
  Machine(std::span<const std::byte> data, std::string_view label, PickleHooks& hooks,
          PickleArena& arena, const UnpickleLimits& limits)
      : data_(data), label_(label), hooks_(hooks), arena_(arena), limits_(limits) {}

  PickleValue* run() {
    while (pos_ < data_.size()) {
      op_pos_ = pos_;
      op_ = static_cast<uint8_t>(data_[pos_++]);
      if (op_ == static_cast<uint8_t>(PickleOp::STOP)) {
        if (stack_.empty()) bad("STOP finds an empty stack");
        return stack_.back();
      }
      step();
    }
    fail_invalid("pickle in " + std::string(label_) + " ends at byte " +
                 std::to_string(data_.size()) + " without a STOP opcode; it is truncated");
  }

 private:
  std::string where() const {
    return "pickle in " + std::string(label_) + " at byte " + std::to_string(op_pos_);
  }
  [[noreturn]] void bad(const std::string& what) const {
    fail_invalid(where() + " (" + std::string(pickle_opcode_name(op_)) + "): " + what +
                 "; the pickle is corrupt");
  }

  // --- reading operands -------------------------------------------------------------------
  std::span<const std::byte> take(uint64_t n) {
    if (!fits(pos_, n, data_.size())) {
      fail_invalid(where() + ": opcode " + std::string(pickle_opcode_name(op_)) + " needs " +
                   std::to_string(n) + " bytes but the pickle ends at byte " +
                   std::to_string(data_.size()) + "; it is truncated");
    }
    const auto s = data_.subspan(pos_, n);
    pos_ += n;
    return s;
  }
  template <typename T>
  T take_le() {
    return load_le<T>(take(sizeof(T)).data());
  }
  std::string_view take_line() {
    const auto rest = as_chars(data_.subspan(pos_));
    const size_t nl = rest.find('\n');
    if (nl == std::string_view::npos) bad("line operand has no terminating newline");
    pos_ += nl + 1;
    return rest.substr(0, nl);
  }
  std::string take_string(uint64_t n) { return std::string(as_chars(take(n))); }

  // --- the stack, marks and memo ----------------------------------------------------------
  void push(PickleVariant v) { push_ref(arena_.make(std::move(v))); }
  void push_ref(PickleValue* v) {
    if (stack_.size() >= limits_.max_stack) {
      fail_unsupported(where() + ": the pickle stack grows past " +
                       std::to_string(limits_.max_stack) + " values, qforge's limit");
    }
    stack_.push_back(v);
  }
  PickleValue* pop() {
    if (stack_.empty()) bad("stack underflow: it needs a value but the stack is empty");
    PickleValue* v = stack_.back();
    stack_.pop_back();
    return v;
  }
  PickleValue* top() {
    if (stack_.empty()) bad("stack underflow: it needs a value but the stack is empty");
    return stack_.back();
  }
  // Python keeps the values above a MARK on their own stack; so does this.
  void mark() {
    if (marks_.size() >= limits_.max_stack) {
      fail_unsupported(where() + ": more than " + std::to_string(limits_.max_stack) +
                       " open MARKs, qforge's limit");
    }
    marks_.push_back(std::move(stack_));
    stack_.clear();
  }
  std::vector<PickleValue*> pop_mark() {
    if (marks_.empty()) bad("no MARK before it");
    std::vector<PickleValue*> items = std::move(stack_);
    stack_ = std::move(marks_.back());
    marks_.pop_back();
    return items;
  }
  void memo_put(uint64_t index) {
    if (memo_.size() >= limits_.max_memo && !memo_.contains(index)) {
      fail_unsupported(where() + ": the pickle memo grows past " +
                       std::to_string(limits_.max_memo) + " entries, qforge's limit");
    }
    memo_[index] = top();
  }
  void memo_get(uint64_t index) {
    const auto it = memo_.find(index);
    if (it == memo_.end()) bad("memo index " + std::to_string(index) + " was never stored");
    push_ref(it->second);
  }

  // --- containers and calls ---------------------------------------------------------------
  PickleList& list_at_top() {
    auto* list = top()->as<PickleList>();
    if (list == nullptr)
      bad("appends to a " + std::string(pickle_type_name(*top())) + ", not a list");
    return *list;
  }
  void set_items(const std::vector<PickleValue*>& kv) {
    auto* dict = top()->as<PickleDict>();
    if (dict == nullptr)
      bad("sets items of a " + std::string(pickle_type_name(*top())) + ", not a dict");
    if (kv.size() % 2 != 0) bad("odd number of values for key/value pairs");
    for (size_t i = 0; i < kv.size(); i += 2) dict->set(kv[i], kv[i + 1]);
  }
  void global(std::string_view module, std::string_view name) {
    if (!hooks_.allows_global(module, name)) {
      fail_invalid(where() + " references global '" + printable(module) + "." + printable(name) +
                   "', which qforge does not allow (pickle data is parsed, never executed); "
                   "qforge reads files that hold tensors and plain containers only, such as "
                   "torch.save(model.state_dict(), path)");
    }
    push(PickleGlobal{std::string(module), std::string(name)});
  }
  void call(bool newobj) {
    PickleValue* args = pop();
    PickleValue* callable = pop();
    const auto* tuple = args->as<PickleTuple>();
    if (tuple == nullptr)
      bad("arguments are a " + std::string(pickle_type_name(*args)) + ", not a tuple");
    const auto* g = callable->as<PickleGlobal>();
    if (g == nullptr) {
      std::string detail;
      if (const auto* s = callable->as<std::string>()) detail = " ('" + printable(*s) + "')";
      fail_invalid(where() + " calls a " + std::string(pickle_type_name(*callable)) + detail +
                   ", not an allowed global; qforge only interprets torch's rebuild functions "
                   "(pickle data is parsed, never executed)");
    }
    push_ref(hooks_.call(*g, *tuple, newobj, arena_, where()));
  }
  [[noreturn]] void reject(std::string_view why) const {
    fail_invalid(where() + " uses opcode " + std::string(pickle_opcode_name(op_)) + " (" +
                 hex_byte(op_) + "), which qforge does not accept: " + std::string(why) +
                 " (pickle data is parsed, never executed)");
  }
  int64_t take_long1() {
    const auto n = take_le<uint8_t>();
    if (n > 8) bad("integer of " + std::to_string(n) + " bytes does not fit in 64 bits");
    const auto b = take(n);
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) v |= static_cast<uint64_t>(b[i]) << (8 * i);
    if (n > 0 && n < 8 && (static_cast<uint8_t>(b[n - 1]) & 0x80)) v |= ~uint64_t{0} << (8 * n);
    return static_cast<int64_t>(v);
  }

  void step();

  std::span<const std::byte> data_;
  std::string_view label_;
  PickleHooks& hooks_;
  PickleArena& arena_;
  const UnpickleLimits& limits_;
  size_t pos_ = 0;
  size_t op_pos_ = 0;
  uint8_t op_ = 0;
  std::vector<PickleValue*> stack_;
  std::vector<std::vector<PickleValue*>> marks_;
  std::unordered_map<uint64_t, PickleValue*> memo_;
};

void Machine::step() {
  switch (static_cast<PickleOp>(op_)) {
    case PickleOp::PROTO: {  // PROTO
      const auto v = take_le<uint8_t>();
      if (v > 5) bad("protocol " + std::to_string(v) + " is newer than pickle's 5");
      break;
    }
    case PickleOp::FRAME: {  // FRAME: a length hint; the data is read flat, so only check it
      const auto n = take_le<uint64_t>();
      if (!fits(pos_, n, data_.size()))
        bad("frame of " + std::to_string(n) + " bytes runs past the end");
      break;
    }
    case PickleOp::MARK:
      mark();
      break;
    case PickleOp::POP:
      pop();
      break;
    case PickleOp::POP_MARK:
      pop_mark();
      break;
    case PickleOp::DUP:
      push_ref(top());
      break;
    case PickleOp::NONE:
      push(PickleNone{});
      break;
    case PickleOp::NEWTRUE:
      push(true);
      break;
    case PickleOp::NEWFALSE:
      push(false);
      break;
    case PickleOp::BININT:
      push(int64_t{take_le<int32_t>()});
      break;
    case PickleOp::BININT1:
      push(int64_t{take_le<uint8_t>()});
      break;
    case PickleOp::BININT2:
      push(int64_t{take_le<uint16_t>()});
      break;
    case PickleOp::LONG1:
      push(take_long1());
      break;
    case PickleOp::BINFLOAT: {  // big-endian IEEE double
      const auto b = take(8);
      uint64_t bits = 0;
      for (size_t i = 0; i < 8; ++i) bits = (bits << 8) | static_cast<uint64_t>(b[i]);
      push(std::bit_cast<double>(bits));
      break;
    }
    case PickleOp::BINUNICODE:
      push(take_string(take_le<uint32_t>()));
      break;
    case PickleOp::SHORT_BINUNICODE:
      push(take_string(take_le<uint8_t>()));
      break;
    case PickleOp::BINUNICODE8:
      push(take_string(take_le<uint64_t>()));
      break;
    case PickleOp::SHORT_BINBYTES:
      push(PickleBytes{take_string(take_le<uint8_t>())});
      break;
    case PickleOp::BINBYTES:
      push(PickleBytes{take_string(take_le<uint32_t>())});
      break;
    case PickleOp::BINBYTES8:
      push(PickleBytes{take_string(take_le<uint64_t>())});
      break;
    case PickleOp::EMPTY_DICT:
      push(PickleDict{});
      break;
    case PickleOp::EMPTY_LIST:
      push(PickleList{});
      break;
    case PickleOp::EMPTY_TUPLE:
      push(PickleTuple{});
      break;
    case PickleOp::TUPLE:
      push(PickleTuple{pop_mark()});
      break;
    case PickleOp::TUPLE1:
    case PickleOp::TUPLE2:
    case PickleOp::TUPLE3: {
      std::vector<PickleValue*> items(op_ - static_cast<uint8_t>(PickleOp::TUPLE1) + 1);
      for (size_t i = items.size(); i-- > 0;) items[i] = pop();
      push(PickleTuple{std::move(items)});
      break;
    }
    case PickleOp::APPEND: {
      PickleValue* v = pop();
      list_at_top().items.push_back(v);
      break;
    }
    case PickleOp::APPENDS: {
      auto items = pop_mark();
      auto& list = list_at_top().items;
      list.insert(list.end(), items.begin(), items.end());
      break;
    }
    case PickleOp::SETITEM: {
      PickleValue* value = pop();
      PickleValue* key = pop();
      set_items({key, value});
      break;
    }
    case PickleOp::SETITEMS:
      set_items(pop_mark());
      break;
    case PickleOp::BINPUT:
      memo_put(take_le<uint8_t>());
      break;
    case PickleOp::LONG_BINPUT:
      memo_put(take_le<uint32_t>());
      break;
    case PickleOp::MEMOIZE:
      memo_put(memo_.size());
      break;
    case PickleOp::BINGET:
      memo_get(take_le<uint8_t>());
      break;
    case PickleOp::LONG_BINGET:
      memo_get(take_le<uint32_t>());
      break;
    case PickleOp::GLOBAL: {
      const std::string_view module = take_line();
      global(module, take_line());
      break;
    }
    case PickleOp::STACK_GLOBAL: {
      PickleValue* name = pop();
      PickleValue* module = pop();
      if (!module->is<std::string>() || !name->is<std::string>())
        bad("module and name must be str");
      global(*module->as<std::string>(), *name->as<std::string>());
      break;
    }
    case PickleOp::REDUCE:
      call(false);
      break;
    case PickleOp::NEWOBJ:
      call(true);
      break;
    case PickleOp::BUILD: {
      PickleValue* state = pop();
      hooks_.build(*top(), *state, where());
      break;
    }
    case PickleOp::BINPERSID: {
      PickleValue* pid = pop();
      push_ref(hooks_.persistent_load(*pid, arena_, where()));
      break;
    }
    case PickleOp::INST: {
      const std::string module(take_line());
      reject("it instantiates class '" + printable(module) + "." + printable(take_line()) + "'");
    }
    case PickleOp::OBJ: {
      auto items = pop_mark();
      std::string cls = items.empty() ? "nothing" : std::string(pickle_type_name(*items[0]));
      if (!items.empty() && items[0]->is<PickleGlobal>()) {
        cls = quote(items[0]->as<PickleGlobal>()->qualified());
      }
      reject("it instantiates class " + cls);
    }
    default:
      if (pickle_opcode_name(op_).empty()) {
        fail_invalid(where() + ": unknown opcode " + hex_byte(op_) + "; the pickle is corrupt");
      }
      fail_unsupported(where() + " uses opcode " + std::string(pickle_opcode_name(op_)) + " (" +
                       hex_byte(op_) +
                       "), which torch.save does not emit and qforge's "
                       "restricted unpickler does not handle");
  }
}

}  // namespace

PickleValue* unpickle(std::span<const std::byte> data, std::string_view label, PickleHooks& hooks,
                      PickleArena& arena, const UnpickleLimits& limits) {
  return Machine(data, label, hooks, arena, limits).run();
}

}  // namespace qforge
