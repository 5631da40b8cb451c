// Conformance: runs the ONNX backend node tests through import_onnx + Executor and compares
// with their expected outputs. Enabled when QFORGE_ONNX_NODE_TESTS names the node/ folder that
// tests/interop/runtime_make_node_data.sh writes. A test whose model uses an op the runtime
// lacks, or that the runtime refuses as Unsupported (a dtype, a training mode), is skipped and
// counted with its reason; any other outcome that is not a match fails.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "importers/onnx/onnx_importer.h"
#include "importers/onnx/onnx_tensor.h"
#include "tests/unit/runtime/runtime_test_util.h"

using namespace qforge;
namespace fs = std::filesystem;

namespace {

// Tests left out on purpose, each outside the runtime's scope as the issue draws it. Every
// entry says why; anything not listed here must pass or be refused as Unsupported.
const std::map<std::string, std::string> kDenyList = {
    // Cast/CastLike to and from strings: the IR has no string dtype, yet these models declare
    // only numeric graph inputs, so the importer accepts them.
};

// Tests whose expected values are written with fewer digits than the rtol of 1e-4
// needs; they are still compared, at the tolerance onnx's own runner uses for them (1e-3).
const std::map<std::string, std::string> kRoundedExpectations = {
    {"test_averagepool_2d_ceil_last_window_starts_on_pad",
     "expected outputs are typed in with 4 decimals (0.1511 for the exact 0.151056)"},
};

struct Outcome {
  enum Kind { Passed, Failed, Skipped } kind = Passed;
  std::string reason;  // what skip counts group by
  std::string detail;  // the full message, printed with QFORGE_ONNX_NODE_TESTS_VERBOSE
};

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Tensor read_pb(const fs::path& p, OnnxTensorReader& reader) {
  onnx::TensorProto proto;
  if (!proto.ParseFromString(read_file(p))) fail_invalid("cannot parse " + p.string());
  return reader.read(proto, p.filename().string());
}

// Element-wise comparison; floats within atol + rtol * |expected| (NaN matches NaN).
std::string compare(const Tensor& got, const Tensor& want, const std::string& name,
                    bool rounded_expectation) {
  if (got.dtype() != want.dtype()) {
    return name + ": dtype " + std::string(dtype_name(got.dtype())) + ", expected " +
           std::string(dtype_name(want.dtype()));
  }
  if (got.shape() != want.shape()) {
    return name + ": shape " + shape_to_string(got.shape()) + ", expected " +
           shape_to_string(want.shape());
  }
  if (!dtype_is_float(want.dtype())) {
    return got.equals(want) ? "" : name + ": values differ (exact comparison)";
  }
  // f32/f64 by the tolerances; half types carry ~3 decimal digits (f16 epsilon 9.8e-4,
  // bf16 7.8e-3), so they are held to what their precision allows.
  double rtol = 1e-4, atol = 1e-5;
  if (want.dtype() == DType::F16) rtol = atol = 1e-3;
  if (want.dtype() == DType::BF16) rtol = atol = 1e-2;
  if (rounded_expectation) rtol = std::max(rtol, 1e-3);
  std::vector<double> g, w;
  if (want.dtype() == DType::F64) {
    g.assign(got.data<double>().begin(), got.data<double>().end());
    w.assign(want.data<double>().begin(), want.data<double>().end());
  } else {
    for (float v : got.to_f32()) g.push_back(v);
    for (float v : want.to_f32()) w.push_back(v);
  }
  for (size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(w[i]) && std::isnan(g[i])) continue;
    if (std::isinf(w[i]) && g[i] == w[i]) continue;
    if (!(std::fabs(g[i] - w[i]) <= atol + rtol * std::fabs(w[i]))) {
      return name + "[" + std::to_string(i) + "] = " + std::to_string(g[i]) + ", expected " +
             std::to_string(w[i]);
    }
  }
  return "";
}

