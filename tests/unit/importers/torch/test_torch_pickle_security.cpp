// Malicious pickles: globals outside the allow-list, calls of things that are not rebuild
// functions, opcodes that instantiate classes. Each is refused naming what it asked for, and
// nothing it asks for ever happens.
#include <gtest/gtest.h>

#include "importers/torch/torch_pickle.h"
#include "importers/torch/torch_reader.h"
#include "torch_test_util.h"

using namespace qforge;
using namespace qforge::torch_test;
using Op = PickleOp;

namespace {

struct Global {
  const char* module;
  const char* name;
  std::string qualified() const { return std::string(module) + "." + name; }
};

constexpr Global kMalicious[] = {{"os", "system"},        {"posix", "system"},
                                 {"builtins", "eval"},    {"builtins", "exec"},
                                 {"subprocess", "Popen"}, {"subprocess", "check_output"}};

Failure parse_failure(const Bytes& b) {
  return failure_of([&] { parse_torch_pickle(b, "'evil.pt' entry 'archive/data.pkl'"); });
}

// {"w": <callable>(command,)}: what a pickle that runs `command` looks like.
Bytes calling_pickle(const Global& g, const std::string& command, bool stack_global) {
  PickleBuilder p;
  p.proto(stack_global ? 4 : 2).op(Op::EMPTY_DICT).str("w");
  if (stack_global) {
    p.stack_global(g.module, g.name);
  } else {
    p.global(g.module, g.name);
  }
  return p.str(command).op(Op::TUPLE1).op(Op::REDUCE).op(Op::SETITEM).stop().bytes;
}

void expect_refused(const Failure& f, const std::string& name) {
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput) << f.message;
  EXPECT_NE(f.message.find("'" + name + "'"), std::string::npos) << f.message;
  EXPECT_NE(f.message.find("never executed"), std::string::npos) << f.message;
}

}  // namespace

TEST(TorchPickleSecurity, RefusesMaliciousGlobalsViaGlobal) {
  for (const Global& g : kMalicious) {
    const Failure f = parse_failure(calling_pickle(g, "id", false));
    expect_refused(f, g.qualified());
    // PROTO (2 bytes), EMPTY_DICT (1), BINUNICODE "w" (6): the GLOBAL is at byte 9.
    EXPECT_NE(f.message.find("pickle in 'evil.pt' entry 'archive/data.pkl' at byte 9"),
              std::string::npos)
        << f.message;
  }
}

TEST(TorchPickleSecurity, RefusesMaliciousGlobalsViaStackGlobal) {
  for (const Global& g : kMalicious) {
    expect_refused(parse_failure(calling_pickle(g, "id", true)), g.qualified());
  }
}

TEST(TorchPickleSecurity, RefusesReduceOnAllowedNonCallables) {
  // Storage classes, dtypes and torch.Tensor may be named, but qforge interprets no call of
  // them.
  for (const Global& g : {Global{"torch", "FloatStorage"}, Global{"torch", "float32"},
                          Global{"torch", "Tensor"}, Global{"torch.storage", "UntypedStorage"}}) {
    const Failure f = parse_failure(calling_pickle(g, "id", false));
    expect_refused(f, g.qualified());
    EXPECT_NE(f.message.find("calls '" + g.qualified() + "'"), std::string::npos) << f.message;
  }
}

TEST(TorchPickleSecurity, RefusesReduceOnStringsAndOtherValues) {
  PickleBuilder p;
  p.proto().str("os.system").str("id").op(Op::TUPLE1).op(Op::REDUCE).stop();
  const Failure f = parse_failure(p.bytes);
  expect_refused(f, "os.system");
  EXPECT_NE(f.message.find("calls a str"), std::string::npos) << f.message;

  PickleBuilder q;
  q.proto().global("collections", "OrderedDict").op(Op::EMPTY_TUPLE).op(Op::REDUCE);
  q.op(Op::EMPTY_TUPLE).op(Op::REDUCE).stop();  // calling the dict the first call built
  EXPECT_NE(parse_failure(q.bytes).message.find("calls a dict"), std::string::npos);
}

TEST(TorchPickleSecurity, RefusesNewobjOfRebuildFunctions) {
  PickleBuilder p;
  p.proto().global("torch._utils", "_rebuild_tensor_v2").op(Op::EMPTY_TUPLE).op(Op::NEWOBJ).stop();
  const Failure f = parse_failure(p.bytes);
  expect_refused(f, "torch._utils._rebuild_tensor_v2");
  EXPECT_NE(f.message.find("instantiates"), std::string::npos) << f.message;
}

TEST(TorchPickleSecurity, RefusesInstAndObjOpcodes) {
  PickleBuilder inst;
  inst.proto().op(Op::MARK).str("touch qforge_pwned").op(Op::INST).text("os\nsystem\n").stop();
  const Failure i = parse_failure(inst.bytes);
  expect_refused(i, "os.system");
  EXPECT_NE(i.message.find("opcode INST (0x69)"), std::string::npos) << i.message;

  PickleBuilder obj;
  obj.proto().op(Op::MARK).global("collections", "OrderedDict").op(Op::OBJ).stop();
  const Failure o = parse_failure(obj.bytes);
  expect_refused(o, "collections.OrderedDict");
  EXPECT_NE(o.message.find("opcode OBJ (0x6f)"), std::string::npos) << o.message;
}

