// qforge compare FLOAT QUANT --data DATA: how far a quantized model's outputs and intermediate
// values are from the float model's on the same data, with optional accuracy gates.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "cli/app.h"
#include "cli/progress.h"
#include "cli/report_job.h"
#include "importers/dataset/dataset.h"
#include "importers/load_model.h"
#include "ir/error.h"
#include "kernels/device.h"
#include "quant/calib/calibration.h"
#include "quant/calib/model_comparison.h"
#include "quant/calib/token_mask.h"
#include "quant/calib/quant_error.h"

namespace qforge::cli {

namespace {

struct CompareParams {
  std::string float_model;
  std::string quant_model;
  std::string data;
  int64_t samples = 0;
  int64_t batch = 32;
  int threads = 0;
  std::optional<double> min_sqnr;
  std::optional<double> min_cosine;
  bool drop_bad_samples = false;
  std::string mask = "auto";
  bool json = false;
  std::string report;  // --report FILE: the HTML report
};

// Non-finite figures become "inf" / "-inf" where print_json writes them (ir/json_number.h).
Json comparison_json(const ValueComparison& c) {
  Json j = {{"name", c.name},
            {"sqnr_db", c.error.sqnr_db()},
            {"cosine", c.error.cosine()},
            {"max_abs_error", c.error.max_abs}};
  if (c.error.nonfinite_mismatches > 0) j["nonfinite_mismatches"] = c.error.nonfinite_mismatches;
  if (c.top1_total > 0) j["top1_agreement"] = double(c.top1_same) / double(c.top1_total);
  if (c.labelled > 0) {
    j["top1_accuracy_float"] = double(c.right_float) / double(c.labelled);
    j["top1_accuracy_quant"] = double(c.right_quant) / double(c.labelled);
  }
  return j;
}

std::string figure_text(double v, const char* format) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

constexpr size_t kWorstShown = 20;

void print_text(const CompareParams& p, const ModelComparison& result) {
  std::printf("compare: %s vs %s on %lld samples of %s\n", p.float_model.c_str(),
              p.quant_model.c_str(), static_cast<long long>(result.samples), p.data.c_str());
  std::printf("%-32s %10s %10s %12s %10s\n", "output", "SQNR dB", "cosine", "max abs err",
              "top-1 agr");
  for (const ValueComparison& o : result.outputs) {
    std::string top1 = "-";
    if (o.top1_total > 0) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.2f%%",
                    100.0 * double(o.top1_same) / double(o.top1_total));
      top1 = buf;
    }
    std::printf("%-32s %10s %10.6f %12s %10s\n", o.name.c_str(),
                figure_text(o.error.sqnr_db(), "%.2f").c_str(), o.error.cosine(),
                figure_text(o.error.max_abs, "%.6g").c_str(), top1.c_str());
    if (o.labelled > 0) {
      std::printf("  top-1 accuracy against labels: float %.2f%%, quantized %.2f%%\n",
                  100.0 * double(o.right_float) / double(o.labelled),
                  100.0 * double(o.right_quant) / double(o.labelled));
    }
  }
  // The layers come worst first with the identical ones last; those are never listed.
  const auto identical = static_cast<size_t>(
      std::count_if(result.layers.begin(), result.layers.end(),
                    [](const ValueComparison& l) { return l.error.exact(); }));
  const size_t shown = std::min(kWorstShown, result.layers.size() - identical);
  std::printf("per-layer SQNR, worst %zu of %zu values both models compute (%zu identical):\n",
              shown, result.layers.size(), identical);
  for (size_t i = 0; i < shown; ++i) {
    const ValueComparison& l = result.layers[i];
    std::printf("  %-40s %10s dB  cosine %.6f  max abs %s\n", l.name.c_str(),
                figure_text(l.error.sqnr_db(), "%.2f").c_str(), l.error.cosine(),
                figure_text(l.error.max_abs, "%.6g").c_str());
  }
}

// The first gate an output fails, as one line, or "".
std::string check_gates(const CompareParams& p, const std::vector<ValueComparison>& outputs) {
  for (const ValueComparison& o : outputs) {
    if (p.min_sqnr && !(o.error.sqnr_db() >= *p.min_sqnr)) {
      char limit[32];
      std::snprintf(limit, sizeof limit, "%g", *p.min_sqnr);
      return "compare: output '" + o.name + "' SQNR " + figure_text(o.error.sqnr_db(), "%.2f") +
             " dB is below --fail-below-sqnr " + limit;
    }
    if (p.min_cosine && !(o.error.cosine() >= *p.min_cosine)) {
      char buf[512];
      std::snprintf(buf, sizeof buf,
                    "compare: output '%s' cosine %.6f is below --fail-below-cosine %g",
                    o.name.c_str(), o.error.cosine(), *p.min_cosine);
      return buf;
    }
  }
  return "";
}

