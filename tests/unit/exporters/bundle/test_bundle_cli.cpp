// `qforge verify` and `qforge run` on a bundle written here (convert cannot write one yet):
// the binary is run as a user would run it.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>

#include "importers/onnx/onnx_importer.h"
#include "importers/dataset/npy.h"
#include "tests/unit/exporters/bundle/bundle_test_util.h"

namespace qforge::testing {
namespace {

namespace fs = std::filesystem;

int run_cli(const std::string& args) {
  const std::string cmd = std::string(QFORGE_BINARY) + " -q " + args + " >/dev/null 2>&1";
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(BundleCli, RunsAVerifiedBundleLikeItsModelAndRefusesATamperedOne) {
  if (!fs::exists(QFORGE_BINARY)) GTEST_SKIP() << "qforge binary not built: " << QFORGE_BINARY;
  TempDir tmp;
  const fs::path source = fs::path(QFORGE_SOURCE_DIR) / "calib_data";
  BundleInfo info;
  info.source_path = source / "sample_cnn.onnx";
  write_bundle(import_onnx(info.source_path), tmp / "s.qfb", info);
  const std::string inputs = " --inputs " + (source / "eval.npz").string();

  EXPECT_EQ(run_cli("verify " + (tmp / "s.qfb").string()), 0);
  ASSERT_EQ(run_cli("run " + (tmp / "s.qfb").string() + inputs + " -o " + (tmp / "b.npz").string()),
            0);
  ASSERT_EQ(
      run_cli("run " + info.source_path.string() + inputs + " -o " + (tmp / "m.npz").string()), 0);
  const auto from_bundle = read_npz(tmp / "b.npz");
  const auto from_model = read_npz(tmp / "m.npz");
  ASSERT_EQ(from_bundle.size(), 1u);
  EXPECT_EQ(from_bundle[0].first, "logits");
  EXPECT_EQ(from_bundle[0].second.shape(), (Shape{397, 10}));
  EXPECT_TRUE(from_bundle[0].second.equals(from_model[0].second));  // same graph, same bits

  std::string bytes = read_bytes(tmp / "s.qfb" / "model.onnx");
  bytes[bytes.size() / 2] = static_cast<char>(bytes[bytes.size() / 2] ^ 0x40);
  write_bytes(tmp / "s.qfb" / "model.onnx", bytes);
  EXPECT_EQ(run_cli("verify " + (tmp / "s.qfb").string()), 3);
  EXPECT_EQ(run_cli("run " + (tmp / "s.qfb").string() + inputs + " -o " + (tmp / "t.npz").string()),
            3);
  EXPECT_FALSE(fs::exists(tmp / "t.npz"));
}

}  // namespace
}  // namespace qforge::testing
