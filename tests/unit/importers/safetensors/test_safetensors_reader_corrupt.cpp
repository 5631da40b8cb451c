// Hand-made corrupt files: each must be rejected with the right category and a one-line
// message naming the file and what is wrong.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "importers/safetensors/safetensors_reader.h"
#include "tests/unit/importers/safetensors/safetensors_test_util.h"

using namespace qforge;
using qforge::test::Failure;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

namespace {

Failure rejects_bytes(const std::vector<std::byte>& bytes) {
  Failure f = test::failure_of([&] { import_safetensors_bytes(bytes, "bad.safetensors"); });
  EXPECT_THAT(f.message, AllOf(StartsWith("'bad.safetensors'"), Not(HasSubstr("\n"))));
  return f;
}

Failure rejects(std::string_view header, size_t data_size) {
  return rejects_bytes(test::safetensors_bytes(header, data_size));
}

std::string f32_entry(const std::string& name, const std::string& shape, uint64_t begin,
                      uint64_t end) {
  return "\"" + name + "\":{\"dtype\":\"F32\",\"shape\":" + shape + ",\"data_offsets\":[" +
         std::to_string(begin) + "," + std::to_string(end) + "]}";
}

// "{e1,e2,...}"; appended piecewise (GCC 12 warns falsely on "{" + std::string&&).
std::string object_of(std::initializer_list<std::string> entries) {
  std::string s(1, '{');
  for (const auto& e : entries) {
    if (s.size() > 1) s += ',';
    s += e;
  }
  s += '}';
  return s;
}

}  // namespace

TEST(SafetensorsReader, RejectsFileShorterThanLengthField) {
  const Failure f = rejects_bytes({std::byte{1}, std::byte{0}, std::byte{0}});
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
  EXPECT_THAT(f.message, HasSubstr("3 bytes, too short"));
}

TEST(SafetensorsReader, RejectsHeaderLengthOver100MB) {
  auto bytes = test::safetensors_bytes("{}", 0);
  bytes[3] = std::byte{0x10};  // 0x10000002 = 268435458
  const Failure f = rejects_bytes(bytes);
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
  EXPECT_THAT(f.message, HasSubstr("header length 268435458 exceeds the 100 MB limit"));
}

TEST(SafetensorsReader, RejectsHeaderLengthPastEndOfFile) {
  auto bytes = test::safetensors_bytes("{}      ", 0);
  bytes[0] = std::byte{9};
  const Failure f = rejects_bytes(bytes);
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
  EXPECT_THAT(f.message, HasSubstr("header length 9 runs past the end of the 16-byte file"));
}

TEST(SafetensorsReader, RejectsHeaderThatIsNotJson) {
  const Failure f = rejects("{\"a\": nope}", 0);
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
  EXPECT_THAT(f.message, HasSubstr("header is not valid JSON (error at byte 7)"));
}

TEST(SafetensorsReader, RejectsTruncatedJson) {
  const Failure f = rejects("{\"a\":{\"dtype\":\"F32\"", 0);
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
  EXPECT_THAT(f.message, HasSubstr("not valid JSON"));
}

TEST(SafetensorsReader, RejectsJsonArrayHeader) {
  const Failure f = rejects("[1, 2]  ", 0);
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
  EXPECT_THAT(f.message, HasSubstr("does not start with '{' at file offset 8"));
}

TEST(SafetensorsReader, RejectsHeaderWithLeadingWhitespace) {
  const Failure f = rejects(" {}", 0);
  EXPECT_THAT(f.message, HasSubstr("does not start with '{'"));
}

TEST(SafetensorsReader, RejectsEntryThatIsNotAnObject) {
  const Failure f = rejects("{\"w\":[1,2]}", 0);
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
  EXPECT_THAT(f.message, HasSubstr("tensor 'w': entry is array, expected an object"));
}

