// import_torch on hand-made torch.save archives: names, dtypes, zero-copy windows, views,
// tied weights, and the malformed archives it refuses.
#include <gtest/gtest.h>

#include "importers/torch/torch_reader.h"
#include "torch_test_util.h"

using namespace qforge;
using namespace qforge::torch_test;
using Op = PickleOp;

namespace {

const std::vector<float> kSix = {0, 1, 2, 3, 4, 5};

Graph import_zip(const TempDir& dir, const BuiltZip& zip, const std::string& name = "m.pt") {
  write_file(dir / name, zip.bytes);
  return import_torch(dir / name);
}

Failure import_failure(const TempDir& dir, const BuiltZip& zip) {
  return failure_of([&] { import_zip(dir, zip); });
}

// {"w": tensor_v2(FloatStorage '0' of 6 floats, offset, size, stride)}
BuiltZip one_view(int64_t offset, const std::vector<int64_t>& size,
                  const std::vector<int64_t>& stride, const ZipOptions& options = {}) {
  PickleBuilder p;
  p.proto().op(Op::EMPTY_DICT).str("w").tensor_v2("FloatStorage", "0", 6, offset, size, stride);
  p.op(Op::SETITEM).stop();
  return torch_zip("archive", p.bytes, {{"0", to_bytes(kSix)}}, options);
}

}  // namespace

TEST(TorchReader, ReadsStateDictAsZeroCopyWindows) {
  TempDir dir;
  const auto pickle = state_dict_pickle({{"lin.weight", "FloatStorage", "0", 6, {2, 3}},
                                         {"lin.bias", "HalfStorage", "1", 2, {2}},
                                         {"steps", "LongStorage", "2", 1, {}}});
  const std::vector<uint16_t> half = {0x3c00, 0xc000};  // 1.0, -2.0
  const std::vector<int64_t> steps = {-7};
  const Graph g = import_zip(
      dir, torch_zip("archive", pickle,
                     {{"0", to_bytes(kSix)}, {"1", to_bytes(half)}, {"2", to_bytes(steps)}}));
  ASSERT_EQ(g.initializers().size(), 3u);
  EXPECT_EQ(g.initializers()[0].first, "lin.weight");  // pickle order
  const Tensor* w = g.find_initializer("lin.weight");
  EXPECT_EQ(w->dtype(), DType::F32);
  EXPECT_EQ(w->shape(), (Shape{2, 3}));
  EXPECT_TRUE(w->is_mapped());
  EXPECT_EQ(w->to_f32(), kSix);
  EXPECT_EQ(g.find_initializer("lin.bias")->to_f32(), (std::vector<float>{1.0f, -2.0f}));
  EXPECT_EQ(g.find_initializer("steps")->data<int64_t>()[0], -7);
  EXPECT_EQ(*g.find_metadata("source_format"), "torch");
  EXPECT_EQ(*g.find_metadata("source_path"), (dir / "m.pt").string());
  EXPECT_TRUE(g.nodes.empty());
}

TEST(TorchReader, FindsArchivePrefixFromEntries) {
  TempDir dir;
  const auto pickle = state_dict_pickle({{"a", "FloatStorage", "0", 6, {6}}});
  const Graph g =
      import_zip(dir, torch_zip("some_name", pickle, {{"0", to_bytes(kSix)}}, {.zip64 = true}));
  EXPECT_EQ(g.find_initializer("a")->to_f32(), kSix);

  const Failure none = import_failure(dir, build_zip({{"archive/other.pkl", pickle}}));
  EXPECT_EQ(none.category, ErrorCategory::InvalidInput);
  EXPECT_NE(none.message.find("no '<name>/data.pkl' entry"), std::string::npos) << none.message;

  const Failure two =
      import_failure(dir, build_zip({{"a/data.pkl", pickle}, {"b/data.pkl", pickle}}));
  EXPECT_NE(two.message.find("holds 2 torch archives"), std::string::npos) << two.message;
}

