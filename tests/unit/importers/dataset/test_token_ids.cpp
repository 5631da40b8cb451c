#include "importers/dataset/token_ids.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "tests/unit/importers/dataset/dataset_test_util.h"
#include "ir/error.h"
#include "tests/unit/temp_dir.h"

namespace qforge {
namespace {

using test::npy;
using test::raw_bytes;
using test::TempDir;
using test::write_file;
using test::zip;

void write_text(const std::filesystem::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary);
  f << s;
}

// The message of the Error `fn` throws, with its category checked.
template <typename Fn>
std::string error_of(Fn fn, ErrorCategory category = ErrorCategory::InvalidInput) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), category) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TokenIdTable jsonl(const std::string& text, TokenIdOptions o = {}) {
  return parse_token_ids_jsonl(text, "calibration data 'ids.jsonl'", o);
}

TEST(TokenIds, JsonlRowsArePaddedOnTheRight) {
  const TokenIdTable t = jsonl("{\"input_ids\": [5, 6, 7]}\n\n{\"input_ids\": [8]}\n");
  EXPECT_EQ(t.rows, 2);
  EXPECT_EQ(t.seq, 3);
  EXPECT_EQ(t.ids, (std::vector<int64_t>{5, 6, 7, 8, 0, 0}));
  EXPECT_EQ(t.mask, (std::vector<int64_t>{1, 1, 1, 1, 0, 0}));
  EXPECT_EQ(t.origin, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(t.real_tokens, 4);
}

TEST(TokenIds, SeqLenCutsAndCalibSizeTakesTheFirstRows) {
  TokenIdOptions o;
  o.seq_len = 2;
  o.calib_size = 2;
  // The third line is never parsed.
  const TokenIdTable t =
      jsonl("{\"input_ids\": [1, 2, 3, 4]}\n{\"input_ids\": [9]}\nnot json\n", o);
  EXPECT_EQ(t.rows, 2);
  EXPECT_EQ(t.seq, 2);
  EXPECT_EQ(t.ids, (std::vector<int64_t>{1, 2, 9, 0}));
  EXPECT_EQ(t.mask, (std::vector<int64_t>{1, 1, 1, 0}));
}

TEST(TokenIds, LeftPaddingIsMovedToTheRight) {
  const TokenIdTable t = jsonl(
      "{\"input_ids\": [0, 0, 4, 5], \"attention_mask\": [0, 0, 1, 1]}\n"
      "{\"input_ids\": [3, 7, 2, 9], \"attention_mask\": [1, 0, 1, 1]}\n");
  EXPECT_EQ(t.seq, 4);
  EXPECT_EQ(t.ids, (std::vector<int64_t>{4, 5, 0, 0, 3, 0, 2, 9}));
  EXPECT_EQ(t.mask, (std::vector<int64_t>{1, 1, 0, 0, 1, 0, 1, 1}));
}

TEST(TokenIds, JsonlErrorsNameTheLineAndWhatToDo) {
  EXPECT_NE(error_of([] { jsonl("{\"input_ids\": [1]}\n{\"input_ids\": [3, -1]}\n"); })
                .find("'ids.jsonl' line 2: input_ids[1] is -1; token ids are non-negative"),
            std::string::npos);
  EXPECT_NE(error_of([] { jsonl("{\"input_ids\": [1, 2.5]}\n"); })
                .find("line 1: input_ids[1] is 2.5, not an integer"),
            std::string::npos);
  EXPECT_NE(error_of([] { jsonl("{\"input_ids\": [1, \"a\"]}\n"); }).find("not an integer"),
            std::string::npos);
  EXPECT_NE(error_of([] { jsonl("{\"input_ids\": [1, 2], \"attention_mask\": [1, 2]}\n"); })
                .find("attention_mask[1] is 2; an attention_mask holds 0 (padding) and 1"),
            std::string::npos);
  EXPECT_NE(error_of([] { jsonl("{\"input_ids\": [1, 2], \"attention_mask\": [1]}\n"); })
                .find("attention_mask has 1 values for 2 input_ids"),
            std::string::npos);
  EXPECT_NE(error_of([] { jsonl("{\"input_ids\": [1, 2], \"attention_mask\": [0, 0]}\n"); })
                .find("line 1 has no real token"),
            std::string::npos);
  EXPECT_NE(error_of([] { jsonl("{\"input_ids\": []}\n"); }).find("line 1 has no real token"),
            std::string::npos);
  EXPECT_NE(error_of([] { jsonl("{\"ids\": [1]}\n"); }).find("line 1 has no \"input_ids\""),
            std::string::npos);
  EXPECT_NE(error_of([] { jsonl("[1, 2]\n"); }).find("not an object"), std::string::npos);
  EXPECT_NE(error_of([] { jsonl("{\"input_ids\": [1, 2]\n"); }).find("line 1 is not JSON"),
            std::string::npos);
  EXPECT_NE(error_of([] { jsonl("{\"input_ids\": 5}\n"); }).find("not an array"),
            std::string::npos);
  EXPECT_NE(error_of([] { jsonl("\n  \n"); }).find("holds no rows"), std::string::npos);
  EXPECT_NE(error_of([] { jsonl(""); }).find("holds no rows"), std::string::npos);
  EXPECT_NE(error_of([] { jsonl("{\"input_ids\": [99999999999999999999]}\n"); }).find("line 1"),
            std::string::npos);
  TokenIdOptions vocab;
  vocab.vocab_size = 10;
  EXPECT_NE(error_of([&] { jsonl("{\"input_ids\": [3, 10]}\n", vocab); })
                .find("input_ids[1] is 10, not below the model's vocabulary of 10"),
            std::string::npos);
  TokenIdOptions bad;
  bad.batch = 0;
  error_of([&] { jsonl("{\"input_ids\": [1]}\n", bad); }, ErrorCategory::Usage);
}

std::vector<std::byte> npz_of(const std::vector<int64_t>& ids, const std::vector<int64_t>& mask,
                              int64_t n, int64_t t, bool deflated = false) {
  std::vector<std::pair<std::string, std::vector<std::byte>>> entries = {
      {"input_ids.npy", npy("<i8", {n, t}, raw_bytes(ids))}};
  if (!mask.empty()) {
    entries.push_back({"attention_mask.npy", npy("<i8", {n, t}, raw_bytes(mask))});
    entries.push_back({"token_type_ids.npy", npy("<i8", {n, t}, raw_bytes(mask))});
  }
  return zip(entries, deflated);
}

TEST(TokenIds, NpzAsTheTokenizerWritesIt) {
  TempDir dir;
  for (bool deflated : {false, true}) {
    SCOPED_TRACE(deflated);
    write_file(dir / "ids.npz",
               npz_of({5, 6, 0, 0, 7, 8, 9, 0, 1, 2, 3, 4}, {1, 1, 0, 0, 1, 1, 1, 0, 1, 1, 1, 1}, 3,
                      4, deflated));
    TokenIdOptions o;
    o.batch = 2;
    TokenIds ids(dir / "ids.npz", o);
    EXPECT_EQ(ids.size(), 3);
    EXPECT_EQ(ids.seq_len(), 4);
    EXPECT_EQ(ids.real_tokens(), 9);
    EXPECT_EQ(ids.format(), "npz");
    BatchSource::Feeds b;
    ASSERT_TRUE(ids.next(b));
    ASSERT_EQ(b.size(), 2u);
    EXPECT_EQ(b[0].first, "input_ids");
    EXPECT_EQ(b[1].first, "attention_mask");
    EXPECT_EQ(b[0].second.dtype(), DType::I64);
    EXPECT_EQ(b[0].second.shape(), (Shape{2, 4}));
    ASSERT_TRUE(ids.next(b));
    EXPECT_EQ(b[0].second.shape(), (Shape{1, 4}));
    EXPECT_EQ(std::vector<int64_t>(b[0].second.data<int64_t>().begin(),
                                   b[0].second.data<int64_t>().end()),
              (std::vector<int64_t>{1, 2, 3, 4}));
    EXPECT_FALSE(ids.next(b));
    ids.rewind();
    EXPECT_TRUE(ids.next(b));
    EXPECT_EQ(ids.sample_origin(2), "calibration data '" + (dir / "ids.npz").string() + "' sample 2");
    EXPECT_EQ(ids.digest().size(), 64u);
  }
}

TEST(TokenIds, NpzTrimsColumnsThatAreNeverReal) {
  TempDir dir;
  write_file(dir / "ids.npz", npz_of({5, 6, 0, 7, 0, 0}, {1, 1, 0, 1, 0, 0}, 2, 3));
  const TokenIdTable t = read_token_ids(dir / "ids.npz", {});
  EXPECT_EQ(t.seq, 2);
  EXPECT_EQ(t.ids, (std::vector<int64_t>{5, 6, 7, 0}));
}

TEST(TokenIds, CorruptNpzFilesAreRefusedWithTheSample) {
  TempDir dir;
  const auto path = dir / "ids.npz";
  write_file(path, npz_of({5, -3, 1, 2}, {}, 2, 2));
  EXPECT_NE(error_of([&] { read_token_ids(path, {}); })
                .find("ids.npz' sample 0: input_ids[1] is -3; token ids are non-negative"),
            std::string::npos);
  write_file(path, npz_of({5, 3, 1, 2}, {1, 1, 2, 1}, 2, 2));
  EXPECT_NE(error_of([&] { read_token_ids(path, {}); }).find("sample 1: attention_mask[0] is 2"),
            std::string::npos);
  write_file(path, npz_of({5, 3, 1, 2}, {1, 1, 0, 0}, 2, 2));
  EXPECT_NE(error_of([&] { read_token_ids(path, {}); }).find("sample 1 has no real token"),
            std::string::npos);
  // Ragged: the mask does not match the ids, or the rows were saved as Python objects.
  write_file(path, zip({{"input_ids.npy", npy("<i8", {2, 2}, raw_bytes(std::vector<int64_t>{1, 2, 3, 4}))},
                        {"attention_mask.npy", npy("<i8", {2, 1}, raw_bytes(std::vector<int64_t>{1, 1}))}},
                       false));
  EXPECT_NE(error_of([&] { read_token_ids(path, {}); }).find("does not match input_ids"),
            std::string::npos);
  write_file(path, zip({{"input_ids.npy", npy("|O", {2}, {})}}, false));
  EXPECT_NE(error_of([&] { read_token_ids(path, {}); }).find("rows of different lengths?"),
            std::string::npos);
  write_file(path, zip({{"input_ids.npy", npy("<i8", {4}, raw_bytes(std::vector<int64_t>{1, 2, 3, 4}))}},
                       false));
  EXPECT_NE(error_of([&] { read_token_ids(path, {}); }).find("token ids are [samples, positions]"),
            std::string::npos);
  write_file(path, zip({{"input_ids.npy", npy("<f4", {1, 2}, raw_bytes(std::vector<float>{1, 2}))}},
                       false));
  error_of([&] { read_token_ids(path, {}); }, ErrorCategory::Unsupported);
  write_file(path, zip({{"ids.npy", npy("<i8", {1, 1}, raw_bytes(std::vector<int64_t>{1}))}}, false));
  EXPECT_NE(error_of([&] { read_token_ids(path, {}); }).find("has no 'input_ids' array"),
            std::string::npos);
  write_file(path, zip({{"input_ids.npy", npy("<i8", {0, 3}, {})}}, false));
  EXPECT_NE(error_of([&] { read_token_ids(path, {}); }).find("holds no samples"),
            std::string::npos);
  // Truncated archive.
  std::vector<std::byte> bytes = npz_of({1, 2}, {}, 1, 2);
  bytes.resize(bytes.size() / 2);
  write_file(path, bytes);
  EXPECT_THROW(read_token_ids(path, {}), Error);
  write_file(path, {});
  EXPECT_THROW(read_token_ids(path, {}), Error);
}

TEST(TokenIds, FilesByExtension) {
  TempDir dir;
  write_text(dir / "ids.jsonl", "{\"input_ids\": [1, 2]}\n{\"input_ids\": [3]}\n");
  TokenIdOptions o;
  o.batch = 8;
  TokenIds ids(dir / "ids.jsonl", o);
  EXPECT_EQ(ids.format(), "jsonl");
  EXPECT_EQ(ids.sample_origin(1),
            "calibration data '" + (dir / "ids.jsonl").string() + "' line 2");
  BatchSource::Feeds b;
  ASSERT_TRUE(ids.next(b));
  EXPECT_EQ(b[1].second.shape(), (Shape{2, 2}));
  write_text(dir / "empty.jsonl", "");
  EXPECT_NE(error_of([&] { TokenIds(dir / "empty.jsonl", o); }).find("holds no rows"),
            std::string::npos);
  write_text(dir / "ids.txt", "1 2 3");
  error_of([&] { TokenIds(dir / "ids.txt", o); }, ErrorCategory::Unsupported);
  error_of([&] { TokenIds(dir / "missing.jsonl", o); }, ErrorCategory::IO);
}

TEST(TokenIds, DigestDoesNotDependOnTheBatch) {
  TokenIdOptions a, b;
  b.batch = 3;
  const std::string text = "{\"input_ids\": [1, 2]}\n{\"input_ids\": [3]}\n{\"input_ids\": [4]}\n";
  TokenIds x(jsonl(text, a), 1, "ids.jsonl", "jsonl");
  TokenIds y(jsonl(text, b), 3, "ids.jsonl", "jsonl");
  EXPECT_EQ(x.digest(), y.digest());
}

}  // namespace
}  // namespace qforge
