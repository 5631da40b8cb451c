// The restricted unpickler's opcode machine: values it builds and the malformed pickles it
// refuses. Policy (which globals, what calls mean) is torch's, tested in
// test_torch_pickle_security.cpp.
#include <gtest/gtest.h>

#include "importers/torch/torch_pickle.h"
#include "importers/torch/unpickler.h"
#include "torch_test_util.h"

using namespace qforge;
using namespace qforge::torch_test;
using Op = PickleOp;

namespace {

TorchPickle parse(const Bytes& b) { return parse_torch_pickle(b, "'t.pkl'"); }

Failure parse_failure(const Bytes& b) {
  return failure_of([&] { parse(b); });
}

const PickleValue& dict_value(const PickleValue& dict, std::string_view key) {
  for (const auto& [k, v] : dict.as<PickleDict>()->items) {
    if (const auto* s = k->as<std::string>(); s && *s == key) return *v;
  }
  throw std::runtime_error("no key " + std::string(key));
}

}  // namespace

TEST(Unpickler, BuildsScalarsAndContainers) {
  PickleBuilder p;
  p.proto().op(Op::EMPTY_DICT).put(0).op(Op::MARK);
  p.str("int").integer(-5).str("big").integer(int64_t{1} << 40).str("u16").integer(60000);
  p.str("neg_long").op(Op::LONG1).byte(2).le(0xff00, 2);      // -256
  p.str("float").op(Op::BINFLOAT).le(0x0000000000000c40, 8);  // 3.5 big-endian
  p.str("none").op(Op::NONE).str("yes").op(Op::NEWTRUE).str("no").op(Op::NEWFALSE);
  p.str("bytes").op(Op::SHORT_BINBYTES).byte(2).text("ab");
  p.str("list").op(Op::EMPTY_LIST).put(1).integer(1).op(Op::APPEND);
  p.op(Op::MARK).integer(2).integer(3).op(Op::APPENDS);
  p.str("tuple").integer(7).str("x").op(Op::TUPLE2);
  p.str("same_list").get(1);
  p.op(Op::SETITEMS).stop();
  const TorchPickle t = parse(p.bytes);
  const PickleValue& d = *t.root;
  EXPECT_EQ(*dict_value(d, "int").as<int64_t>(), -5);
  EXPECT_EQ(*dict_value(d, "big").as<int64_t>(), int64_t{1} << 40);
  EXPECT_EQ(*dict_value(d, "u16").as<int64_t>(), 60000);
  EXPECT_EQ(*dict_value(d, "neg_long").as<int64_t>(), -256);
  EXPECT_EQ(*dict_value(d, "float").as<double>(), 3.5);
  EXPECT_TRUE(dict_value(d, "none").is<PickleNone>());
  EXPECT_TRUE(*dict_value(d, "yes").as<bool>());
  EXPECT_FALSE(*dict_value(d, "no").as<bool>());
  EXPECT_EQ(dict_value(d, "bytes").as<PickleBytes>()->data, "ab");
  const auto& list = dict_value(d, "list").as<PickleList>()->items;
  ASSERT_EQ(list.size(), 3u);
  EXPECT_EQ(*list[2]->as<int64_t>(), 3);
  EXPECT_EQ(&dict_value(d, "same_list"), &dict_value(d, "list"));  // the memo shares objects
  const auto& tuple = dict_value(d, "tuple").as<PickleTuple>()->items;
  ASSERT_EQ(tuple.size(), 2u);
  EXPECT_EQ(*tuple[1]->as<std::string>(), "x");
}

TEST(Unpickler, Protocol4FramesMemoizeAndStackGlobal) {
  PickleBuilder p;
  p.proto(4).op(Op::FRAME).le(20, 8).op(Op::EMPTY_DICT).op(Op::MEMOIZE);
  p.str8("od").op(Op::MEMOIZE).stack_global("collections", "OrderedDict").op(Op::MEMOIZE);
  p.op(Op::EMPTY_TUPLE).op(Op::REDUCE).op(Op::MEMOIZE).op(Op::SETITEM);
  p.str8("again").get(3).op(Op::SETITEM).stop();
  const TorchPickle t = parse(p.bytes);
  EXPECT_TRUE(dict_value(*t.root, "od").is<PickleDict>());
  EXPECT_EQ(&dict_value(*t.root, "again"), &dict_value(*t.root, "od"));
}

