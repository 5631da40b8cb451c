// Calibration counts only real tokens: TokenMask, resolve_mask_input, and calibrate() /
// observe_dataset() on batches whose padded positions hold values that would dominate.
#include "quant/calib/token_mask.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <cstdint>
#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ir/batch_source.h"
#include "ir/error.h"
#include "quant/calib/calibration.h"
#include "quant/calib/length_order.h"
#include "quant/calib/model_comparison.h"
#include "runtime/executor.h"

using namespace qforge;

namespace {

constexpr int64_t kHidden = 3;

// y = Relu(x) * 2 over x [batch, seq, 3]; the mask input is fed but unused, as in a model whose
// attention reads it elsewhere.
Graph token_graph() {
  Graph g;
  const std::vector<Dim> bs{Dim{std::nullopt, "batch"}, Dim{std::nullopt, "seq"}};
  std::vector<Dim> xs = bs;
  xs.push_back(Dim{kHidden, ""});
  g.inputs.push_back({"x", DType::F32, xs, ""});
  g.inputs.push_back({"attention_mask", DType::I64, bs, ""});
  g.outputs.push_back({"y", DType::F32, std::nullopt, ""});
  g.set_initializer("two", Tensor::from_f32(std::vector<float>{2.0f}, {}));
  g.nodes.push_back(Node{"relu", "Relu", "", {"x"}, {"r"}, {}, ""});
  g.nodes.push_back(Node{"mul", "Mul", "", {"r", "two"}, {"y"}, {}, ""});
  g.set_opset("", 17);
  return g;
}

// One batch of `rows` sequences of length `seq`: sequence b has `lengths[b]` real tokens, padded
// on the left when `left`; real positions hold small values, padded ones `pad_value`.
BatchSource::Feeds batch_of(const std::vector<int64_t>& lengths, int64_t seq, bool left,
                            float pad_value, float scale) {
  const auto rows = static_cast<int64_t>(lengths.size());
  Tensor x(DType::F32, {rows, seq, kHidden});
  Tensor m(DType::I64, {rows, seq});
  auto xv = x.mutable_data<float>();
  auto mv = m.mutable_data<int64_t>();
  for (int64_t b = 0; b < rows; ++b) {
    for (int64_t s = 0; s < seq; ++s) {
      const int64_t pos = left ? s - (seq - lengths[static_cast<size_t>(b)]) : s;
      const bool real = pos >= 0 && pos < lengths[static_cast<size_t>(b)];
      mv[static_cast<size_t>(b * seq + s)] = real ? 1 : 0;
      for (int64_t c = 0; c < kHidden; ++c) {
        xv[static_cast<size_t>((b * seq + s) * kHidden + c)] =
            real ? scale * static_cast<float>((pos + 1) * (c + 1)) * (c == 1 ? -1.0f : 1.0f)
                 : pad_value;
      }
    }
  }
  return {{"x", x}, {"attention_mask", m}};
}

CalibrationTable calibrate_on(BatchSource& data, const std::string& mask, CalibMethod method) {
  CalibOptions o;
  o.method = method;
  o.device = Device::Cpu;
  o.threads = 1;
  o.mask_input = mask;
  PassReport report;
  return calibrate(token_graph(), data, o, report);
}

}  // namespace

TEST(TokenMask, RealRowsKeepsOnlyRealPositionsInOrder) {
  const auto feeds = batch_of({2, 1}, 3, false, 99.0f, 1.0f);
  const TokenMask mask(feeds, "attention_mask");
  EXPECT_EQ(mask.batch(), 2);
  EXPECT_EQ(mask.seq(), 3);
  EXPECT_EQ(mask.real(), 3);
  EXPECT_FALSE(mask.all_real());
  ASSERT_TRUE(mask.covers(feeds[0].second));
  EXPECT_FALSE(mask.covers(Tensor(DType::F32, {2, 4, 3}))) << "another seq length";
  EXPECT_FALSE(mask.covers(Tensor(DType::F32, {2}))) << "rank 1";
  const Tensor rows = mask.real_rows(feeds[0].second);
  ASSERT_EQ(rows.shape(), (Shape{3, kHidden}));
  const std::vector<float> want = {1, -2, 3, 2, -4, 6, 1, -2, 3};  // (0,0) (0,1) (1,0)
  EXPECT_EQ(rows.to_f32(), want);
}

