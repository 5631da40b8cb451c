// Dataset: every accepted layout, batching, extras, digests and the zero-copy path.
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "importers/dataset/dataset.h"
#include "ir/sha256.h"
#include "ir/error.h"
#include "tests/unit/importers/dataset/dataset_test_util.h"

using namespace qforge;
using namespace qforge::test;

namespace {

const std::string kSampleDir = std::string(QFORGE_SOURCE_DIR) + "/calib_data";
// sha256(np.load("calib_data/calib.npz")["input"].tobytes()), and of its first 50 samples.
constexpr const char* kCalibDigest =
    "b0f66d040db118226a0246f10d863daac72bfb77f05635d47c3536c0bd0c092b";
constexpr const char* kCalib50Digest =
    "7d328dbcfaccdd6495a3d071f9bc7fe7796f18a90a01453a40cce55c567b63f6";

ValueInfo input_info(const std::string& name, std::vector<Dim> dims, DType dtype = DType::F32) {
  ValueInfo v;
  v.name = name;
  v.dtype = dtype;
  v.shape = std::move(dims);
  return v;
}

ValueInfo sample_input() {
  return input_info("input", {Dim{std::nullopt, "batch"}, Dim{1, ""}, Dim{8, ""}, Dim{8, ""}});
}

// Every value of every batch, in order, and the batch sizes.
struct Drained {
  std::vector<float> values;
  std::vector<int64_t> sizes;
  std::vector<int64_t> labels;
};

Drained drain(Dataset& d, bool with_extras = false) {
  Drained out;
  Dataset::Feeds batch, extras;
  while (d.next(batch, with_extras ? &extras : nullptr)) {
    const Tensor& t = batch.at(0).second;
    out.sizes.push_back(t.shape()[0]);
    const auto v = t.to_f32();
    out.values.insert(out.values.end(), v.begin(), v.end());
    for (const auto& [name, x] : extras) {
      if (name == "labels") {
        const auto l = x.data<int64_t>();
        out.labels.insert(out.labels.end(), l.begin(), l.end());
      }
    }
  }
  return out;
}

std::vector<float> iota_floats(size_t n, float start = 0.0f) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

}  // namespace

TEST(Dataset, ReadsTheCompressedSampleNpzInBatches) {
  Dataset d(kSampleDir + "/calib.npz", {sample_input()}, 0, 7);
  EXPECT_EQ(d.format(), "npz");
  EXPECT_EQ(d.size(), 200);
  EXPECT_EQ(d.batch(), 7);
  EXPECT_EQ(d.extra_names(), std::vector<std::string>{"labels"});
  const Drained seven = drain(d, true);
  ASSERT_EQ(seven.sizes.size(), 29u);  // 28 batches of 7 and one of 4
  EXPECT_EQ(seven.sizes.back(), 4);
  EXPECT_EQ(seven.values.size(), 200u * 64u);
  ASSERT_EQ(seven.labels.size(), 200u);
  EXPECT_EQ((std::vector<int64_t>(seven.labels.begin(), seven.labels.begin() + 5)),
            (std::vector<int64_t>{0, 2, 7, 6, 0}));
  EXPECT_EQ(d.digest(), kCalibDigest);

  Dataset one(kSampleDir + "/calib.npz", {sample_input()}, 0, 1);
  EXPECT_EQ(drain(one).values, seven.values);
  EXPECT_EQ(one.digest(), kCalibDigest);
}

TEST(Dataset, CalibSizeLimitsThePassAndTheDigest) {
  Dataset d(kSampleDir + "/calib.npz", {sample_input()}, 50, 16);
  EXPECT_EQ(d.size(), 50);
  EXPECT_EQ(d.available(), 200);
  EXPECT_EQ(d.digest(), kCalib50Digest);  // computed by its own pass
  const Drained got = drain(d);
  EXPECT_EQ(got.sizes, (std::vector<int64_t>{16, 16, 16, 2}));
  d.rewind();
  EXPECT_EQ(drain(d).values, got.values);
}

