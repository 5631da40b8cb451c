// Round trips real models (written by tests/interop/make_onnx_fixtures.py into the folder that
// QFORGE_FIXTURES names) through import_onnx -> export_onnx -> import_onnx.
#include <gtest/gtest.h>

#include <cstdlib>

#include "exporters/onnx/onnx_exporter.h"
#include "importers/onnx/onnx_importer.h"
#include "tests/unit/exporters/graph_compare.h"
#include "tests/unit/exporters/onnx_test_util.h"

using namespace qforge;
using namespace qforge::testing;

namespace {

std::vector<std::filesystem::path> fixture_models(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> models;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() == ".onnx") models.push_back(e.path());
  }
  std::sort(models.begin(), models.end());
  return models;
}

}  // namespace

TEST(OnnxFixtures, RoundTripKeepsEveryModel) {
  const char* env = std::getenv("QFORGE_FIXTURES");
  if (env == nullptr || *env == '\0') {
    GTEST_SKIP() << "QFORGE_FIXTURES is not set; run tests/interop/make_onnx_fixtures.py DIR and "
                    "set QFORGE_FIXTURES=DIR";
  }
  const auto models = fixture_models(env);
  ASSERT_FALSE(models.empty()) << "no .onnx files in QFORGE_FIXTURES=" << env;
  TempDir dir;
  for (const auto& model : models) {
    SCOPED_TRACE(model.string());
    const Graph original = import_onnx(model);
    EXPECT_FALSE(original.nodes.empty());

    export_onnx(original, dir / model.filename().string());
    expect_graph_equal(original, import_onnx(dir / model.filename().string()));

    OnnxExportOptions external;
    external.external_data = true;
    const std::string name = "ext_" + model.filename().string();
    export_onnx(original, dir / name, external);
    const Graph back = import_onnx(dir / name);
    expect_graph_equal(original, back);
    for (const auto& [tensor_name, t] : back.initializers()) {
      EXPECT_EQ(t.is_mapped(), t.nbytes() >= external.external_threshold) << tensor_name;
    }
  }
}