// real_spans: the real rows where they lie, one span per run of real positions; laid end to
// end they are real_rows' values.
TEST(TokenMask, RealSpansAreTheRealRowsWhereTheyLie) {
  const auto feeds = batch_of({2, 3, 1}, 3, false, 99.0f, 1.0f);
  const TokenMask mask(feeds, "attention_mask");
  const Tensor& value = feeds[0].second;
  const std::vector<std::span<const float>> spans = mask.real_spans(value);
  // Real positions (0,0) (0,1), padding, (1,0) (1,1) (1,2) (2,0), padding: two runs.
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(spans[0].data(), value.data<float>().data());
  EXPECT_EQ(spans[0].size(), static_cast<size_t>(2 * kHidden));
  EXPECT_EQ(spans[1].data(), value.data<float>().data() + 3 * kHidden);
  EXPECT_EQ(spans[1].size(), static_cast<size_t>(4 * kHidden)) << "row 1 and row 2's first adjoin";
  std::vector<float> joined;
  for (const auto& s : spans) joined.insert(joined.end(), s.begin(), s.end());
  EXPECT_EQ(joined, mask.real_rows(value).to_f32());
}

TEST(TokenMask, RealRowsReuseAScratchNothingElseHolds) {
  const auto first = batch_of({2, 1}, 3, false, 99.0f, 1.0f);
  const auto second = batch_of({1, 1}, 3, false, 99.0f, 10.0f);
  const TokenMask mask1(first, "attention_mask");
  const TokenMask mask2(second, "attention_mask");
  std::shared_ptr<OwnedStorage> scratch;
  const std::byte* reused = nullptr;
  {
    const Tensor rows = mask1.real_rows(first[0].second, scratch);
    EXPECT_EQ(rows.to_f32(), mask1.real_rows(first[0].second).to_f32());
    reused = rows.bytes().data();
  }
  // Dropped: the next call writes into the same storage, and gives the smaller shape.
  const Tensor kept = mask2.real_rows(second[0].second, scratch);
  EXPECT_EQ(kept.bytes().data(), reused);
  ASSERT_EQ(kept.shape(), (Shape{2, kHidden}));
  EXPECT_EQ(kept.to_f32(), (std::vector<float>{10, -20, 30, 10, -20, 30}));
  // Kept by the caller: the next call takes new storage and leaves the kept values alone.
  const Tensor next = mask1.real_rows(first[0].second, scratch);
  EXPECT_NE(next.bytes().data(), kept.bytes().data());
  EXPECT_EQ(kept.to_f32(), (std::vector<float>{10, -20, 30, 10, -20, 30}));
  EXPECT_EQ(next.to_f32(), (std::vector<float>{1, -2, 3, 2, -4, 6, 1, -2, 3}));
}

TEST(TokenMask, RefusesAMaskThatIsNotBatchBySeq) {
  BatchSource::Feeds feeds = {{"attention_mask", Tensor(DType::I64, {2, 3, 1})}};
  try {
    TokenMask m(feeds, "attention_mask");
    FAIL() << "a rank-3 mask was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::InvalidInput);
    EXPECT_NE(std::string(e.what()).find("'attention_mask'"), std::string::npos) << e.what();
  }
}

TEST(TokenMask, ResolvesTheMaskInputByName) {
  const Graph g = token_graph();
  EXPECT_EQ(resolve_mask_input(g, "auto"), "attention_mask");
  EXPECT_EQ(resolve_mask_input(g, "none"), "");
  EXPECT_EQ(resolve_mask_input(g, "attention_mask"), "attention_mask");
  try {
    resolve_mask_input(g, "input_mask");
    FAIL() << "an input the model lacks was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::Usage);
    EXPECT_NE(std::string(e.what()).find("x, attention_mask"), std::string::npos) << e.what();
  }
  Graph no_mask = token_graph();
  no_mask.inputs.pop_back();
  EXPECT_EQ(resolve_mask_input(no_mask, "auto"), "") << "auto without the input is no mask";
}

