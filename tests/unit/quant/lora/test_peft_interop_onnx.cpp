// A PEFT adapter merged straight into torch-exported ONNX graphs: weights kept by name, and
// anonymous transposed onnx::MatMul_N copies found by node scope or by content. The merged
// initializers must equal PEFT's merged weights, and ONNX Runtime's outputs PEFT's.
#include <gtest/gtest.h>

#include <iostream>

#include "exporters/onnx/onnx_exporter.h"
#include "importers/lora/lora_adapter.h"
#include "importers/onnx/onnx_importer.h"
#include "importers/safetensors/safetensors_reader.h"
#include "quant/lora/lora_math.h"
#include "quant/lora/lora_merge.h"
#include "quant/lora/weight_binding.h"
#include "tests/unit/quant/lora/peft_fixtures.h"

using namespace qforge;
using namespace qforge::lora_test;

namespace {

struct OnnxCase {
  const char* model;   // key in manifest["onnx"]["models"]
  bool strip_names;    // drop node names so that only content can find the MatMul copies
  const char* expect;  // the match kind of the query weights
};

class PeftOnnx : public ::testing::TestWithParam<OnnxCase> {};

}  // namespace

TEST_P(PeftOnnx, MergedInitializersEqualPeftMergedWeights) {
  QFORGE_REQUIRE_PEFT_FIXTURES();
  const auto& fx = peft_fixtures();
  const auto& m = fx.manifest["onnx"];
  const OnnxCase c = GetParam();
  Graph g = import_onnx(fx.dir / m["models"][c.model].get<std::string>());
  if (c.strip_names) {
    for (Node& n : g.nodes) n.name.clear();
  }
  const Graph reference = import_safetensors(fx.dir / m["reference"].get<std::string>());
  const Graph peft = import_safetensors(fx.dir / m["merged"].get<std::string>());
  std::vector<std::pair<std::string, WeightBinding>> bound;
  {
    const WeightBinder binder(g, BindOptions{&reference});
    for (const auto& [name, t] : peft.initializers()) {
      const BindResult r = binder.bind(name, std::span<const int64_t>(t.shape()));
      if (r.binding) bound.emplace_back(name, *r.binding);
    }
  }
  LoraMergeOptions opts;
  opts.reference = &reference;
  PassReport report;
  merge_lora(g, {{load_lora_adapter(fx.dir / m["adapter"].get<std::string>()), 1.0}}, opts, report);
  for (const auto& row : report.stats["modules"]) {
    if (row.contains("module") && row["module"].get<std::string>().ends_with("self.query")) {
      EXPECT_EQ(row["match"], c.expect) << row.dump();
    }
  }
  double worst = 0.0;
  int compared = 0;
  for (const auto& [name, b] : bound) {
    const Tensor& want = *peft.find_initializer(name);
    const Tensor& got = *g.find_initializer(b.initializer);
    auto v = got.to_f32();
    if (b.transposed) v = transpose_2d(v, got.shape()[0], got.shape()[1]);
    const auto p = want.to_f32();
    for (size_t i = 0; i < v.size(); ++i)
      worst = std::max<double>(worst, std::fabs(double(v[i]) - p[i]));
    ++compared;
  }
  std::cout << "[ PEFT     ] bert onnx (" << c.model << (c.strip_names ? ", no node names" : "")
            << "): " << compared << " weights compared, worst " << worst << " abs\n";
  EXPECT_LE(worst, 1e-6);
  EXPECT_EQ(report.stats["modules_merged"], 13);   // 2 layers x (q, k, v, 3 dense) + pooler
  EXPECT_EQ(report.stats["tensors_replaced"], 2);  // classifier weight and bias
  EXPECT_GE(compared, 26);
}

INSTANTIATE_TEST_SUITE_P(Bert, PeftOnnx,
                         ::testing::Values(OnnxCase{"named", false, "name"},
                                           OnnxCase{"anonymous", false, "node-scope"},
                                           OnnxCase{"anonymous", true, "transposed-content"}),
                         [](const auto& info) {
                           return std::string(info.param.model) +
                                  (info.param.strip_names ? "NoNodeNames" : "");
                         });

TEST(PeftInterop, OnnxRuntimeOutputsOfMergedExportMatchPeft) {
  QFORGE_REQUIRE_PEFT_FIXTURES();
  const auto& fx = peft_fixtures();
  const auto& m = fx.manifest["onnx"];
  const Graph reference = import_safetensors(fx.dir / m["reference"].get<std::string>());
  const LoraAdapter adapter = load_lora_adapter(fx.dir / m["adapter"].get<std::string>());
  for (const char* kind : {"named", "anonymous"}) {
    SCOPED_TRACE(kind);
    Graph g = import_onnx(fx.dir / m["models"][kind].get<std::string>());
    LoraMergeOptions opts;
    opts.reference = &reference;
    PassReport report;
    merge_lora(g, {{adapter, 1.0}}, opts, report);
    const auto out = fx.dir / (std::string("merged_") + kind + ".onnx");
    export_onnx(g, out);
    const std::string cmd = "\"" + fx.python + "\" \"" + std::string(QFORGE_SOURCE_DIR) +
                            "/tests/interop/fixtures/make_peft_adapters.py\" --check-onnx \"" +
                            out.string() + "\" \"" +
                            (fx.dir / m["expected"].get<std::string>()).string() + "\" 1e-5";
    std::cout << "[ PEFT     ] ONNX Runtime on merged " << kind << " export: " << std::flush;
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
}
