// AtomicFolder: a folder appears whole on commit() or not at all.
#include "exporters/atomic_folder.h"

#include <gtest/gtest.h>

#include <fstream>
#include <stdexcept>

#include "tests/unit/temp_dir.h"

namespace qforge {
namespace {

namespace fs = std::filesystem;

void write(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }

std::string read(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(AtomicFolder, CommitPutsTheFolderInPlace) {
  test::TempDir dir;
  const fs::path target = dir.path() / "out";
  {
    AtomicFolder folder(target, false, "folder");
    EXPECT_EQ(folder.temp_path().parent_path(), dir.path());
    write(folder.temp_path() / "a.txt", "new");
    EXPECT_FALSE(fs::exists(target)) << "visible before commit";
    folder.commit();
  }
  EXPECT_EQ(read(target / "a.txt"), "new");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator{}), 1)
      << "only the folder is left";
}

TEST(AtomicFolder, AFailedWriteLeavesNothingAndKeepsTheOldFolder) {
  test::TempDir dir;
  const fs::path target = dir.path() / "out";
  fs::create_directory(target);
  write(target / "a.txt", "old");
  try {
    AtomicFolder folder(target, true, "folder");
    write(folder.temp_path() / "a.txt", "half");
    throw std::runtime_error("the writer failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(read(target / "a.txt"), "old");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator{}), 1)
      << "a temporary folder was left behind";
}

TEST(AtomicFolder, ReplacesAnExistingFolderWhole) {
  test::TempDir dir;
  const fs::path target = dir.path() / "out";
  fs::create_directory(target);
  write(target / "stale.txt", "old");
  {
    AtomicFolder folder(target, true, "folder");
    write(folder.temp_path() / "a.txt", "new");
    folder.commit();
  }
  EXPECT_FALSE(fs::exists(target / "stale.txt"));
  EXPECT_EQ(read(target / "a.txt"), "new");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator{}), 1);
}

}  // namespace
}  // namespace qforge
