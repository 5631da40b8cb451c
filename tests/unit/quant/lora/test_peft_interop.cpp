// qforge's merge against PEFT's merge_and_unload() on real adapters (see peft_fixtures.h):
// f32 within 1e-6 max abs, f16/bf16 within one unit in the last place.
#include <gtest/gtest.h>

#include <iostream>

#include "importers/lora/lora_adapter.h"
#include "importers/safetensors/safetensors_reader.h"
#include "importers/torch/torch_reader.h"
#include "quant/lora/lora_merge.h"
#include "tests/unit/quant/lora/peft_fixtures.h"

using namespace qforge;
using namespace qforge::lora_test;

namespace {

std::vector<WeightedAdapter> adapters_of(const nlohmann::json& c,
                                         const std::filesystem::path& dir) {
  std::vector<WeightedAdapter> out;
  for (const auto& a : c["adapters"]) {
    out.push_back(
        {load_lora_adapter(dir / a["path"].get<std::string>()), a["weight"].get<double>()});
  }
  return out;
}

// PEFT's own half-precision merge where it rounds more than once (the manifest's
// "peft_rounding"), rebuilt with qforge: "per-adapter" merges one adapter at a time (each
// merge rounds once); "embedding-delta" rounds the embedding delta to the weight's dtype
// (merged into zeros) before adding it.
Graph emulate_peft_half(const nlohmann::json& c, const Graph& base,
                        const std::vector<WeightedAdapter>& adapters, const Graph& ours) {
  const std::string how = c.value("peft_rounding", "");
  if (how == "per-adapter") {
    Graph g = base;
    for (const auto& wa : adapters) {
      PassReport r;
      merge_lora(g, {wa}, {}, r);
    }
    return g;
  }
  Graph g = ours;
  if (how != "embedding-delta") return g;
  Graph zeros;
  for (const auto& [name, t] : base.initializers())
    zeros.set_initializer(name, Tensor(t.dtype(), t.shape()));
  std::vector<WeightedAdapter> factors_only = adapters;
  for (auto& wa : factors_only) wa.adapter.replacements.clear();
  PassReport r;
  merge_lora(zeros, factors_only, {}, r);
  for (const auto& row : r.stats["modules"]) {
    if (row["kind"] != "embedding") continue;
    const std::string name = row["initializer"];
    const Tensor& w = *base.find_initializer(name);
    const auto wv = w.to_f32();
    auto dv = zeros.find_initializer(name)->to_f32();  // the delta, rounded once
    for (size_t i = 0; i < dv.size(); ++i) dv[i] += wv[i];
    g.set_initializer(name, Tensor::from_f32(dv, w.shape(), w.dtype()));
  }
  return g;
}

void report_worst(const std::string& name, const std::string& against, const Worst& w,
                  const char* unit) {
  std::cout << "[ PEFT     ] " << name << " vs " << against << ": ";
  if (w.value == 0.0) {
    std::cout << "bit-identical";
  } else {
    std::cout << "worst " << w.value << " " << unit << " in '" << w.tensor << "'";
  }
  std::cout << ", " << w.changed << " tensors changed\n";
  ::testing::Test::RecordProperty(name + " vs " + against,
                                  std::to_string(w.value) + " " + unit + " in " + w.tensor);
}

// Merges every case of `dtype` and checks it against PEFT; returns how many ran.
// f32: within `tolerance` max abs of PEFT's merge. f16/bf16: within `tolerance` ulp of PEFT's
// merge done in fp32 and rounded once (qforge's contract), and within `tolerance` ulp of PEFT's
// native half-precision merge once PEFT's extra roundings are rebuilt (emulate_peft_half).
int check_cases(const std::string& dtype, double tolerance, const char* unit) {
  const auto& fx = peft_fixtures();
  int ran = 0;
  for (const auto& c : fx.manifest["cases"]) {
    if (c["dtype"] != dtype) continue;
    const std::string name = c["name"];
    SCOPED_TRACE(name);
    const Graph original = import_safetensors(fx.dir / c["base"].get<std::string>());
    const std::vector<WeightedAdapter> adapters = adapters_of(c, fx.dir);
    Graph ours = original;
    PassReport report;
    merge_lora(ours, adapters, {}, report);
    EXPECT_GT(report.stats["modules_merged"].get<int>(), 0);
    const Graph peft = import_safetensors(fx.dir / c["merged"].get<std::string>());
    if (dtype == "f32") {
      const Worst w = compare_state_dicts(ours, peft, original);
      report_worst(name, "PEFT", w, unit);
      EXPECT_LE(w.value, tolerance) << "worst tensor '" << w.tensor << "'";
      EXPECT_GT(w.changed, 0) << "the fixture's merge changed nothing";
    } else {
      const Graph once = import_safetensors(fx.dir / c["merged_once"].get<std::string>());
      const Worst w = compare_state_dicts(ours, once, original);
      report_worst(name, "PEFT fp32 merge rounded once", w, unit);
      EXPECT_LE(w.value, tolerance) << "worst tensor '" << w.tensor << "'";
      EXPECT_GT(w.changed, 0) << "the fixture's merge changed nothing";
      const Worst native =
          compare_state_dicts(emulate_peft_half(c, original, adapters, ours), peft, original);
      report_worst(name,
                   std::string("PEFT native ") + dtype +
                       (c.contains("peft_rounding")
                            ? " (" + c["peft_rounding"].get<std::string>() + " rounding rebuilt)"
                            : ""),
                   native, unit);
      EXPECT_LE(native.value, tolerance) << "worst tensor '" << native.tensor << "'";
    }
    ++ran;
  }
  return ran;
}

}  // namespace