// The same sequences padded to 4, to 16 (left) and to 16 (right) calibrate to the same ranges
// with the mask, bit for bit, for every method; without it the padding's 50 takes over.
TEST(CalibrateWithMask, PaddingDoesNotChangeTheRanges) {
  const std::vector<int64_t> lengths = {4, 2, 3};
  for (const CalibMethod method :
       {CalibMethod::MinMax, CalibMethod::Percentile, CalibMethod::Entropy, CalibMethod::Mse}) {
    MemoryBatches tight({batch_of(lengths, 4, false, 50.0f, 0.25f)});
    MemoryBatches right({batch_of(lengths, 16, false, 50.0f, 0.25f)});
    MemoryBatches left({batch_of(lengths, 16, true, 50.0f, 0.25f)});
    const CalibrationTable a = calibrate_on(tight, "attention_mask", method);
    const CalibrationTable b = calibrate_on(right, "attention_mask", method);
    const CalibrationTable c = calibrate_on(left, "attention_mask", method);
    ASSERT_EQ(a.ranges.count("y"), 1u);
    for (const auto& [name, r] : a.ranges) {
      const std::string what = std::string(calib_method_name(method)) + " " + name;
      EXPECT_EQ(std::bit_cast<uint32_t>(r.amax), std::bit_cast<uint32_t>(b.ranges.at(name).amax))
          << what << " right-padded";
      EXPECT_EQ(std::bit_cast<uint32_t>(r.amax), std::bit_cast<uint32_t>(c.ranges.at(name).amax))
          << what << " left-padded";
      EXPECT_EQ(r.max, c.ranges.at(name).max) << what;
      EXPECT_LT(r.max, 50.0f) << what;
    }
    MemoryBatches unmasked({batch_of(lengths, 16, false, 50.0f, 0.25f)});
    EXPECT_EQ(calibrate_on(unmasked, "", method).ranges.at("y").max, 100.0f)
        << calib_method_name(method) << ": without the mask the padding is counted";
  }
}

// AWQ's and GPTQ's run: observers see [real, hidden] rows of [batch, seq, hidden] values (a
// batch whose trailing padding was cut to nothing padded keeps its layout), and values of
// other layouts whole.
TEST(CalibrateWithMask, ObserversSeeOnlyRealRows) {
  MemoryBatches data({batch_of({4, 1}, 6, true, 7.0f, 1.0f), batch_of({2}, 6, false, 7.0f, 1.0f)});
  std::map<std::string, std::vector<int64_t>> rows;  // positions seen per batch
  const auto positions = [](const Tensor& v) { return static_cast<int64_t>(v.numel()) / kHidden; };
  observe_dataset(token_graph(), data, 1, "attention_mask",
                  [&](const std::string& name, const Tensor& value) {
                    rows[name].push_back(positions(value));
                    if (name == "x") {
                      for (float v : value.to_f32()) EXPECT_NE(v, 7.0f) << "a padded value";
                    }
                  });
  EXPECT_EQ(rows["x"], (std::vector<int64_t>{5, 2}));
  EXPECT_EQ(rows["y"], (std::vector<int64_t>{5, 2}));
  rows.clear();
  observe_dataset(token_graph(), data, 1, "", [&](const std::string& name, const Tensor& v) {
    rows[name].push_back(positions(v));
  });
  EXPECT_EQ(rows["x"], (std::vector<int64_t>{12, 6})) << "no mask: whole batches";
}