TEST(TorchPickleSecurity, RefusesRebuildFromTypeOfOtherTypes) {
  PickleBuilder p;
  p.proto().global("torch._tensor", "_rebuild_from_type_v2").op(Op::MARK);
  p.global("torch._utils", "_rebuild_tensor_v2").global("torch", "FloatStorage");
  p.op(Op::EMPTY_TUPLE).op(Op::EMPTY_DICT).op(Op::TUPLE).op(Op::REDUCE).stop();
  const Failure f = parse_failure(p.bytes);
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
  EXPECT_NE(f.message.find("as 'torch.FloatStorage'"), std::string::npos) << f.message;

  PickleBuilder dict;  // _rebuild_from_type_v2(OrderedDict, torch.Tensor, (), {})
  dict.proto().global("torch._tensor", "_rebuild_from_type_v2").op(Op::MARK);
  dict.global("collections", "OrderedDict").global("torch", "Tensor");
  dict.op(Op::EMPTY_TUPLE).op(Op::EMPTY_DICT).op(Op::TUPLE).op(Op::REDUCE).stop();
  const Failure d = parse_failure(dict.bytes);
  EXPECT_NE(d.message.find("rebuilds a dict, not a tensor"), std::string::npos) << d.message;
}

TEST(TorchPickleSecurity, RefusesMalformedPersistentIds) {
  auto pid = [](const std::string& kind, const std::string& key) {
    PickleBuilder p;
    p.proto().op(Op::MARK).str(kind).global("torch", "FloatStorage").str(key).str("cpu");
    return p.integer(4).op(Op::TUPLE).op(Op::BINPERSID).stop().bytes;
  };
  EXPECT_NO_THROW(parse_torch_pickle(pid("storage", "0"), "t"));
  const Failure key = parse_failure(pid("storage", "../../etc/passwd"));
  EXPECT_NE(key.message.find("storage key '../../etc/passwd'"), std::string::npos) << key.message;
  const Failure kind = parse_failure(pid("module", "0"));
  EXPECT_NE(kind.message.find("names a 'module'"), std::string::npos) << kind.message;
}

TEST(TorchPickleSecurity, AllowListHoldsOnlyWhatTorchSaveEmits) {
  EXPECT_TRUE(torch_pickle_allows_global("torch._utils", "_rebuild_tensor_v2"));
  EXPECT_TRUE(torch_pickle_allows_global("torch", "BFloat16Storage"));
  EXPECT_TRUE(torch_pickle_allows_global("torch", "bfloat16"));
  EXPECT_TRUE(torch_pickle_allows_global("collections", "OrderedDict"));
  EXPECT_FALSE(torch_pickle_allows_global("torch", "load"));
  EXPECT_FALSE(torch_pickle_allows_global("torch", "Storage"));
  EXPECT_FALSE(torch_pickle_allows_global("torch._utils", "_rebuild_qtensor"));
  EXPECT_FALSE(torch_pickle_allows_global("builtins", "getattr"));
  EXPECT_FALSE(torch_pickle_allows_global("torch.nn.modules.linear", "Linear"));
  EXPECT_FALSE(torch_pickle_allows_global("collections.OrderedDict", ""));
}

// The payloads would create a file if anything ran them; inside a valid torch archive, the
// import is refused and the file never appears.
TEST(TorchPickleSecurity, MaliciousArchiveHasNoSideEffect) {
  TempDir dir;
  const auto marker = dir / "pwned";
  const std::string m = marker.string();
  const std::vector<std::pair<Global, std::string>> payloads = {
      {{"os", "system"}, "touch " + m},
      {{"posix", "system"}, "touch " + m},
      {{"builtins", "exec"}, "open('" + m + "', 'w')"},
      {{"builtins", "eval"}, "open('" + m + "', 'w')"},
      {{"subprocess", "check_output"}, "touch " + m}};
  for (const auto& [g, command] : payloads) {
    for (bool stack_global : {false, true}) {
      // A real tensor first, so the archive is valid up to the payload.
      PickleBuilder p;
      p.proto(stack_global ? 4 : 2).op(Op::EMPTY_DICT).op(Op::MARK).str("w");
      p.tensor_v2("FloatStorage", "0", 2, 0, {2}, {1}).str("payload");
      if (stack_global) {
        p.stack_global(g.module, g.name);
      } else {
        p.global(g.module, g.name);
      }
      p.str(command).op(Op::TUPLE1).op(Op::REDUCE).op(Op::SETITEMS).stop();
      const auto zip = torch_zip("evil", p.bytes, {{"0", to_bytes(std::vector<float>{1, 2})}});
      write_file(dir / "evil.pt", zip.bytes);
      const Failure f = failure_of([&] { import_torch(dir / "evil.pt"); });
      expect_refused(f, g.qualified());
      EXPECT_FALSE(std::filesystem::exists(marker)) << g.qualified() << " ran";
    }
  }
}