TEST(Unpickler, DuplicateKeyKeepsFirstPlaceAndLastValue) {
  PickleBuilder p;
  p.proto().op(Op::EMPTY_DICT).op(Op::MARK).str("a").integer(1).str("b").integer(2);
  p.str("a").integer(3).op(Op::SETITEMS).stop();
  const TorchPickle t = parse(p.bytes);
  const auto& items = t.root->as<PickleDict>()->items;
  ASSERT_EQ(items.size(), 2u);
  EXPECT_EQ(*items[0].first->as<std::string>(), "a");
  EXPECT_EQ(*items[0].second->as<int64_t>(), 3);
}

TEST(Unpickler, RejectsEveryTruncation) {
  const Bytes whole = state_dict_pickle({{"w", "FloatStorage", "0", 6, {2, 3}}});
  ASSERT_NO_THROW(parse(whole));
  for (size_t n = 0; n < whole.size(); ++n) {
    const Bytes cut(whole.begin(), whole.begin() + static_cast<std::ptrdiff_t>(n));
    const Failure f = parse_failure(cut);
    EXPECT_EQ(f.category, ErrorCategory::InvalidInput) << "cut at " << n << ": " << f.message;
  }
  const Failure f = parse_failure(PickleBuilder().proto().str("abc").bytes);
  EXPECT_NE(f.message.find("without a STOP opcode"), std::string::npos) << f.message;
  const Failure g = parse_failure(PickleBuilder().proto().op(Op::BINUNICODE).le(1000, 4).bytes);
  EXPECT_NE(g.message.find("BINUNICODE needs 1000 bytes"), std::string::npos) << g.message;
  EXPECT_NE(g.message.find("at byte 2"), std::string::npos) << g.message;
}

TEST(Unpickler, RejectsUnknownOpcodeNamingByteAndOffset) {
  const Failure f = parse_failure(PickleBuilder().proto().op(Op::NONE).byte(0xff).bytes);
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
  EXPECT_NE(f.message.find("unknown opcode 0xff"), std::string::npos) << f.message;
  EXPECT_NE(f.message.find("at byte 3"), std::string::npos) << f.message;
}

TEST(Unpickler, KnownOpcodeTorchNeverEmitsIsUnsupported) {
  const Failure f = parse_failure(PickleBuilder().proto().op(Op::EXT1).byte(1).stop().bytes);
  EXPECT_EQ(f.category, ErrorCategory::Unsupported);
  EXPECT_NE(f.message.find("EXT1 (0x82)"), std::string::npos) << f.message;
}

TEST(Unpickler, RejectsStackUnderflow) {
  for (const Bytes& b :
       {PickleBuilder().proto().op(Op::APPEND).stop().bytes,
        PickleBuilder().proto().integer(1).op(Op::TUPLE2).stop().bytes,
        PickleBuilder().proto().stop().bytes, PickleBuilder().proto().op(Op::REDUCE).stop().bytes,
        // values below a MARK are out of reach, as in Python
        PickleBuilder()
            .proto()
            .op(Op::EMPTY_LIST)
            .op(Op::MARK)
            .integer(1)
            .op(Op::POP)
            .op(Op::APPEND)
            .stop()
            .bytes}) {
    const Failure f = parse_failure(b);
    EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
    EXPECT_TRUE(f.message.find("stack underflow") != std::string::npos ||
                f.message.find("empty stack") != std::string::npos)
        << f.message;
  }
}

TEST(Unpickler, RejectsMemoIndexNeverStored) {
  const Failure f = parse_failure(
      PickleBuilder().proto().integer(1).put(0).op(Op::LONG_BINGET).le(7, 4).stop().bytes);
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
  EXPECT_NE(f.message.find("memo index 7 was never stored"), std::string::npos) << f.message;
  EXPECT_NE(f.message.find("LONG_BINGET"), std::string::npos) << f.message;
}