int run_compare(const GlobalOptions& global, const CompareParams& p) {
  check_report_path(p.report, {p.float_model, p.quant_model, p.data});
  set_cpu_threads(p.threads);
  const LoadedModel ref = load_model(p.float_model);
  const LoadedModel quant = load_model(p.quant_model);
  Dataset data(p.data, calibration_inputs(ref.graph), p.samples, p.batch, "comparison data",
               p.drop_bad_samples ? BadSamples::Drop : BadSamples::Refuse);
  Progress progress("compare", "samples", !global.quiet);
  ModelCompareOptions options;
  options.threads = p.threads;
  options.float_name = p.float_model;
  options.quant_name = p.quant_model;
  options.mask_input = resolve_mask_input(ref.graph, p.mask);
  options.progress = [&progress](int64_t done, int64_t total) { progress.update(done, total); };
  const ModelComparison result = compare_models(ref.graph, quant.graph, data, options);
  progress.finish();

  const std::string gate = check_gates(p, result.outputs);
  Json out_json = Json::array();
  for (const ValueComparison& o : result.outputs) out_json.push_back(comparison_json(o));
  Json layer_json = Json::array();
  for (const ValueComparison& l : result.layers) layer_json.push_back(comparison_json(l));
  Json document = {{"ok", gate.empty()},
                   {"command", "compare"},
                   {"float", p.float_model},
                   {"quantized", p.quant_model},
                   {"data", p.data},
                   {"samples", result.samples},
                   {"mask", options.mask_input.empty() ? Json() : Json(options.mask_input)},
                   {"outputs", std::move(out_json)},
                   {"layers", std::move(layer_json)},
                   {"gate_failed", gate.empty() ? Json() : Json(gate)}};
  if (!p.report.empty()) {
    write_report(document, p.report, "the comparison of '" + p.quant_model + "'");
    document["report"] = p.report;
  }
  if (global.json || p.json) {
    print_json(document);
  } else {
    print_text(p, result);
  }
  if (!gate.empty()) {
    std::fprintf(stderr, "qforge: error: %s\n", gate.c_str());
    return exit_code(ErrorCategory::GateFailed);
  }
  return 0;
}

}  // namespace

void register_compare(CLI::App& app, const GlobalOptions& global, RunFn& run) {
  auto p = std::make_shared<CompareParams>();
  auto* cmd = app.add_subcommand(
      "compare", "Measure how far a quantized model is from its float original on data");
  cmd->add_option("FLOAT", p->float_model, "The float model (ONNX)")->required();
  cmd->add_option("QUANT", p->quant_model, "Its quantized version (ONNX)")->required();
  cmd->add_option("--data", p->data, "Data (.npz, .npy, folder; see calib_data/README.md)")
      ->required();
  cmd->add_option("--samples", p->samples, "Samples to use (0 = all)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--batch", p->batch, "Samples per run")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--threads", p->threads, "CPU threads (0 = all cores)")
      ->check(CLI::Range(0, 1024));
  cmd->add_option("--fail-below-sqnr", p->min_sqnr,
                  "Exit 6 when an output's SQNR (dB) is below this");
  cmd->add_option("--fail-below-cosine", p->min_cosine,
                  "Exit 6 when an output's cosine similarity is below this");
  cmd->add_flag("--drop-bad-samples", p->drop_bad_samples,
                "Skip samples whose float inputs hold NaN or Inf (refused otherwise)");
  cmd->add_option("--calib-mask", p->mask,
                  "Token-mask input ([batch, seq], 0 = padding): outputs and values laid out "
                  "[batch, seq, ...] are compared over real tokens only; auto (attention_mask "
                  "when the model has it), none, or an input name");
  cmd->add_flag("--json", p->json, "Print one JSON object on stdout (every layer)");
  cmd->add_option("--report", p->report,
                  "Also write an HTML report: per-output figures and per-layer SQNR and cosine "
                  "bars, worst first (written even when a gate fails)");
  cmd->footer(
      "Example: qforge compare calib_data/sample_cnn.onnx sample_int8.onnx "
      "--data calib_data/eval.npz --fail-below-cosine 0.99 --report compare.html");
  cmd->callback([&global, &run, p] { run = [&global, p] { return run_compare(global, *p); }; });
}

}  // namespace qforge::cli
