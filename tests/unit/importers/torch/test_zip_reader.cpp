#include <gtest/gtest.h>

#include "importers/torch/zip_reader.h"
#include "torch_test_util.h"

using namespace qforge;
using namespace qforge::torch_test;

namespace {

std::vector<ZipFileSpec> two_files() {
  return {{"arch/data.pkl", to_bytes("pickle bytes")},
          {"arch/data/0", to_bytes(std::vector<float>{1.0f, 2.0f, 3.0f})}};
}

ZipDirectory parse(const Bytes& b) { return ZipDirectory::parse(b, "test.zip"); }

Failure parse_failure(const Bytes& b) {
  return failure_of([&] { parse(b); });
}

std::string_view text(std::span<const std::byte> s) {
  return {reinterpret_cast<const char*>(s.data()), s.size()};
}

}  // namespace

TEST(ZipReader, ReadsStoredEntriesFromCentralDirectory) {
  const BuiltZip z = build_zip(two_files());  // local headers hold zero sizes, as torch's do
  const ZipDirectory dir = parse(z.bytes);
  ASSERT_EQ(dir.entries().size(), 2u);
  const ZipEntry* e = dir.find("arch/data/0");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->size, 12u);
  EXPECT_EQ(e->data_offset, z.data_offsets[1]);
  EXPECT_EQ(e->data_offset % 64, 0u);
  EXPECT_EQ(text(dir.data(z.bytes, *dir.find("arch/data.pkl"), "test.zip")), "pickle bytes");
  EXPECT_EQ(dir.find("arch/data/1"), nullptr);
}

TEST(ZipReader, ReadsZip64RecordsAndExtraFields) {
  const BuiltZip z = build_zip(two_files(), {.zip64 = true});
  const ZipDirectory dir = parse(z.bytes);
  ASSERT_EQ(dir.entries().size(), 2u);
  EXPECT_EQ(dir.entries()[1].size, 12u);
  EXPECT_EQ(dir.entries()[1].local_header_offset, z.local_offsets[1]);
  EXPECT_EQ(text(dir.data(z.bytes, dir.entries()[0], "test.zip")), "pickle bytes");
}

TEST(ZipReader, RejectsFileWithoutEndRecord) {
  BuiltZip z = build_zip(two_files());
  put_le<uint32_t>(z.bytes, z.eocd_offset, 0x12345678);
  const Failure f = parse_failure(z.bytes);
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
  EXPECT_NE(f.message.find("no end of central directory record"), std::string::npos) << f.message;
  EXPECT_NE(f.message.find("'test.zip'"), std::string::npos) << f.message;
  EXPECT_EQ(parse_failure(to_bytes("PK")).category, ErrorCategory::InvalidInput);
}