TEST(Unpickler, RejectsMissingMarkAndWrongContainers) {
  const Failure no_mark =
      parse_failure(PickleBuilder().proto().integer(1).op(Op::TUPLE).stop().bytes);
  EXPECT_NE(no_mark.message.find("no MARK before it"), std::string::npos) << no_mark.message;
  const Failure append = parse_failure(
      PickleBuilder().proto().op(Op::EMPTY_DICT).integer(1).op(Op::APPEND).stop().bytes);
  EXPECT_NE(append.message.find("appends to a dict"), std::string::npos) << append.message;
  const Failure setitem = parse_failure(PickleBuilder()
                                            .proto()
                                            .op(Op::EMPTY_LIST)
                                            .integer(1)
                                            .integer(2)
                                            .op(Op::SETITEM)
                                            .stop()
                                            .bytes);
  EXPECT_NE(setitem.message.find("sets items of a list"), std::string::npos) << setitem.message;
  const Failure odd = parse_failure(PickleBuilder()
                                        .proto()
                                        .op(Op::EMPTY_DICT)
                                        .op(Op::MARK)
                                        .integer(1)
                                        .op(Op::SETITEMS)
                                        .stop()
                                        .bytes);
  EXPECT_NE(odd.message.find("odd number"), std::string::npos) << odd.message;
}

TEST(Unpickler, RejectsOversizedIntegersAndProtocols) {
  const Failure wide =
      parse_failure(PickleBuilder().proto().op(Op::LONG1).byte(9).le(1, 8).byte(0).stop().bytes);
  EXPECT_NE(wide.message.find("does not fit in 64 bits"), std::string::npos) << wide.message;
  const Failure proto = parse_failure(PickleBuilder().proto(6).op(Op::NONE).stop().bytes);
  EXPECT_NE(proto.message.find("protocol 6"), std::string::npos) << proto.message;
  const Failure frame = parse_failure(PickleBuilder().proto(4).op(Op::FRAME).le(99, 8).bytes);
  EXPECT_NE(frame.message.find("frame of 99 bytes"), std::string::npos) << frame.message;
}

TEST(Unpickler, EnforcesStackAndMemoLimits) {
  TorchPickleHooks hooks;
  PickleArena arena;
  PickleBuilder deep;
  deep.proto();
  for (int i = 0; i < 5; ++i) deep.op(Op::NONE);
  deep.stop();
  const Failure stack = failure_of(
      [&] { unpickle(deep.bytes, "'t.pkl'", hooks, arena, {.max_stack = 4, .max_memo = 4}); });
  EXPECT_EQ(stack.category, ErrorCategory::Unsupported);
  EXPECT_NE(stack.message.find("stack grows past 4"), std::string::npos) << stack.message;
  EXPECT_NO_THROW(unpickle(deep.bytes, "'t.pkl'", hooks, arena, {.max_stack = 5, .max_memo = 4}));

  PickleBuilder memo;
  memo.proto().op(Op::NONE);
  for (int i = 0; i < 3; ++i) memo.put(static_cast<uint8_t>(i));
  memo.put(1).stop();  // overwriting an existing index stays within the limit
  EXPECT_NO_THROW(unpickle(memo.bytes, "'t.pkl'", hooks, arena, {.max_stack = 8, .max_memo = 3}));
  memo.bytes.pop_back();
  memo.put(9).stop();
  const Failure f = failure_of(
      [&] { unpickle(memo.bytes, "'t.pkl'", hooks, arena, {.max_stack = 8, .max_memo = 3}); });
  EXPECT_NE(f.message.find("memo grows past 3"), std::string::npos) << f.message;
}

TEST(Unpickler, NamesEveryOpcode) {
  EXPECT_EQ(pickle_opcode_name(0x93), "STACK_GLOBAL");
  EXPECT_EQ(pickle_opcode_name('i'), "INST");
  EXPECT_EQ(pickle_opcode_name(0xff), "");
  int named = 0;
  for (int b = 0; b < 256; ++b) named += !pickle_opcode_name(static_cast<uint8_t>(b)).empty();
  EXPECT_EQ(named, 68);  // pickle protocols 0-5
}