TEST(TokenMask, UsedLengthIsOnePastTheLastRealPosition) {
  EXPECT_EQ(TokenMask(batch_of({2, 1}, 5, false, 9.0f, 1.0f), "attention_mask").used_length(), 2);
  EXPECT_EQ(TokenMask(batch_of({1, 3}, 5, false, 9.0f, 1.0f), "attention_mask").used_length(), 3);
  EXPECT_EQ(TokenMask(batch_of({2, 1}, 5, true, 9.0f, 1.0f), "attention_mask").used_length(), 5)
      << "left padding ends every row in a real token";
  EXPECT_EQ(TokenMask(batch_of({0, 0}, 4, false, 9.0f, 1.0f), "attention_mask").used_length(), 0);
}

TEST(SequenceAxes, FollowTheMasksNamedSequenceDim) {
  Graph g = token_graph();
  // position_ids [seq] and a [batch, seq] ids input named the same: found on their axes.
  g.inputs.push_back({"position_ids", DType::I64, std::vector<Dim>{Dim{std::nullopt, "seq"}}, ""});
  g.inputs.push_back({"heads", DType::F32, std::vector<Dim>{Dim{std::nullopt, "batch"},
                                                            Dim{std::nullopt, "heads"}}, ""});
  std::vector<std::pair<std::string, size_t>> got;
  for (const SequenceAxis& a : sequence_axes(g.inputs, "attention_mask")) {
    got.emplace_back(a.input, a.axis);
  }
  const std::vector<std::pair<std::string, size_t>> want = {
      {"x", 1}, {"attention_mask", 1}, {"position_ids", 0}};
  EXPECT_EQ(got, want);
  EXPECT_TRUE(sequence_axes(g.inputs, "").empty()) << "no mask";
  EXPECT_TRUE(sequence_axes(g.inputs, "x").empty()) << "not a [batch, seq] mask";

  Graph fixed = token_graph();
  (*fixed.inputs[1].shape)[1] = Dim{16, ""};
  EXPECT_TRUE(sequence_axes(fixed.inputs, "attention_mask").empty()) << "a fixed length";
  Graph unnamed = token_graph();
  (*unnamed.inputs[1].shape)[1] = Dim{std::nullopt, ""};
  EXPECT_TRUE(sequence_axes(unnamed.inputs, "attention_mask").empty()) << "an unnamed length";
  Graph alone = token_graph();  // a decoder's mask over past and new tokens, named apart
  (*alone.inputs[0].shape)[1] = Dim{std::nullopt, "new_tokens"};
  EXPECT_TRUE(sequence_axes(alone.inputs, "attention_mask").empty()) << "the mask alone";
  Graph twice = token_graph();
  twice.inputs.push_back({"pair_bias", DType::F32,
                          std::vector<Dim>{Dim{std::nullopt, "seq"}, Dim{std::nullopt, "seq"}},
                          ""});
  EXPECT_TRUE(sequence_axes(twice.inputs, "attention_mask").empty()) << "seq on two axes";
}