TEST(TorchReader, ChecksByteOrder) {
  TempDir dir;
  const auto pickle = state_dict_pickle({{"a", "FloatStorage", "0", 6, {6}}});
  auto with_order = [&](const char* order) {
    return build_zip({{"archive/data.pkl", pickle},
                      {"archive/byteorder", to_bytes(order)},
                      {"archive/data/0", to_bytes(kSix)}});
  };
  EXPECT_NO_THROW(import_zip(dir, with_order("little")));
  const Failure big = import_failure(dir, with_order("big"));
  EXPECT_EQ(big.category, ErrorCategory::Unsupported);
  EXPECT_NE(big.message.find("big-endian"), std::string::npos) << big.message;
  EXPECT_EQ(import_failure(dir, with_order("middle")).category, ErrorCategory::InvalidInput);
}

TEST(TorchReader, RefusesLegacyFormatSayingHowToResave) {
  TempDir dir;
  Bytes legacy = {std::byte{0x80}, std::byte{0x02}, std::byte{0x8a}, std::byte{0x0a},
                  std::byte{0x6c}, std::byte{0xfc}, std::byte{0x9c}, std::byte{0x46},
                  std::byte{0xf9}, std::byte{0x20}, std::byte{0x6a}, std::byte{0xa8},
                  std::byte{0x50}, std::byte{0x19}, std::byte{'.'}};
  write_file(dir / "old.pt", legacy);
  const Failure f = failure_of([&] { import_torch(dir / "old.pt"); });
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
  EXPECT_NE(f.message.find("is a legacy (pre-1.6) torch.save file"), std::string::npos)
      << f.message;
  EXPECT_NE(f.message.find("torch.save(torch.load('" + (dir / "old.pt").string() + "'), Y)"),
            std::string::npos)
      << f.message;
}