TEST(PeftInterop, F32MergesMatchPeftWithin1e6) {
  QFORGE_REQUIRE_PEFT_FIXTURES();
  EXPECT_GE(check_cases("f32", 1e-6, "abs"), 11);
}

TEST(PeftInterop, F16MergesMatchPeftWithinOneUlp) {
  QFORGE_REQUIRE_PEFT_FIXTURES();
  EXPECT_GE(check_cases("f16", 1, "ulp"), 10);
}

TEST(PeftInterop, Bf16MergesMatchPeftWithinOneUlp) {
  QFORGE_REQUIRE_PEFT_FIXTURES();
  EXPECT_GE(check_cases("bf16", 1, "ulp"), 10);
}

TEST(PeftInterop, TorchSaveBaseAndAdapterBinMergeLikeSafetensors) {
  QFORGE_REQUIRE_PEFT_FIXTURES();
  const auto& fx = peft_fixtures();
  int ran = 0;
  for (const auto& c : fx.manifest["cases"]) {
    if (!c.contains("base_bin")) continue;
    const LoraAdapter a = load_lora_adapter(fx.dir / c["adapters"][0]["path"].get<std::string>());
    ASSERT_FALSE(a.modules.empty());
    Graph base = import_torch(fx.dir / c["base_bin"].get<std::string>());
    const Graph original = base;
    PassReport report;
    merge_lora(base, {{a, 1.0}}, {}, report);
    const Worst w = compare_state_dicts(
        base, import_safetensors(fx.dir / c["merged"].get<std::string>()), original);
    std::cout << "[ PEFT     ] " << c["name"].get<std::string>() << " (torch.save): worst "
              << w.value << " abs\n";
    EXPECT_LE(w.value, 1e-6) << w.tensor;
    EXPECT_GT(w.changed, 0);
    ++ran;
  }
  EXPECT_EQ(ran, 1);
}

TEST(PeftInterop, ReportNamesPatternsAndMatchKinds) {
  QFORGE_REQUIRE_PEFT_FIXTURES();
  const auto& fx = peft_fixtures();
  Graph base = import_safetensors(fx.dir / "llama_patterns_f32/base.safetensors");
  PassReport report;
  merge_lora(base, {{load_lora_adapter(fx.dir / "llama_patterns_f32"), 1.0}}, {}, report);
  int from_rank_pattern = 0;
  int from_alpha_pattern = 0;
  for (const auto& row : report.stats["modules"]) {
    EXPECT_EQ(row["match"], "name");
    from_rank_pattern += row["r_from"].get<std::string>().starts_with("rank_pattern") ? 1 : 0;
    from_alpha_pattern += row["alpha_from"].get<std::string>().starts_with("alpha_pattern") ? 1 : 0;
    if (row["module"] == "model.layers.1.mlp.down_proj") {
      EXPECT_EQ(row["r"], 2);
    }
    if (row["module"] == "model.layers.0.self_attn.o_proj") {
      EXPECT_DOUBLE_EQ(row["alpha"].get<double>(), 64.0);
    }
  }
  EXPECT_EQ(from_rank_pattern, 3);   // two q_proj, one down_proj
  EXPECT_EQ(from_alpha_pattern, 3);  // two v_proj, one o_proj
}