TEST(CutTrailingPadding, KeepsEachRowsFirstPositionsAndLeavesTheFedTensorsAlone) {
  const Graph g = token_graph();
  const std::vector<SequenceAxis> axes = sequence_axes(g.inputs, "attention_mask");
  const auto fed = batch_of({2, 1}, 4, false, 9.0f, 1.0f);
  const TokenMask mask(fed, "attention_mask");
  const std::vector<float> x_before = fed[0].second.to_f32();
  auto batch = fed;
  ASSERT_EQ(cut_trailing_padding(batch, axes, mask), 2);
  ASSERT_EQ(batch[0].second.shape(), (Shape{2, 2, kHidden}));
  ASSERT_EQ(batch[1].second.shape(), (Shape{2, 2}));
  EXPECT_EQ(batch[0].second.to_f32(), (std::vector<float>{1, -2, 3, 2, -4, 6, 1, -2, 3,
                                                          9, 9, 9}));
  EXPECT_EQ(batch[1].second.to_f32(), (std::vector<float>{1, 1, 1, 0}));
  EXPECT_EQ(fed[0].second.to_f32(), x_before) << "the fed tensor was written";
  EXPECT_EQ(fed[0].second.shape(), (Shape{2, 4, kHidden}));

  auto left = batch_of({2, 1}, 4, true, 9.0f, 1.0f);
  EXPECT_EQ(cut_trailing_padding(left, axes, TokenMask(left, "attention_mask")), 0)
      << "nothing trails";
  auto empty = batch_of({0, 0}, 4, false, 9.0f, 1.0f);
  EXPECT_EQ(cut_trailing_padding(empty, axes, TokenMask(empty, "attention_mask")), 3)
      << "one position kept";
  EXPECT_EQ(empty[0].second.shape(), (Shape{2, 1, kHidden}));

  auto other = fed;
  other[0].second = Tensor(DType::F32, {2, 3, kHidden});  // x disagrees with the mask
  EXPECT_EQ(cut_trailing_padding(other, axes, mask), 0);
  EXPECT_EQ(other[1].second.shape(), (Shape{2, 4})) << "cut in part";
  auto unnamed = fed;  // a token input the graph names apart from the mask's sequence
  unnamed.emplace_back("input_ids", Tensor(DType::I64, {2, 4}));
  EXPECT_EQ(cut_trailing_padding(unnamed, axes, mask), 0);
  EXPECT_EQ(unnamed[0].second.shape(), (Shape{2, 4, kHidden}));
}

// Calibration runs each batch only as long as its longest sequence: a Shape node sees the
// length the model ran at. Left padding and a graph of one fixed length run whole.
TEST(CalibrateWithMask, BatchesRunOnlyAsLongAsTheirLongestSequence) {
  const auto run_lengths = [](const Graph& g, MemoryBatches& data) {
    std::vector<std::vector<int64_t>> shapes;
    observe_dataset(g, data, 1, "attention_mask",
                    [&shapes](const std::string& name, const Tensor& value) {
                      if (name != "xs") return;
                      const auto v = value.data<int64_t>();
                      shapes.emplace_back(v.begin(), v.end());
                    });
    return shapes;
  };
  Graph g = token_graph();
  g.nodes.push_back(Node{"shape", "Shape", "", {"x"}, {"xs"}, {}, ""});
  MemoryBatches data({batch_of({2, 1}, 6, false, 7.0f, 1.0f), batch_of({2, 1}, 6, true, 7.0f, 1.0f),
                      batch_of({0}, 6, false, 7.0f, 1.0f)});
  const std::vector<std::vector<int64_t>> cut = {{2, 2, kHidden}, {2, 6, kHidden},
                                                 {1, 1, kHidden}};
  EXPECT_EQ(run_lengths(g, data), cut);
  Graph fixed = g;
  for (int i : {0, 1}) (*fixed.inputs[static_cast<size_t>(i)].shape)[1] = Dim{6, ""};
  const std::vector<std::vector<int64_t>> whole = {{2, 6, kHidden}, {2, 6, kHidden},
                                                   {1, 6, kHidden}};
  EXPECT_EQ(run_lengths(fixed, data), whole);
}

// compare over real tokens: a "quantized" graph that differs from the float one only at padded
// positions (ReLU of negative padding) compares as identical with the mask, not without.
TEST(CompareWithMask, PaddedPositionsDoNotCount) {
  Graph ref = token_graph();
  ref.nodes.front() = Node{"id", "Identity", "", {"x"}, {"r"}, {}, ""};
  const Graph quant = token_graph();
  auto feeds = batch_of({3, 1}, 5, true, -5.0f, 1.0f);
  for (float& v : feeds[0].second.mutable_data<float>()) v = v == -5.0f ? -5.0f : std::abs(v);
  for (const bool masked : {true, false}) {
    MemoryBatches data({feeds});
    ModelCompareOptions o;
    o.threads = 1;
    o.mask_input = masked ? "attention_mask" : "";
    const ModelComparison c = compare_models(ref, quant, data, o);
    ASSERT_EQ(c.outputs.size(), 1u);
    if (masked) {
      EXPECT_EQ(c.outputs[0].error.sqnr_db(), std::numeric_limits<double>::infinity());
      EXPECT_EQ(c.outputs[0].error.cosine(), 1.0);
    } else {
      EXPECT_LT(c.outputs[0].error.sqnr_db(), 20.0) << "padding counted without the mask";
    }
  }
}