TEST(SafetensorsReader, RejectsMissingDtype) {
  const Failure f = rejects("{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
  EXPECT_THAT(f.message, HasSubstr("tensor 'w': missing \"dtype\" string"));
}

TEST(SafetensorsReader, RejectsShapeThatIsNotAnArray) {
  const Failure f = rejects("{\"w\":{\"dtype\":\"F32\",\"shape\":4,\"data_offsets\":[0,4]}}", 4);
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
  EXPECT_THAT(f.message, HasSubstr("tensor 'w': missing \"shape\" array"));
}

TEST(SafetensorsReader, RejectsNegativeShapeEntry) {
  const Failure f = rejects(object_of({f32_entry("w", "[-1,4]", 0, 16)}), 16);
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
  EXPECT_THAT(f.message, HasSubstr("tensor 'w': shape entry -1 is not a non-negative integer"));
}

TEST(SafetensorsReader, RejectsFloatShapeEntry) {
  const Failure f = rejects(object_of({f32_entry("w", "[2.0]", 0, 8)}), 8);
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
  EXPECT_THAT(f.message, HasSubstr("shape entry 2.0 is not a non-negative integer"));
}

TEST(SafetensorsReader, RejectsMissingOrMalformedDataOffsets) {
  for (const std::string offsets : {"", ",\"data_offsets\":[0]", ",\"data_offsets\":[0,4,8]",
                                    ",\"data_offsets\":[-4,4]", ",\"data_offsets\":\"0-4\""}) {
    const Failure f = rejects("{\"w\":{\"dtype\":\"F32\",\"shape\":[1]" + offsets + "}}", 4);
    EXPECT_EQ(f.category, ErrorCategory::InvalidInput) << offsets;
    EXPECT_THAT(f.message, HasSubstr("tensor 'w': missing \"data_offsets\" [begin, end]"))
        << offsets;
  }
}

TEST(SafetensorsReader, RejectsOffsetsBeginAfterEnd) {
  const Failure f = rejects(object_of({f32_entry("w", "[1]", 8, 4)}), 8);
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
  EXPECT_THAT(f.message, HasSubstr("tensor 'w': data_offsets [8, 4] begin after end"));
}

TEST(SafetensorsReader, RejectsOverlappingTensors) {
  const std::string header = object_of({f32_entry("a", "[2]", 0, 8), f32_entry("b", "[2]", 4, 12)});
  const Failure f = rejects(header, 12);
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
  EXPECT_THAT(f.message, HasSubstr("tensor 'b' data_offsets [4, 12] overlap tensor 'a' [0, 8] "
                                   "at file offset " +
                                   std::to_string(8 + header.size() + 4)));
}

TEST(SafetensorsReader, RejectsHoleBetweenTensors) {
  const std::string header = object_of({f32_entry("a", "[1]", 0, 4), f32_entry("b", "[1]", 8, 12)});
  const Failure f = rejects(header, 12);
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
  EXPECT_THAT(f.message, HasSubstr("hole of 4 bytes before tensor 'b' at file offset " +
                                   std::to_string(8 + header.size() + 4)));
}

TEST(SafetensorsReader, RejectsHoleAtStartOfData) {
  const Failure f = rejects(object_of({f32_entry("a", "[1]", 4, 8)}), 8);
  EXPECT_THAT(f.message, HasSubstr("hole of 4 bytes before tensor 'a'"));
}

TEST(SafetensorsReader, RejectsOffsetsPastEndOfFile) {
  const Failure f = rejects(object_of({f32_entry("w", "[4]", 0, 16)}), 8);
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
  EXPECT_THAT(f.message, HasSubstr("tensor 'w': data_offsets [0, 16] run past the 8-byte data "
                                   "section"));
}

TEST(SafetensorsReader, RejectsHugeOffsetsWithoutWrapping) {
  // end - begin matches the shape, but both lie far beyond the file.
  const Failure f = rejects(
      object_of({f32_entry("w", "[1]", 18446744073709551608ull, 18446744073709551612ull)}), 4);
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
  EXPECT_THAT(f.message, HasSubstr("run past the 4-byte data section"));
}

TEST(SafetensorsReader, RejectsDataNotEndingAtEndOfFile) {
  const std::string header = object_of({f32_entry("w", "[1]", 0, 4)});
  const Failure f = rejects(header, 12);
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
  EXPECT_THAT(f.message,
              HasSubstr("8 bytes after the last tensor at file offset " +
                        std::to_string(8 + header.size() + 4) + " are claimed by no tensor"));
}

TEST(SafetensorsReader, RejectsDuplicateTensorNames) {
  const Failure f =
      rejects(object_of({f32_entry("w", "[1]", 0, 4), f32_entry("w", "[1]", 4, 8)}), 8);
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
  EXPECT_THAT(f.message, HasSubstr("duplicate tensor name 'w'"));
}

TEST(SafetensorsReader, RejectsDuplicateKeyInsideEntry) {
  const Failure f = rejects(
      "{\"w\":{\"dtype\":\"F32\",\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
  EXPECT_THAT(f.message, HasSubstr("duplicate key 'dtype' inside 'w'"));
}

TEST(SafetensorsReader, RejectsUnsupportedDtypes) {
  for (const std::string dtype : {"U16", "U32", "U64", "F8_E4M3", "F8_E5M2", "F4", "C64", "X"}) {
    const Failure f =
        rejects("{\"w\":{\"dtype\":\"" + dtype + "\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2);
    EXPECT_EQ(f.category, ErrorCategory::Unsupported) << dtype;
    EXPECT_THAT(f.message, HasSubstr("unsupported dtype " + dtype + " in tensor 'w'"));
  }
}

TEST(SafetensorsReader, RejectsLengthThatDisagreesWithShape) {
  const Failure f = rejects(object_of({f32_entry("w", "[3]", 0, 8)}), 8);
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
  EXPECT_THAT(f.message, HasSubstr("tensor 'w': shape [3] of F32 needs 12 bytes but data_offsets "
                                   "[0, 8] hold 8"));
}

TEST(SafetensorsReader, RejectsShapeWhoseByteCountOverflows) {
  const Failure f = rejects(object_of({f32_entry("w", "[1099511627776,1099511627776]", 0, 0)}), 0);
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
  EXPECT_THAT(f.message, HasSubstr("overflows 64-bit byte counts"));
}

TEST(SafetensorsReader, RejectsOverflowBeforeAZeroDimension) {
  // Products are taken left to right, as the reference does.
  const Failure f =
      rejects(object_of({f32_entry("w", "[1099511627776,1099511627776,0]", 0, 0)}), 0);
  EXPECT_THAT(f.message, HasSubstr("overflows 64-bit byte counts"));
}

TEST(SafetensorsReader, RejectsInvalidUtf8InHeader) {
  std::string header = object_of({f32_entry("w?", "[1]", 0, 4)});
  header[header.find('?')] = static_cast<char>(0xc3);  // a lead byte with no continuation
  const Failure f = rejects(header, 4);
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
  EXPECT_THAT(f.message, HasSubstr("header is not valid UTF-8 at byte 3"));
}

TEST(SafetensorsReader, RejectsOverlongUtf8AndSurrogates) {
  for (const std::string bad : {"\xc0\xaf", "\xe0\x80\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80"}) {
    const Failure f = rejects("{\"__metadata__\":{\"k\":\"" + bad + "\"}}", 0);
    EXPECT_THAT(f.message, HasSubstr("not valid UTF-8 at byte 22"));
  }
}

TEST(SafetensorsReader, RejectsNonStringMetadata) {
  const Failure f = rejects("{\"__metadata__\":{\"step\":5}}", 0);
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
  EXPECT_THAT(f.message, HasSubstr("__metadata__ key 'step' is number, expected a string"));
}

TEST(SafetensorsReader, RejectsPackedMarkerOnWrongStorage) {
  const Failure f = rejects(
      "{\"__metadata__\":{\"qforge.dtype.w\":\"i4\",\"qforge.shape.w\":"
      "\"[3]\"}," +
          f32_entry("w", "[1]", 0, 4) + "}",
      4);
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
  EXPECT_THAT(f.message, HasSubstr("tensor 'w' is marked i4 of shape [3] but is stored as f32 "
                                   "[1]; expected U8 [2]"));
}

TEST(SafetensorsReader, RejectsPackedMarkerWithoutShape) {
  const Failure f = rejects(
      "{\"__metadata__\":{\"qforge.dtype.w\":\"u4\"},"
      "\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
      1);
  EXPECT_THAT(f.message, HasSubstr("has qforge.dtype.w but no qforge.shape.w"));
}

TEST(SafetensorsReader, NamesTheFileOnDisk) {
  test::TempDir dir;
  const auto path = dir / "broken.safetensors";
  test::write_bytes(path, test::safetensors_bytes(object_of({f32_entry("w", "[3]", 0, 8)}), 8));
  const Failure f = test::failure_of([&] { import_safetensors(path); });
  const std::string expected = std::string(1, '\'').append(path.string()).append("': tensor 'w'");
  EXPECT_THAT(f.message, StartsWith(expected));
}

TEST(SafetensorsReader, MissingFileIsAnIoError) {
  test::TempDir dir;
  const Failure f = test::failure_of([&] { import_safetensors(dir / "absent.safetensors"); });
  EXPECT_EQ(f.category, ErrorCategory::IO);
  EXPECT_THAT(f.message, HasSubstr("absent.safetensors"));
}