TEST(TorchReader, GathersNonContiguousViews) {
  TempDir dir;
  // The storage as a [2, 3] matrix: [[0 1 2] [3 4 5]].
  const Tensor t = *import_zip(dir, one_view(0, {3, 2}, {1, 3})).find_initializer("w");  // .t()
  EXPECT_FALSE(t.is_mapped());
  EXPECT_EQ(t.shape(), (Shape{3, 2}));
  EXPECT_EQ(t.to_f32(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  const Tensor s =
      *import_zip(dir, one_view(1, {2, 1}, {3, 2})).find_initializer("w");  // [:, 1::2]
  EXPECT_EQ(s.to_f32(), (std::vector<float>{1, 4}));
  const Tensor b = *import_zip(dir, one_view(2, {2, 2}, {0, 1})).find_initializer("w");  // expand
  EXPECT_EQ(b.to_f32(), (std::vector<float>{2, 3, 2, 3}));
}

TEST(TorchReader, ContiguousViewWithOffsetIsAWindow) {
  TempDir dir;
  const BuiltZip zip = one_view(3, {1, 3}, {7, 1});  // w[1:]; a size-1 dim's stride is free
  const Tensor t = *import_zip(dir, zip).find_initializer("w");
  EXPECT_TRUE(t.is_mapped());
  EXPECT_EQ(t.offset(), zip.data_offsets[2] + 3 * sizeof(float));
  EXPECT_EQ(t.to_f32(), (std::vector<float>{3, 4, 5}));
}

TEST(TorchReader, CopiesMisalignedStorage) {
  TempDir dir;
  // No 64-byte padding: the storage lands wherever its header ends.
  const BuiltZip zip = one_view(0, {6}, {1}, {.align64 = false});
  ASSERT_NE(zip.data_offsets[2] % 4, 0u) << "test needs a misaligned storage";
  const Tensor t = *import_zip(dir, zip).find_initializer("w");
  EXPECT_FALSE(t.is_mapped());
  EXPECT_EQ(t.to_f32(), kSix);
}

TEST(TorchReader, RefusesViewsOutsideTheirStorage) {
  TempDir dir;
  for (const auto& [offset, size, stride] :
       std::vector<std::tuple<int64_t, std::vector<int64_t>, std::vector<int64_t>>>{
           {4, {3}, {1}}, {0, {2, 3}, {4, 1}}, {0, {2}, {int64_t{1} << 62}}, {6, {1}, {1}}}) {
    const Failure f = import_failure(dir, one_view(offset, size, stride));
    EXPECT_EQ(f.category, ErrorCategory::InvalidInput) << f.message;
    EXPECT_NE(f.message.find("reaches past the 6-element storage 'archive/data/0'"),
              std::string::npos)
        << f.message;
    EXPECT_NE(f.message.find("tensor 'w'"), std::string::npos) << f.message;
  }
}

TEST(TorchReader, RefusesMissingOrShortStorage) {
  TempDir dir;
  const auto pickle = state_dict_pickle({{"w", "FloatStorage", "0", 6, {6}}});
  const Failure missing = import_failure(dir, torch_zip("archive", pickle, {}));
  EXPECT_NE(missing.message.find("refers to storage 'archive/data/0', which the archive lacks"),
            std::string::npos)
      << missing.message;
  const Failure shrt = import_failure(dir, torch_zip("archive", pickle, {{"0", to_bytes("1234")}}));
  EXPECT_NE(shrt.message.find("holds 4 bytes but the pickle declares 24"), std::string::npos)
      << shrt.message;
}

TEST(TorchReader, TiedWeightsShareOneWindow) {
  TempDir dir;
  PickleBuilder p;
  p.proto().op(Op::EMPTY_DICT).op(Op::MARK).str("embed");
  p.tensor_v2("FloatStorage", "0", 6, 0, {2, 3}, {3, 1}).put(9).str("head").get(9);
  p.op(Op::SETITEMS).stop();
  const Graph g = import_zip(dir, torch_zip("archive", p.bytes, {{"0", to_bytes(kSix)}}));
  const Tensor* a = g.find_initializer("embed");
  const Tensor* b = g.find_initializer("head");
  EXPECT_EQ(a->storage(), b->storage());
  EXPECT_EQ(a->bytes().data(), b->bytes().data());
  EXPECT_TRUE(b->is_mapped());
}

TEST(TorchReader, FlattensNestedContainersAndSkipsOtherLeaves) {
  TempDir dir;
  PickleBuilder p;
  p.proto().op(Op::EMPTY_DICT).op(Op::MARK);
  p.str("model").op(Op::EMPTY_DICT).str("w").tensor_v2("FloatStorage", "0", 6, 0, {6}, {1});
  p.op(Op::SETITEM);
  p.str("epoch").integer(3).str("note").str("hi").str("none").op(Op::NONE);
  p.str("opt").op(Op::EMPTY_DICT).integer(0).op(Op::EMPTY_LIST).integer(5).op(Op::APPEND);
  p.tensor_v2("FloatStorage", "0", 6, 2, {2}, {1}).op(Op::APPEND).op(Op::SETITEM);
  p.op(Op::SETITEMS).stop();
  const Graph g = import_zip(dir, torch_zip("archive", p.bytes, {{"0", to_bytes(kSix)}}));
  ASSERT_EQ(g.initializers().size(), 2u);
  EXPECT_EQ(g.initializers()[0].first, "model.w");
  EXPECT_EQ(g.initializers()[1].first, "opt.0.1");
  EXPECT_EQ(g.initializers()[1].second.to_f32(), (std::vector<float>{2, 3}));
}

TEST(TorchReader, RefusesNamesThatCollideWhenFlattened) {
  TempDir dir;
  PickleBuilder p;
  p.proto().op(Op::EMPTY_DICT).op(Op::MARK).str("a.b");
  p.tensor_v2("FloatStorage", "0", 6, 0, {6}, {1}).put(1).str("a").op(Op::EMPTY_DICT).str("b");
  p.get(1).op(Op::SETITEM).op(Op::SETITEMS).stop();
  const Failure f = import_failure(dir, torch_zip("archive", p.bytes, {{"0", to_bytes(kSix)}}));
  EXPECT_NE(f.message.find("two tensors flatten to the name 'a.b'"), std::string::npos)
      << f.message;
}

TEST(TorchReader, RefusesSelfContainingAndExplodingContainers) {
  TempDir dir;
  PickleBuilder cycle;  // l = []; l.append(l)
  cycle.proto().op(Op::EMPTY_LIST).put(0).get(0).op(Op::APPEND).stop();
  const Failure c = import_failure(dir, torch_zip("archive", cycle.bytes, {}));
  EXPECT_NE(c.message.find("nested more than 64"), std::string::npos) << c.message;

  PickleBuilder dag;  // l0 = [None]; l(i+1) = [l(i), l(i)]: 2^40 paths, few objects
  dag.proto().op(Op::EMPTY_LIST).op(Op::NONE).op(Op::APPEND);
  for (int i = 0; i < 40; ++i) {
    dag.put(0).op(Op::EMPTY_LIST).get(0).op(Op::APPEND).get(0).op(Op::APPEND);
  }
  const Failure d = import_failure(dir, torch_zip("archive", dag.stop().bytes, {}));
  EXPECT_NE(d.message.find("too many shared containers"), std::string::npos) << d.message;
}

TEST(TorchReader, UnsupportedDtypesNameTheTensor) {
  TempDir dir;
  PickleBuilder p;  // _rebuild_tensor_v3 over an UntypedStorage, as torch writes uint16
  p.proto().op(Op::EMPTY_DICT).str("counts").global("torch._utils", "_rebuild_tensor_v3");
  p.op(Op::MARK).op(Op::MARK).str("storage").global("torch.storage", "UntypedStorage");
  p.str("0").str("cpu").integer(4).op(Op::TUPLE).op(Op::BINPERSID);
  p.integer(0).ints({2}).ints({1}).op(Op::NEWFALSE).op(Op::EMPTY_DICT).global("torch", "uint16");
  p.op(Op::TUPLE).op(Op::REDUCE).op(Op::SETITEM).stop();
  const Failure f = import_failure(dir, torch_zip("archive", p.bytes, {{"0", to_bytes("abcd")}}));
  EXPECT_EQ(f.category, ErrorCategory::Unsupported);
  EXPECT_NE(f.message.find("tensor 'counts'"), std::string::npos) << f.message;
  EXPECT_NE(f.message.find("torch.uint16"), std::string::npos) << f.message;
}

TEST(TorchReader, RefusesSingleTensorsAndTorchScript) {
  TempDir dir;
  PickleBuilder p;
  p.proto().tensor_v2("FloatStorage", "0", 6, 0, {6}, {1}).stop();
  const Failure single =
      import_failure(dir, torch_zip("archive", p.bytes, {{"0", to_bytes(kSix)}}));
  EXPECT_EQ(single.category, ErrorCategory::Unsupported);
  EXPECT_NE(single.message.find("single tensor"), std::string::npos) << single.message;

  const auto pickle = state_dict_pickle({});
  const Failure script =
      import_failure(dir, build_zip({{"m/data.pkl", pickle}, {"m/constants.pkl", pickle}}));
  EXPECT_EQ(script.category, ErrorCategory::Unsupported);
  EXPECT_NE(script.message.find("TorchScript"), std::string::npos) << script.message;
}

TEST(TorchReader, EmptyTensorsAndEmptyDicts) {
  TempDir dir;
  const auto pickle = state_dict_pickle({{"e", "FloatStorage", "0", 0, {0, 3}}});
  const Graph g = import_zip(dir, torch_zip("archive", pickle, {{"0", {}}}));
  EXPECT_EQ(g.find_initializer("e")->shape(), (Shape{0, 3}));
  EXPECT_EQ(g.find_initializer("e")->nbytes(), 0u);
  EXPECT_TRUE(
      import_zip(dir, torch_zip("archive", state_dict_pickle({}), {})).initializers().empty());
}

TEST(TorchReader, MissingFileIsAnIOError) {
  TempDir dir;
  EXPECT_EQ(failure_of([&] { import_torch(dir / "absent.pt"); }).category, ErrorCategory::IO);
}