namespace {

// The sample number at the end of MemoryBatches' "samples in memory sample N".
int64_t origin_number(const std::string& origin) {
  return std::stoll(origin.substr(origin.rfind(' ') + 1));
}

// Each sample's rows of every feed, one byte string per sample, in data-set order.
std::vector<std::string> sample_bytes(const std::vector<BatchSource::Feeds>& batches) {
  std::vector<std::string> out;
  for (const BatchSource::Feeds& feeds : batches) {
    const int64_t rows = feeds.front().second.shape()[0];
    for (int64_t r = 0; r < rows; ++r) {
      std::string one;
      for (const auto& [name, t] : feeds) {
        const size_t row = t.nbytes() / static_cast<size_t>(rows);
        const auto* p = reinterpret_cast<const char*>(t.bytes().data());
        one.append(p + static_cast<size_t>(r) * row, row);
      }
      out.push_back(one);
    }
  }
  return out;
}

}  // namespace

// Batches of like lengths: every sample once per pass, as it was, in batches of the source's
// size; within a window the shortest first (ties in data-set order), samples of another shape
// after those of the first; sample_origin names the source's sample; the digest is the
// source's. A window of one source batch sorts within it alone.
TEST(LengthOrderedBatches, ServesEverySampleOnceShortestFirstInBatchesOfTheSourcesSize) {
  const std::vector<BatchSource::Feeds> source = {
      batch_of({1, 3}, 4, false, 9.0f, 1.0f), batch_of({4, 2}, 4, false, 9.0f, 2.0f),
      batch_of({5, 1}, 6, false, 9.0f, 3.0f), batch_of({3}, 4, false, 9.0f, 4.0f)};
  const std::vector<std::string> want_bytes = sample_bytes(source);
  const struct {
    int64_t window;
    std::vector<int64_t> origins;  // served order
    std::vector<int64_t> sizes;    // batch sizes
  } cases[] = {
      // One window: seq 4 (lengths 1 3 4 2 3 at 0 1 2 3 6), then seq 6 (5 1 at 4 5).
      {LengthOrderedBatches::kWindowBytes, {0, 3, 1, 6, 2, 5, 4}, {2, 2, 1, 2}},
      // A window per source batch.
      {1, {0, 1, 3, 2, 5, 4, 6}, {2, 2, 2, 1}},
  };
  for (const auto& c : cases) {
    MemoryBatches data(source);
    LengthOrderedBatches ordered(data, "attention_mask", c.window);
    EXPECT_EQ(ordered.size(), 7);
    EXPECT_EQ(ordered.digest(), data.digest());
    for (int pass = 0; pass < 2; ++pass) {
      ordered.rewind();
      std::vector<int64_t> origins, sizes;
      BatchSource::Feeds batch;
      while (ordered.next(batch)) {
        ASSERT_EQ(batch.size(), 2u);
        EXPECT_EQ(batch[0].first, "x");
        EXPECT_EQ(batch[1].first, "attention_mask");
        const int64_t n = batch[0].second.shape()[0];
        const std::vector<std::string> got = sample_bytes({batch});
        for (int64_t i = 0; i < n; ++i) {
          const auto served = static_cast<int64_t>(origins.size());
          const int64_t from = origin_number(ordered.sample_origin(served));
          ASSERT_GE(from, 0);
          ASSERT_LT(from, 7);
          EXPECT_EQ(got[static_cast<size_t>(i)], want_bytes[static_cast<size_t>(from)])
              << "served sample " << served << " is not source sample " << from << " as it was";
          origins.push_back(from);
        }
        sizes.push_back(n);
      }
      EXPECT_EQ(origins, c.origins) << "window " << c.window << ", pass " << pass;
      EXPECT_EQ(sizes, c.sizes) << "window " << c.window << ", pass " << pass;
    }
  }
}