Outcome run_case(const fs::path& dir, const std::set<std::string>& supported) {
  Graph g;
  try {
    g = import_onnx(dir / "model.onnx");
  } catch (const Error& e) {
    return {Outcome::Skipped, "import: " + std::string(category_name(e.category())), e.what()};
  }
  for (const Node& n : g.nodes) {
    const std::string op =
        n.domain.empty() || n.domain == "ai.onnx" ? n.op_type : n.domain + "." + n.op_type;
    if (!supported.count(op)) return {Outcome::Skipped, "op " + op};
  }
  if (const auto it = kDenyList.find(dir.filename().string()); it != kDenyList.end()) {
    return {Outcome::Skipped, "deny-list"};
  }
  try {
    Executor ex(g, {.threads = 2});
    OnnxTensorReader reader(dir, (dir / "model.onnx").string());
    for (int set = 0;; ++set) {
      const fs::path ds = dir / ("test_data_set_" + std::to_string(set));
      if (!fs::is_directory(ds)) {
        if (set == 0) return {Outcome::Failed, "no test_data_set_0"};
        break;
      }
      std::vector<std::pair<std::string, Tensor>> feeds;
      for (size_t j = 0; fs::exists(ds / ("input_" + std::to_string(j) + ".pb")); ++j) {
        if (j >= g.inputs.size()) return {Outcome::Failed, "more inputs than graph inputs"};
        feeds.emplace_back(g.inputs[j].name,
                           read_pb(ds / ("input_" + std::to_string(j) + ".pb"), reader));
      }
      const auto outs = ex.run(feeds);
      for (size_t j = 0; j < outs.size(); ++j) {
        const fs::path want = ds / ("output_" + std::to_string(j) + ".pb");
        if (!fs::exists(want)) return {Outcome::Failed, "missing " + want.filename().string()};
        const std::string diff = compare(outs[j], read_pb(want, reader), g.outputs[j].name,
                                         kRoundedExpectations.count(dir.filename().string()) > 0);
        if (!diff.empty()) return {Outcome::Failed, diff};
      }
    }
  } catch (const Error& e) {
    if (e.category() == ErrorCategory::Unsupported) {
      return {Outcome::Skipped, "runtime: Unsupported", e.what()};
    }
    return {Outcome::Failed, std::string(category_name(e.category())) + ": " + e.what()};
  } catch (const std::exception& e) {
    return {Outcome::Failed, std::string("exception: ") + e.what()};
  }
  return {Outcome::Passed, ""};
}

}  // namespace

TEST(OnnxBackendNodes, SupportedTestsPass) {
  const char* env = std::getenv("QFORGE_ONNX_NODE_TESTS");
  if (env == nullptr || *env == '\0') {
    GTEST_SKIP() << "QFORGE_ONNX_NODE_TESTS not set: run tests/interop/runtime_make_node_data.sh "
                    "DIR and set QFORGE_ONNX_NODE_TESTS=DIR/node";
  }
  std::vector<fs::path> dirs;
  for (const auto& e : fs::directory_iterator(env)) {
    if (e.is_directory() && fs::exists(e.path() / "model.onnx")) dirs.push_back(e.path());
  }
  ASSERT_FALSE(dirs.empty()) << "no node tests under QFORGE_ONNX_NODE_TESTS=" << env;
  std::sort(dirs.begin(), dirs.end());
  const auto ops = Executor::supported_ops();
  const std::set<std::string> supported(ops.begin(), ops.end());

  const char* verbose = std::getenv("QFORGE_ONNX_NODE_TESTS_VERBOSE");
  size_t passed = 0;
  std::vector<std::pair<std::string, std::string>> failed;
  std::map<std::string, size_t> skipped;  // reason -> count
  size_t skipped_total = 0;
  for (const auto& dir : dirs) {
    const Outcome o = run_case(dir, supported);
    const std::string name = dir.filename().string();
    if (verbose != nullptr) {
      std::cout << name << ": " << (o.kind == Outcome::Passed ? "pass" : o.reason)
                << (o.detail.empty() ? "" : " (" + o.detail + ")") << "\n";
    }
    if (o.kind == Outcome::Passed) ++passed;
    if (o.kind == Outcome::Failed) failed.emplace_back(name, o.reason);
    if (o.kind == Outcome::Skipped) {
      ++skipped[o.reason];
      ++skipped_total;
    }
  }
  std::cout << "ONNX node tests: " << passed << " passed, " << failed.size() << " failed, "
            << skipped_total << " skipped (of " << dirs.size() << ")\n";
  std::vector<std::pair<size_t, std::string>> reasons;
  for (const auto& [r, n] : skipped) reasons.emplace_back(n, r);
  std::sort(reasons.rbegin(), reasons.rend());
  std::cout << "skip reasons:";
  for (size_t i = 0; i < reasons.size() && i < 25; ++i) {
    std::cout << (i ? ", " : " ") << reasons[i].second << " x" << reasons[i].first;
  }
  if (reasons.size() > 25) std::cout << ", ... (" << reasons.size() - 25 << " more)";
  std::cout << "\n";
  for (const auto& [name, why] : failed) std::cout << "FAILED " << name << ": " << why << "\n";
  EXPECT_TRUE(failed.empty()) << failed.size() << " supported node tests failed (listed above)";
  EXPECT_GT(passed, 0u);
}
