// Dataset on data that does not fit the model, and on hand-made corrupt files: each gets one
// line naming the file, the input or entry, and the mismatch.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "importers/dataset/dataset.h"
#include "ir/error.h"
#include "tests/unit/importers/dataset/dataset_test_util.h"

using namespace qforge;
using namespace qforge::test;

namespace {

ValueInfo info(const std::string& name, std::vector<Dim> dims, DType dtype = DType::F32) {
  ValueInfo v;
  v.name = name;
  v.dtype = dtype;
  v.shape = std::move(dims);
  return v;
}

const std::vector<Dim> kImage = {Dim{std::nullopt, "batch"}, Dim{1, ""}, Dim{8, ""}, Dim{8, ""}};

// Runs `fn`, expecting Error of `category` whose message contains every one of `parts`.
void expect_error(const std::function<void()>& fn, ErrorCategory category,
                  const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one containing '" << parts.front() << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), category) << e.what();
    const std::string msg = e.what();
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "not one line: " << msg;
  }
}

void drain(Dataset& d) {
  Dataset::Feeds b;
  while (d.next(b)) {
  }
}

std::vector<std::byte> floats(size_t n) { return std::vector<std::byte>(n * 4, std::byte{0x3f}); }

}  // namespace

TEST(DatasetErrors, ShapeMismatchNamesInputShapeAndModelShape) {
  ScratchDir dir("dse_shape");
  const auto path = dir / "calib.npz";
  write_file(path, zip({{"input.npy", npy("<f4", {200, 1, 9, 8}, floats(200 * 72))}}, true));
  expect_error(
      [&] { Dataset d(path, {info("input", kImage)}); }, ErrorCategory::InvalidInput,
      {"calibration data '" + path.string() +
       "': input 'input' has shape [200, 1, 9, 8] but the model expects [batch, 1, 8, 8]"});
}

TEST(DatasetErrors, MissingInputListsTheKeysPresent) {
  ScratchDir dir("dse_missing");
  write_file(dir / "d.npz", zip({{"data.npy", npy("<f4", {2, 1, 8, 8}, floats(128))},
                                 {"labels.npy", npy("<i8", {2}, floats(4))}},
                                false));
  expect_error([&] { Dataset d(dir / "d.npz", {info("input", kImage)}); },
               ErrorCategory::InvalidInput,
               {"has no array for input 'input'", "it holds 'data', 'labels'"});
}

TEST(DatasetErrors, DtypeMismatchSaysHowToConvert) {
  ScratchDir dir("dse_dtype");
  write_file(dir / "d.npz", zip({{"input.npy", npy("<f8", {2, 1, 8, 8}, floats(256))}}, false));
  expect_error([&] { Dataset d(dir / "d.npz", {info("input", kImage)}); },
               ErrorCategory::InvalidInput,
               {"input 'input' is f64 but the model expects f32", "astype(numpy.float32)"});
}

TEST(DatasetErrors, InputsWithDifferentSampleCounts) {
  ScratchDir dir("dse_rows");
  const std::vector<Dim> dims = {Dim{std::nullopt, "b"}, Dim{2, ""}};
  write_file(dir / "d.npz", zip({{"a.npy", npy("<f4", {3, 2}, floats(6))},
                                 {"b.npy", npy("<f4", {4, 2}, floats(8))}},
                                false));
  expect_error(
      [&] {
        Dataset d(dir / "d.npz", {info("a", dims), info("b", dims)});
      },
      ErrorCategory::InvalidInput, {"input 'b' has 4 sample(s) but input 'a' has 3"});
}

TEST(DatasetErrors, NpyForAModelWithSeveralInputs) {
  ScratchDir dir("dse_npy");
  write_file(dir / "x.npy", npy("<f4", {2, 2}, floats(4)));
  const std::vector<Dim> dims = {Dim{std::nullopt, "b"}, Dim{2, ""}};
  expect_error(
      [&] {
        Dataset d(dir / "x.npy", {info("a", dims), info("b", dims)});
      },
      ErrorCategory::InvalidInput, {"holds one array", "use an .npz"});
}

TEST(DatasetErrors, CorruptStoredDataFailsItsCrcAtTheEndOfThePass) {
  ScratchDir dir("dse_crc");
  const auto array = npy("<f4", {4, 2}, floats(8));
  auto bytes = zip({{"ab.npy", array}}, false);
  bytes[30 + 6 + array.size() - 1] = std::byte{0x00};  // the last data byte
  write_file(dir / "d.npz", bytes);
  Dataset d(dir / "d.npz", {info("ab", {Dim{std::nullopt, "b"}, Dim{2, ""}})}, 0, 3);
  expect_error([&] { drain(d); }, ErrorCategory::InvalidInput,
               {"entry 'ab.npy'", "fails its CRC-32 check"});
}

TEST(DatasetErrors, CorruptDeflateStream) {
  ScratchDir dir("dse_deflate");
  std::vector<std::byte> data = npy("<f4", {64, 2}, floats(128));
  for (size_t i = 0; i < data.size(); ++i) data[i] ^= static_cast<std::byte>(i * 7);
  auto bytes = zip({{"x.npy", data}}, true);
  for (size_t i = 40; i < 60; ++i) bytes[i] = std::byte{0xff};
  write_file(dir / "d.npz", bytes);
  expect_error(
      [&] {
        Dataset d(dir / "d.npz", {info("x", {Dim{std::nullopt, "b"}, Dim{2, ""}})});
      },
      ErrorCategory::InvalidInput, {"entry 'x.npy'"});
}