TEST(Dataset, StoredNpzIsReadAsWindowsOfTheFile) {
  ScratchDir dir("ds_stored");
  const auto x = iota_floats(6 * 3);
  write_file(dir / "d.npz", zip({{"ab.npy", npy("<f4", {6, 3}, raw_bytes(x))}}, false));
  Dataset d(dir / "d.npz", {input_info("ab", {Dim{std::nullopt, "n"}, Dim{3, ""}})}, 0, 4);
  Dataset::Feeds batch;
  ASSERT_TRUE(d.next(batch));
  const Tensor& t = batch[0].second;
  EXPECT_EQ(t.shape(), (Shape{4, 3}));
  // The data starts 30 + 6 (local header, name) + 128 (.npy header) bytes in: aligned, no copy.
  EXPECT_TRUE(t.is_mapped());
  EXPECT_EQ(t.to_f32(), std::vector<float>(x.begin(), x.begin() + 12));
  ASSERT_TRUE(d.next(batch));
  EXPECT_EQ(batch[0].second.to_f32(), std::vector<float>(x.begin() + 12, x.end()));
  EXPECT_FALSE(d.next(batch));
  EXPECT_EQ(d.digest(), sha256_hex(raw_bytes(x)));
}

TEST(Dataset, MisalignedStoredArraysAreCopied) {
  ScratchDir dir("ds_misaligned");
  const auto x = iota_floats(8);
  // A 5-byte entry name puts the data at byte 163, not a multiple of 4.
  write_file(dir / "d.npz", zip({{"x.npy", npy("<f4", {8}, raw_bytes(x))}}, false));
  Dataset d(dir / "d.npz", {input_info("x", {Dim{std::nullopt, "n"}})}, 0, 8);
  Dataset::Feeds batch;
  ASSERT_TRUE(d.next(batch));
  EXPECT_FALSE(batch[0].second.is_mapped());
  EXPECT_EQ(batch[0].second.to_f32(), x);
}