// calibrate() takes token batches in like lengths: a value the mask does not cover ([batch,
// hidden] sums over the run positions, padding included) gets the same range whatever the
// order of the lengths in the data set, bit for bit, every method; here the padding that
// order saves is what the range would otherwise hold (a one-token sequence next to a
// four-token one runs three padded positions of 50).
TEST(CalibrateWithMask, RangesDoNotDependOnTheOrderOfLengths) {
  Graph g = token_graph();
  Tensor axis(DType::I64, {1});
  axis.mutable_data<int64_t>()[0] = 1;
  g.set_initializer("seq_axis", axis);
  Attribute keep{.name = "keepdims", .type = AttrType::Int, .i = 0};
  g.nodes.push_back(Node{"sum", "ReduceSum", "", {"x", "seq_axis"}, {"s"}, {keep}, ""});
  g.outputs.push_back({"s", DType::F32, std::nullopt, ""});
  const auto table = [&g](MemoryBatches& data, CalibMethod method) {
    CalibOptions o;
    o.method = method;
    o.device = Device::Cpu;
    o.threads = 1;
    o.mask_input = "attention_mask";
    PassReport report;
    return calibrate(g, data, o, report);
  };
  for (const CalibMethod method :
       {CalibMethod::MinMax, CalibMethod::Percentile, CalibMethod::Entropy, CalibMethod::Mse}) {
    MemoryBatches mixed({batch_of({1, 4}, 6, false, 50.0f, 0.25f),
                         batch_of({4, 1}, 6, false, 50.0f, 0.25f)});
    MemoryBatches sorted({batch_of({4, 4}, 6, false, 50.0f, 0.25f),
                          batch_of({1, 1}, 6, false, 50.0f, 0.25f)});
    const CalibrationTable a = table(mixed, method);
    const CalibrationTable b = table(sorted, method);
    const std::string what(calib_method_name(method));
    ASSERT_EQ(a.ranges.count("s"), 1u) << what;
    EXPECT_LT(a.ranges.at("s").max, 50.0f) << what << ": the padding's sums are not in the range";
    ASSERT_EQ(a.ranges.size(), b.ranges.size()) << what;
    for (const auto& [name, r] : a.ranges) {
      EXPECT_EQ(std::bit_cast<uint32_t>(r.amax), std::bit_cast<uint32_t>(b.ranges.at(name).amax))
          << what << " " << name;
      EXPECT_EQ(std::bit_cast<uint32_t>(r.min), std::bit_cast<uint32_t>(b.ranges.at(name).min))
          << what << " " << name;
      EXPECT_EQ(std::bit_cast<uint32_t>(r.max), std::bit_cast<uint32_t>(b.ranges.at(name).max))
          << what << " " << name;
    }
  }
}

// Batches of like lengths where calibration cuts batches to their longest sequence and the
// graph takes any batch size; not without a mask, with a fixed sequence dim or a fixed batch.
TEST(LengthOrderedBatches, OnlyWhereBatchesAreCutAndTheirSizeIsFree) {
  const Graph g = token_graph();
  EXPECT_TRUE(orders_by_length(g.inputs, "attention_mask"));
  EXPECT_FALSE(orders_by_length(g.inputs, "")) << "no mask";
  Graph fixed_seq = g;
  for (int i : {0, 1}) (*fixed_seq.inputs[static_cast<size_t>(i)].shape)[1] = Dim{6, ""};
  EXPECT_FALSE(orders_by_length(fixed_seq.inputs, "attention_mask")) << "fixed sequence";
  Graph fixed_batch = g;
  for (int i : {0, 1}) (*fixed_batch.inputs[static_cast<size_t>(i)].shape)[0] = Dim{2, ""};
  EXPECT_FALSE(orders_by_length(fixed_batch.inputs, "attention_mask")) << "fixed batch";
}