TEST(DatasetErrors, TruncatedArchive) {
  ScratchDir dir("dse_trunc");
  auto bytes = zip({{"x.npy", npy("<f4", {4, 2}, floats(8))}}, false);
  bytes.resize(bytes.size() - 30);
  write_file(dir / "d.npz", bytes);
  expect_error(
      [&] {
        Dataset d(dir / "d.npz", {info("x", {Dim{std::nullopt, "b"}, Dim{2, ""}})});
      },
      ErrorCategory::InvalidInput, {"d.npz", "not a valid zip archive"});
}

TEST(DatasetErrors, ArraySizeDisagreesWithItsHeader) {
  ScratchDir dir("dse_size");
  write_file(dir / "x.npy", npy("<f4", {4, 2}, floats(7)));
  expect_error(
      [&] {
        Dataset d(dir / "x.npy", {info("x", {Dim{std::nullopt, "b"}, Dim{2, ""}})});
      },
      ErrorCategory::InvalidInput, {"holds 28 data bytes but its header says f32 [4, 2]"});
}

TEST(DatasetErrors, NpyHeadersQforgeDoesNotRead) {
  ScratchDir dir("dse_header");
  const auto x = info("x", {Dim{std::nullopt, "b"}, Dim{2, ""}});
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {">f4", {"big-endian", ".astype('<f4')"}},
      {"|O", {"Python objects"}},
      {"<c8", {"dtype '<c8'"}},
  };
  for (const auto& [descr, parts] : cases) {
    write_file(dir / "x.npy", npy(descr, {2, 2}, floats(4)));
    expect_error([&] { Dataset d(dir / "x.npy", {x}); }, ErrorCategory::Unsupported, parts);
  }
  auto fortran = npy("<f4", {2, 2}, floats(4));
  const std::string f = "'fortran_order': False";
  std::string text(reinterpret_cast<const char*>(fortran.data()), fortran.size());
  text.replace(text.find(f), f.size(), "'fortran_order': True ");
  write_file(dir / "x.npy", as_bytes(text));
  expect_error([&] { Dataset d(dir / "x.npy", {x}); }, ErrorCategory::Unsupported,
               {"Fortran order"});
  text.replace(text.find("'shape'"), 7, "'shapf'");
  write_file(dir / "x.npy", as_bytes(text));
  expect_error([&] { Dataset d(dir / "x.npy", {x}); }, ErrorCategory::InvalidInput,
               {"unexpected or repeated key 'shapf'"});
  write_file(dir / "x.npy", as_bytes("not numpy at all"));
  expect_error([&] { Dataset d(dir / "x.npy", {x}); }, ErrorCategory::InvalidInput,
               {"no \\x93NUMPY magic"});
}

TEST(DatasetErrors, ArchiveEntriesThatAreNotArrays) {
  ScratchDir dir("dse_entry");
  write_file(dir / "d.npz", zip({{"notes.txt", as_bytes("hello")}}, false));
  expect_error([&] { Dataset d(dir / "d.npz", {info("x", kImage)}); }, ErrorCategory::InvalidInput,
               {"entry 'notes.txt' is not an .npy array"});
}

TEST(DatasetErrors, PathsAndArguments) {
  ScratchDir dir("dse_paths");
  expect_error([&] { Dataset d(dir / "nope.npz", {info("x", kImage)}); }, ErrorCategory::IO,
               {"nope.npz", "no such file or folder"});
  write_file(dir / "data.csv", as_bytes("1,2"));
  expect_error([&] { Dataset d(dir / "data.csv", {info("x", kImage)}); },
               ErrorCategory::Unsupported, {"neither .npz nor .npy"});
  std::filesystem::create_directories(dir / "empty");
  expect_error([&] { Dataset d(dir / "empty", {info("x", kImage)}); }, ErrorCategory::InvalidInput,
               {"holds no .npz or .npy files"});
  write_file(dir / "x.npy", npy("<f4", {3, 1, 8, 8}, floats(192)));
  expect_error([&] { Dataset d(dir / "x.npy", {info("x", kImage)}, 0, 0); }, ErrorCategory::Usage,
               {"batch 0"});
  expect_error([&] { Dataset d(dir / "x.npy", {info("x", kImage)}, -1, 1); }, ErrorCategory::Usage,
               {"calibration size -1"});
  const std::vector<Dim> fixed = {Dim{4, ""}, Dim{1, ""}, Dim{8, ""}, Dim{8, ""}};
  expect_error([&] { Dataset d(dir / "x.npy", {info("x", fixed)}); }, ErrorCategory::InvalidInput,
               {"holds 3 sample(s), fewer than the model's fixed batch of 4"});
}

TEST(DatasetErrors, TestDataThatIsNotATensorProto) {
  ScratchDir dir("dse_pb");
  std::filesystem::create_directories(dir / "test_data_set_0");
  write_file(dir / "test_data_set_0" / "input_0.pb", as_bytes("\xff\xff\xff garbage"));
  expect_error([&] { Dataset d(dir.path(), {info("x", kImage)}); }, ErrorCategory::InvalidInput,
               {"input_0.pb", "not a serialized ONNX TensorProto"});
  write_tensor_pb(dir / "test_data_set_0" / "input_0.pb", "x", {1, 1, 8, 8},
                  std::vector<float>(64, 1.0f));
  write_tensor_pb(dir / "test_data_set_0" / "input_1.pb", "x", {1, 1, 8, 8},
                  std::vector<float>(64, 1.0f));
  expect_error([&] { Dataset d(dir.path(), {info("x", kImage)}); }, ErrorCategory::InvalidInput,
               {"holds tensor 'x', which another file"});
}