TEST(ZipReader, RejectsEveryTruncation) {
  const BuiltZip z = build_zip(two_files(), {.zip64 = true});
  for (size_t n = 0; n < z.bytes.size(); ++n) {
    const Bytes cut(z.bytes.begin(), z.bytes.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_EQ(parse_failure(cut).category, ErrorCategory::InvalidInput) << "cut at " << n;
  }
}

TEST(ZipReader, RejectsCentralDirectoryBeyondFile) {
  BuiltZip z = build_zip(two_files());
  put_le<uint32_t>(z.bytes, z.eocd_offset + 16, 0x7fff0000);  // directory offset
  const Failure f = parse_failure(z.bytes);
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
  EXPECT_NE(f.message.find("central directory (offset 2147418112"), std::string::npos) << f.message;

  BuiltZip y = build_zip(two_files());
  put_le<uint32_t>(y.bytes, y.eocd_offset + 12, 0xfffffff0u);  // directory size
  EXPECT_EQ(parse_failure(y.bytes).category, ErrorCategory::InvalidInput);
}

TEST(ZipReader, RejectsEntryCountTheDirectoryCannotHold) {
  BuiltZip z = build_zip(two_files());
  put_le<uint16_t>(z.bytes, z.eocd_offset + 8, 900);
  put_le<uint16_t>(z.bytes, z.eocd_offset + 10, 900);
  const Failure f = parse_failure(z.bytes);
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
  EXPECT_NE(f.message.find("claims 900 entries"), std::string::npos) << f.message;
}

TEST(ZipReader, RejectsEntryDataBeyondFile) {
  BuiltZip z = build_zip(two_files());
  put_le<uint32_t>(z.bytes, z.central_offsets[1] + 20, 1000000);  // compressed size
  put_le<uint32_t>(z.bytes, z.central_offsets[1] + 24, 1000000);  // size
  const Failure f = parse_failure(z.bytes);
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
  EXPECT_NE(f.message.find("entry 'arch/data/0' data (1000000 bytes"), std::string::npos)
      << f.message;
}

TEST(ZipReader, RejectsZip64SizesBeyondFileWithoutOverflow) {
  BuiltZip z = build_zip(two_files(), {.zip64 = true});
  // The ZIP64 extra's local header offset: near 2^64, so offset + header would wrap.
  const size_t extra = z.central_offsets[1] + 46 + std::string("arch/data/0").size();
  put_le<uint64_t>(z.bytes, extra + 4 + 16, ~uint64_t{0} - 8);
  EXPECT_EQ(parse_failure(z.bytes).category, ErrorCategory::InvalidInput);
  BuiltZip y = build_zip(two_files(), {.zip64 = true});
  put_le<uint64_t>(y.bytes, extra + 4, ~uint64_t{0});      // size
  put_le<uint64_t>(y.bytes, extra + 4 + 8, ~uint64_t{0});  // compressed size
  EXPECT_EQ(parse_failure(y.bytes).category, ErrorCategory::InvalidInput);
}

TEST(ZipReader, RejectsLocalHeaderThatIsNotThere) {
  BuiltZip z = build_zip(two_files());
  put_le<uint32_t>(z.bytes, z.central_offsets[0] + 42, 3);
  const Failure f = parse_failure(z.bytes);
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
  EXPECT_NE(f.message.find("no local header at byte 3"), std::string::npos) << f.message;
}

TEST(ZipReader, RejectsSaturatedSizesWithoutZip64Extra) {
  BuiltZip z = build_zip(two_files());
  put_le<uint32_t>(z.bytes, z.central_offsets[0] + 24, 0xffffffffu);
  const Failure f = parse_failure(z.bytes);
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
  EXPECT_NE(f.message.find("no ZIP64 extra field"), std::string::npos) << f.message;
}

TEST(ZipReader, RejectsZip64LocatorPointingNowhere) {
  BuiltZip z = build_zip(two_files(), {.zip64 = true});
  put_le<uint64_t>(z.bytes, z.eocd_offset - 20 + 8, z.bytes.size() + 100);
  const Failure f = parse_failure(z.bytes);
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
  EXPECT_NE(f.message.find("ZIP64 locator"), std::string::npos) << f.message;
}

TEST(ZipReader, MultiDiskArchiveIsUnsupported) {
  BuiltZip z = build_zip(two_files());
  put_le<uint16_t>(z.bytes, z.eocd_offset + 4, 1);
  EXPECT_EQ(parse_failure(z.bytes).category, ErrorCategory::Unsupported);
}

TEST(ZipReader, CompressedEntryIsUnsupportedNamingIt) {
  const BuiltZip z =
      build_zip({{"arch/data.pkl", to_bytes("x")}, {"arch/data/0", to_bytes("deflated?"), 8}});
  const ZipDirectory dir = parse(z.bytes);  // the directory itself is fine
  EXPECT_EQ(text(dir.data(z.bytes, dir.entries()[0], "test.zip")), "x");
  const Failure f = failure_of([&] { dir.data(z.bytes, dir.entries()[1], "test.zip"); });
  EXPECT_EQ(f.category, ErrorCategory::Unsupported);
  EXPECT_NE(f.message.find("'arch/data/0'"), std::string::npos) << f.message;
  EXPECT_NE(f.message.find("compressed (method 8)"), std::string::npos) << f.message;
}

TEST(ZipReader, RejectsDuplicateNames) {
  const BuiltZip z = build_zip({{"arch/data/0", to_bytes("a")}, {"arch/data/0", to_bytes("b")}});
  const Failure f = parse_failure(z.bytes);
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
  EXPECT_NE(f.message.find("'arch/data/0' twice"), std::string::npos) << f.message;
}

TEST(ZipReader, RejectsNamesLeavingTheArchive) {
  for (const char* name :
       {"../evil", "arch/../../evil", "/etc/passwd", "\\evil", "C:evil", "arch/..", ""}) {
    const BuiltZip z = build_zip({{name, to_bytes("x")}});
    const Failure f = parse_failure(z.bytes);
    EXPECT_EQ(f.category, ErrorCategory::InvalidInput) << name;
    EXPECT_NE(f.message.find("zip entry named"), std::string::npos) << f.message;
  }
  // ".." inside a name is not a path component.
  EXPECT_NO_THROW(parse(build_zip({{"arch/a..b", to_bytes("x")}}).bytes));
}

TEST(ZipReader, TensorWindowIsZeroCopyAndBoundsChecked) {
  TempDir dir;
  const BuiltZip z = build_zip(two_files());
  write_file(dir / "w.zip", z.bytes);
  const ZipReader zip = ZipReader::open(dir / "w.zip");
  const Tensor t = zip.tensor_window("arch/data/0", 4, DType::F32, {2});
  EXPECT_TRUE(t.is_mapped());
  EXPECT_EQ(t.storage(), zip.storage());
  EXPECT_EQ(t.offset(), z.data_offsets[1] + 4);
  EXPECT_EQ(t.to_f32(), (std::vector<float>{2.0f, 3.0f}));

  const Failure f = failure_of([&] { zip.tensor_window("arch/data/0", 8, DType::F32, {2}); });
  EXPECT_EQ(f.category, ErrorCategory::InvalidInput);
  EXPECT_NE(f.message.find("does not fit in zip entry 'arch/data/0' (12 bytes)"), std::string::npos)
      << f.message;
  EXPECT_EQ(failure_of([&] { zip.entry("arch/data/9"); }).category, ErrorCategory::InvalidInput);
}
