// NaN and Inf in a data set's float inputs: refused by default with one line naming the file,
// the input, how many values in how many samples and the first such sample; dropped with
// BadSamples::Drop (digest and sample numbering follow the samples kept); served as they are
// with BadSamples::Keep. Integer inputs are not checked.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "importers/dataset/dataset.h"
#include "ir/error.h"
#include "ir/sha256.h"
#include "tests/unit/importers/dataset/dataset_test_util.h"

using namespace qforge;
using namespace qforge::test;

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<ValueInfo> inputs_x(int64_t width) {
  ValueInfo v;
  v.name = "x";
  v.dtype = DType::F32;
  v.shape = std::vector<Dim>{Dim{std::nullopt, "N"}, Dim{width, ""}};
  return {v};
}

// `rows` samples of 3 values each, sample r holding r + 0.5; `bad` lists (sample, column, value).
std::vector<float> samples(int rows, const std::vector<std::tuple<int, int, float>>& bad) {
  std::vector<float> x;
  for (int r = 0; r < rows; ++r) x.insert(x.end(), 3, static_cast<float>(r) + 0.5f);
  for (const auto& [r, c, v] : bad) x[static_cast<size_t>(3 * r + c)] = v;
  return x;
}

std::filesystem::path write_npz(const ScratchDir& dir, const std::string& name,
                                const std::vector<float>& x) {
  const auto rows = static_cast<int64_t>(x.size() / 3);
  write_file(dir / name, zip({{"x.npy", npy("<f4", {rows, 3}, raw_bytes(x))}}, false));
  return dir / name;
}

std::string refusal(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::InvalidInput) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "accepted NaN or Inf";
  return "";
}

// Every value served in one pass, and the first value of each sample.
std::vector<float> firsts(Dataset& d) {
  std::vector<float> out;
  Dataset::Feeds batch;
  d.rewind();
  while (d.next(batch)) {
    const std::vector<float> v = batch[0].second.to_f32();
    for (size_t i = 0; i < v.size(); i += 3) out.push_back(v[i]);
  }
  return out;
}

}  // namespace