TEST(Dataset, FolderOfPerSampleFilesBatchesAcrossFiles) {
  ScratchDir dir("ds_folder");
  std::vector<float> all;
  for (int i = 0; i < 5; ++i) {
    const auto x = iota_floats(4, static_cast<float>(10 * i));  // one sample [2, 2], no batch axis
    all.insert(all.end(), x.begin(), x.end());
    const std::vector<int64_t> label = {i};
    std::string file = "s";  // built by appending: GCC 12 warns falsely on "s" + std::string
    file += std::to_string(i);
    file += ".npz";
    write_file(dir / file, zip({{"x.npy", npy("<f4", {2, 2}, raw_bytes(x))},
                                {"labels.npy", npy("<i8", {}, raw_bytes(label))}},
                               i % 2 == 0));
  }
  write_file(dir / "README.txt", as_bytes("not data"));
  const auto info = input_info("x", {Dim{std::nullopt, "n"}, Dim{2, ""}, Dim{2, ""}});
  Dataset d(dir.path(), {info}, 0, 3);
  EXPECT_EQ(d.format(), "folder");
  EXPECT_EQ(d.size(), 5);
  const Drained got = drain(d, true);
  EXPECT_EQ(got.sizes, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(got.values, all);
  EXPECT_EQ(got.labels, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(d.digest(), sha256_hex(raw_bytes(all)));
}

TEST(Dataset, FolderOfNpyForASingleInputModel) {
  ScratchDir dir("ds_npy");
  const auto a = iota_floats(2 * 3);      // two samples with the batch axis
  const auto b = iota_floats(3, 100.0f);  // one sample without it
  write_file(dir / "a.npy", npy("<f4", {2, 3}, raw_bytes(a)));
  write_file(dir / "b.npy", npy("<f4", {3}, raw_bytes(b)));
  Dataset d(dir.path(), {input_info("in", {Dim{std::nullopt, "n"}, Dim{3, ""}})}, 0, 8);
  const Drained got = drain(d);
  EXPECT_EQ(got.sizes, std::vector<int64_t>{3});
  std::vector<float> want = a;
  want.insert(want.end(), b.begin(), b.end());
  EXPECT_EQ(got.values, want);
}

TEST(Dataset, BatchesEndWhereSampleShapesChange) {
  ScratchDir dir("ds_shapes");
  write_file(dir / "a.npy", npy("<f4", {1, 4}, raw_bytes(iota_floats(4))));
  write_file(dir / "b.npy", npy("<f4", {1, 4}, raw_bytes(iota_floats(4))));
  write_file(dir / "c.npy", npy("<f4", {1, 6}, raw_bytes(iota_floats(6))));
  Dataset d(dir.path(), {input_info("seq", {Dim{std::nullopt, "n"}, Dim{std::nullopt, "len"}})}, 0,
            8);
  EXPECT_EQ(drain(d).sizes, (std::vector<int64_t>{2, 1}));
}

TEST(Dataset, ReadsOnnxRuntimeTestDataSets) {
  ScratchDir dir("ds_pb");
  std::vector<float> all;
  for (int n = 0; n < 3; ++n) {
    const auto folder = dir / ("test_data_set_" + std::to_string(n));
    std::filesystem::create_directories(folder);
    const auto x = iota_floats(2 * 2, static_cast<float>(n));
    all.insert(all.end(), x.begin(), x.end());
    // Unnamed: input_0 is the model's first input.
    write_tensor_pb(folder / "input_0.pb", n == 1 ? "x" : "", {1, 2, 2}, x);
    write_tensor_pb(folder / "output_0.pb", "", {1, 3}, {1.0f, 2.0f, 3.0f});
  }
  const auto info = input_info("x", {Dim{std::nullopt, "n"}, Dim{2, ""}, Dim{2, ""}});
  Dataset d(dir.path(), {info}, 0, 2);
  EXPECT_EQ(d.format(), "onnx-test-data");
  EXPECT_EQ(d.extra_names(), std::vector<std::string>{"output_0"});
  const Drained got = drain(d);
  EXPECT_EQ(got.sizes, (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(got.values, all);
  // One test_data_set folder given directly.
  Dataset single(dir / "test_data_set_2", {info}, 0, 2);
  EXPECT_EQ(single.size(), 1);
}

TEST(Dataset, FixedBatchModelsGetExactBatches) {
  ScratchDir dir("ds_fixed");
  write_file(dir / "d.npz",
             zip({{"x.npy", npy("<f4", {10, 2}, raw_bytes(iota_floats(20)))}}, true));
  Dataset d(dir / "d.npz", {input_info("x", {Dim{4, ""}, Dim{2, ""}})}, 0, 3);
  EXPECT_EQ(d.batch(), 4);
  EXPECT_EQ(d.size(), 8);  // the last two samples cannot fill a batch
  EXPECT_EQ(drain(d).sizes, (std::vector<int64_t>{4, 4}));
}

TEST(Dataset, MultiInputModelsFeedEveryInputInModelOrder) {
  ScratchDir dir("ds_multi");
  const std::vector<int64_t> ids = {1, 2, 3, 4, 5, 6};
  write_file(dir / "d.npz", zip({{"mask.npy", npy("<f4", {2, 3}, raw_bytes(iota_floats(6)))},
                                 {"ids.npy", npy("<i8", {2, 3}, raw_bytes(ids))}},
                                false));
  const std::vector<Dim> dims = {Dim{std::nullopt, "b"}, Dim{std::nullopt, "s"}};
  Dataset d(dir / "d.npz", {input_info("ids", dims, DType::I64), input_info("mask", dims)}, 0, 2);
  Dataset::Feeds batch;
  ASSERT_TRUE(d.next(batch));
  ASSERT_EQ(batch.size(), 2u);
  EXPECT_EQ(batch[0].first, "ids");
  EXPECT_EQ(batch[1].first, "mask");
  EXPECT_EQ(batch[0].second.dtype(), DType::I64);
}
