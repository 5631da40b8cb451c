// SafetensorsStreamWriter: tensors written on the writer's thread in the order added, the header
// written into the room the caller reserved (data never copied) or, when it does not fit, in
// front of a copy; shards; nothing left behind when destroyed before finish().
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/resource.h>

#include <csignal>
#include <cstring>
#include <fstream>
#include <string>

#include "exporters/safetensors/safetensors_stream_writer.h"
#include "importers/safetensors/safetensors_reader.h"
#include "ir/error.h"
#include "tests/unit/importers/safetensors/safetensors_test_util.h"

using namespace qforge;
using ::testing::ElementsAre;

namespace {

std::string read_file(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

uint64_t header_length(const std::string& file) {
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) {
    n |= static_cast<uint64_t>(static_cast<unsigned char>(file[i])) << (8 * i);
  }
  return n;
}

// Writes `count` tensors named by `prefix` (first value i * 100), then reads the file back.
void write_and_check(const std::filesystem::path& path, uint64_t reserve, int count,
                     const std::string& prefix, uint64_t want_data_start) {
  // want_data_start 0: the header does not fit the room and is padded to 8 bytes.
  {
    SafetensorsStreamWriter w(path, 0, {{"format", "pt"}}, reserve);
    for (int i = 0; i < count; ++i) {
      w.add(prefix + std::to_string(i), test::ramp_f32({3, 5}, i * 100.0f));
    }
    w.finish();
  }
  const std::string bytes = read_file(path);
  const uint64_t n = header_length(bytes);
  if (want_data_start == 0) {  // no room used: the header is padded to 8 bytes
    want_data_start = 8 + n;
    EXPECT_EQ(n % 8, 0u);
    EXPECT_GT(n, 4096u);
  }
  EXPECT_EQ(8 + n, want_data_start);
  EXPECT_EQ(bytes.size(), want_data_start + static_cast<uint64_t>(count) * 60);
  const std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.find_last_not_of(' '), header.rfind('}'));  // padded with spaces only
  const Graph g = import_safetensors(path);
  ASSERT_EQ(g.initializers().size(), static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    const Tensor* t = g.find_initializer(prefix + std::to_string(i));
    ASSERT_NE(t, nullptr) << i;
    EXPECT_EQ(t->data<float>()[14], i * 100.0f + 14.0f) << i;
  }
}

}  // namespace

TEST(SafetensorsStreamWriter, HeaderGoesIntoTheReservedRoomRoundedToAPage) {
  test::TempDir dir;
  write_and_check(dir / "a.safetensors", 100, 3, "t.", 4096);
  write_and_check(dir / "b.safetensors", 5000, 3, "t.", 8192);
  EXPECT_THAT(test::folder_listing(dir.path()), ElementsAre("a.safetensors", "b.safetensors"));
}

TEST(SafetensorsStreamWriter, HeaderLargerThanTheRoomIsWrittenBeforeACopy) {
  test::TempDir dir;
  const std::string longname(200, 'x');
  // 40 entries of ~270 header bytes: past one 4096-byte room, so padded to 8 instead.
  write_and_check(dir / "c.safetensors", 1, 40, longname, 0);
}

TEST(SafetensorsStreamWriter, NoRoomGivenPadsTheHeaderToEightBytes) {
  test::TempDir dir;
  {
    SafetensorsStreamWriter w(dir / "d.safetensors", 0, {});
    w.add("a", test::ramp_f32({2}, 1.0f));
    w.finish();
  }
  const std::string bytes = read_file(dir / "d.safetensors");
  EXPECT_EQ(header_length(bytes) % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + header_length(bytes) + 8);
}

TEST(SafetensorsStreamWriter, ShardsWithRoomAndNothingLeftWhenNotFinished) {
  test::TempDir dir;
  {
    SafetensorsStreamWriter w(dir / "model.safetensors", 120, {{"format", "pt"}}, 1);
    for (int i = 0; i < 5; ++i) {
      w.add("layer." + std::to_string(i), test::ramp_f32({3, 5}, i * 100.0f));
    }
    w.finish();
  }
  EXPECT_THAT(test::folder_listing(dir.path()),
              ElementsAre("model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                          "model-00003-of-00003.safetensors", "model.safetensors.index.json"));
  const Graph g = import_safetensors_index(dir / "model.safetensors.index.json");
  ASSERT_EQ(g.initializers().size(), 5u);
  EXPECT_EQ(g.find_initializer("layer.4")->data<float>()[0], 400.0f);
  EXPECT_EQ(header_length(read_file(dir / "model-00003-of-00003.safetensors")), 4096u - 8);

  test::TempDir other;
  {
    SafetensorsStreamWriter w(other / "model.safetensors", 0, {}, 4096);
    w.add("a", test::ramp_f32({1000}, 0.0f));
    w.add("b", test::ramp_f32({1000}, 1.0f));
  }
  EXPECT_TRUE(test::folder_listing(other.path()).empty());
}

// A write that fails on the writer's thread (here: past a file size limit, as a full disk would)
// comes back as an IO error from add() or finish(), and nothing is left in the folder.
TEST(SafetensorsStreamWriter, AFailedWriteOnItsThreadIsThrownAndLeavesNothing) {
  test::TempDir dir;
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = old;
  small.rlim_cur = 64 * 1024;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  ErrorCategory got = ErrorCategory::Internal;
  bool threw = false;
  try {
    SafetensorsStreamWriter w(dir / "m.safetensors", 0, {}, 4096);
    for (int i = 0; i < 16; ++i) {  // 256 KiB in all
      std::string name = "t";
      name += std::to_string(i);
      w.add(name, test::ramp_f32({4096}, 0.0f));
    }
    w.finish();
  } catch (const Error& e) {
    threw = true;
    got = e.category();
  }
  setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_TRUE(threw);
  EXPECT_EQ(got, ErrorCategory::IO);
  EXPECT_TRUE(test::folder_listing(dir.path()).empty());
}
