#include "exporters/write_pieces.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

namespace qforge {
namespace {

// 3.5 pieces of distinct bytes: the piece edges would show a lost, repeated or shifted piece.
std::vector<char> payload() {
  std::vector<char> v(kWritePiece * 7 / 2 + 3);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<char>((i * 131 + i / 4096) & 0xff);
  return v;
}

TEST(WritePieces, FwriteWritesEveryByteInOrder) {
  const auto path = std::filesystem::temp_directory_path() / "qforge_write_pieces_test.bin";
  const std::vector<char> data = payload();
  std::FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(fwrite_pieces(f, data.data(), data.size()));
  EXPECT_TRUE(fwrite_pieces(f, data.data(), 0));
  ASSERT_EQ(std::fclose(f), 0);
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> back((std::istreambuf_iterator<char>(in)), {});
  std::filesystem::remove(path);
  EXPECT_EQ(back, data);
}

TEST(WritePieces, FwriteReportsAFullDevice) {
  std::FILE* f = std::fopen("/dev/full", "wb");
  if (f == nullptr) GTEST_SKIP() << "/dev/full cannot be opened here";
  const std::vector<char> data = payload();
  EXPECT_FALSE(fwrite_pieces(f, data.data(), data.size()));
  std::fclose(f);
}

TEST(WritePieces, OstreamWritesEveryByteInOrderAndStopsOnFailure) {
  const std::vector<char> data = payload();
  std::ostringstream out;
  ostream_write_pieces(out, data.data(), data.size());
  ASSERT_TRUE(out.good());
  EXPECT_EQ(out.str(), std::string(data.begin(), data.end()));

  std::ostringstream failed;
  failed.setstate(std::ios::badbit);
  ostream_write_pieces(failed, data.data(), data.size());
  EXPECT_TRUE(failed.str().empty());
}

}  // namespace
}  // namespace qforge
