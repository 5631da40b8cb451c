#include <gtest/gtest.h>

#include "exporters/atomic_file.h"
#include "exporters/onnx/onnx_exporter.h"
#include "tests/unit/exporters/onnx_test_util.h"

using namespace qforge;
using namespace qforge::testing;

TEST(AtomicFile, MissingFolderIsIOErrorNamingIt) {
  TempDir dir;
  expect_error([&] { AtomicFile f(dir / "missing" / "out.bin"); }, ErrorCategory::IO,
               {"output folder", "missing", "does not exist"});
}

TEST(AtomicFile, TempFileIsHiddenBesideTarget) {
  TempDir dir;
  AtomicFile f(dir / "out.bin");
  EXPECT_EQ(f.temp_path().parent_path(), dir.path());
  EXPECT_EQ(f.temp_path().filename().string().rfind(".out.bin.tmp-", 0), 0u) << f.temp_path();
  AtomicFile second(dir / "out.bin");
  EXPECT_NE(f.temp_path(), second.temp_path());
}

TEST(AtomicFile, CommitRenamesIntoPlaceAndReplacesOldFile) {
  TempDir dir;
  write_bytes(dir / "out.bin", "old contents");
  {
    AtomicFile f(dir / "out.bin");
    write_bytes(f.temp_path(), "new");
    EXPECT_EQ(read_bytes(dir / "out.bin"), "old contents");  // untouched until commit
    f.commit();
  }
  EXPECT_EQ(read_bytes(dir / "out.bin"), "new");
  EXPECT_EQ(list_dir(dir.path()), std::vector<std::string>{"out.bin"});
}

TEST(AtomicFile, UncommittedTempIsRemoved) {
  TempDir dir;
  {
    AtomicFile f(dir / "out.bin");
    write_bytes(f.temp_path(), "partial");
    EXPECT_EQ(list_dir(dir.path()).size(), 1u);
  }
  EXPECT_TRUE(list_dir(dir.path()).empty());
}

TEST(AtomicFile, CommitWithoutWritingIsInternalError) {
  TempDir dir;
  AtomicFile f(dir / "out.bin");
  expect_error([&] { f.commit(); }, ErrorCategory::Internal, {"out.bin"});
  EXPECT_TRUE(list_dir(dir.path()).empty());
}

TEST(AtomicFile, FailedExportLeavesNoTemporaryFiles) {
  TempDir dir;
  write_bytes(dir / "keep.onnx", "previous model");
  Graph g = make_mlp(512);
  g.nodes[2].inputs.push_back("x");  // the ONNX checker rejects this after the data is written
  OnnxExportOptions options;
  options.external_data = true;
  EXPECT_THROW(export_onnx(g, dir / "keep.onnx", options), Error);
  EXPECT_EQ(list_dir(dir.path()), std::vector<std::string>{"keep.onnx"});
  EXPECT_EQ(read_bytes(dir / "keep.onnx"), "previous model");
}