TEST(DatasetBadSamples, RefusedNamingFileInputCountAndFirstSample) {
  ScratchDir dir("bad_refuse");
  struct Case {
    std::string what;
    std::vector<std::tuple<int, int, float>> bad;
    std::string counts;  // "N NaN or Inf value(s) in S of 8 samples"
    int first;
  };
  const std::vector<Case> cases = {
      {"one Inf", {{5, 1, kInf}}, "1 NaN or Inf value(s) in 1 of 8 samples", 5},
      {"a few NaN",
       {{2, 0, kNaN}, {2, 2, kNaN}, {6, 1, -kInf}},
       "3 NaN or Inf value(s) in 2 of 8",
       2},
  };
  for (const Case& c : cases) {
    const auto path = write_npz(dir, "d.npz", samples(8, c.bad));
    for (int64_t batch : {1, 3, 8}) {
      Dataset d(path, inputs_x(3), 0, batch);
      const std::string msg = refusal([&] { firsts(d); });
      EXPECT_NE(msg.find("calibration data '" + path.string() + "'"), std::string::npos) << msg;
      EXPECT_NE(msg.find("input 'x'"), std::string::npos) << msg;
      EXPECT_NE(msg.find(c.counts), std::string::npos) << c.what << ": " << msg;
      EXPECT_NE(msg.find("the first at sample " + std::to_string(c.first) + ";"), std::string::npos)
          << msg;
      EXPECT_NE(msg.find("--drop-bad-samples"), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
  }
  std::vector<float> all_nan(12, kNaN);
  const auto path = write_npz(dir, "nan.npz", all_nan);
  Dataset d(path, inputs_x(3), 0, 2);
  const std::string msg = refusal([&] { firsts(d); });
  EXPECT_NE(msg.find("12 NaN or Inf value(s) in 4 of 4 samples, the first at sample 0"),
            std::string::npos)
      << msg;
}

TEST(DatasetBadSamples, OnlyTheSamplesServedAreChecked) {
  ScratchDir dir("bad_served");
  const auto path = write_npz(dir, "d.npz", samples(8, {{6, 0, kNaN}}));
  Dataset d(path, inputs_x(3), 4, 2);  // --calib-size 4: sample 6 is never read
  EXPECT_EQ(firsts(d), (std::vector<float>{0.5f, 1.5f, 2.5f, 3.5f}));
}

TEST(DatasetBadSamples, InAFolderTheFileIsNamedWithItsOwnRow) {
  ScratchDir dir("bad_folder");
  write_npz(dir, "a.npz", samples(3, {}));
  const auto b = write_npz(dir, "b.npz", samples(3, {{1, 2, kInf}}));
  Dataset d(dir.path(), inputs_x(3), 0, 4);
  const std::string msg = refusal([&] { firsts(d); });
  EXPECT_NE(msg.find("calibration data '" + b.string() + "': input 'x' holds 1 NaN or Inf"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("the first at sample 1 of this file"), std::string::npos) << msg;
}

TEST(DatasetBadSamples, DropSkipsThemAndCountsTheRestAsTheDataSet) {
  ScratchDir dir("bad_drop");
  const auto path =
      write_npz(dir, "d.npz", samples(8, {{0, 0, kNaN}, {3, 1, kInf}, {4, 2, -kInf}}));
  const auto clean = write_npz(dir, "clean.npz",
                               [] {
                                 std::vector<float> x;
                                 for (int r : {1, 2, 5, 6, 7})
                                   x.insert(x.end(), 3, static_cast<float>(r) + 0.5f);
                                 return x;
                               }());
  for (int64_t batch : {1, 2, 8}) {
    Dataset d(path, inputs_x(3), 0, batch, "calibration data", BadSamples::Drop);
    EXPECT_EQ(d.size(), 5);
    EXPECT_EQ(d.dropped(), 3);
    EXPECT_EQ(firsts(d), (std::vector<float>{1.5f, 2.5f, 5.5f, 6.5f, 7.5f})) << batch;
    Dataset c(clean, inputs_x(3), 0, 3);
    EXPECT_EQ(d.digest(), c.digest()) << "the digest covers the samples kept, batch " << batch;
    // Served sample 2 is the file's sample 5.
    EXPECT_EQ(d.sample_origin(2), "calibration data '" + path.string() + "' sample 5");
  }
  // --calib-size counts the samples kept.
  Dataset two(path, inputs_x(3), 2, 2, "calibration data", BadSamples::Drop);
  EXPECT_EQ(two.size(), 2);
  EXPECT_EQ(two.dropped(), 1) << "only sample 0 lies before the two kept";
  EXPECT_EQ(firsts(two), (std::vector<float>{1.5f, 2.5f}));
}

TEST(DatasetBadSamples, DropFailsWhenNoneIsLeft) {
  ScratchDir dir("bad_none");
  const auto path = write_npz(dir, "nan.npz", std::vector<float>(9, kNaN));
  const std::string msg = refusal(
      [&] { Dataset d(path, inputs_x(3), 0, 2, "calibration data", BadSamples::Drop); });
  EXPECT_NE(msg.find("all 3 sample(s) hold NaN or Inf"), std::string::npos) << msg;
  EXPECT_NE(msg.find(path.string()), std::string::npos) << msg;
}

TEST(DatasetBadSamples, KeepServesThemAsRead) {
  ScratchDir dir("bad_keep");
  const auto path = write_npz(dir, "d.npz", samples(2, {{1, 0, kNaN}}));
  Dataset d(path, inputs_x(3), 0, 2, "input data", BadSamples::Keep);
  const std::vector<float> v = firsts(d);
  ASSERT_EQ(v.size(), 2u);
  EXPECT_TRUE(std::isnan(v[1]));
}
