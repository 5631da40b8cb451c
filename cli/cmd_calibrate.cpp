// qforge calibrate MODEL --calib DATA -o table.json [--trt-cache FILE]: activation ranges of a
// model (after BatchNorm folding and clean-up, as `convert --quant int8` sees it).
#include "cli/cmd_calibrate.h"

#include <chrono>
#include <cstdio>
#include <filesystem>

#include <spdlog/spdlog.h>

#include "cli/option_parsers.h"
#include "cli/calibration_job.h"
#include "cli/report_job.h"
#include "exporters/calib_table_writer.h"
#include "importers/load_model.h"
#include "ir/error.h"
#include "ir/calib_methods.h"
#include "quant/static/pre_passes.h"

namespace qforge::cli {

namespace {

struct CalibrateParams {
  std::string input;
  std::string output;
  std::string trt_cache;
  std::string report;  // --report FILE: the HTML report
  CalibFlags calib;
  std::string device = "auto";
  int threads = 0;
};

int run_calibrate(const GlobalOptions& global, const CalibrateParams& p) {
  const auto start = std::chrono::steady_clock::now();
  for (const std::string& out : {p.output, p.trt_cache}) {
    std::error_code ec;
    if (!out.empty() && std::filesystem::weakly_canonical(out, ec) ==
                            std::filesystem::weakly_canonical(p.input, ec)) {
      fail_usage("output '" + out +
                 "' is the input model; qforge never overwrites its input, "
                 "choose another name");
    }
  }
  check_report_path(p.report, {p.input, p.output, p.trt_cache, p.calib.data});
  set_cpu_threads(p.threads);
  const Device device = resolve_device(parse_device(p.device));
  LoadedModel loaded = load_model(p.input);
  const PipelineReport pre = run_pre_calibration_passes(loaded.graph);
  PassReport report;
  CalibFlags flags = p.calib;
  flags.report_histograms = !p.report.empty();
  const CalibrationTable table =
      run_calibration(loaded.graph, flags, device, p.threads, !global.quiet, report);
  write_calibration_table_json(table, p.output);
  if (!p.trt_cache.empty()) write_tensorrt_calibration_cache(table, p.trt_cache);
  const auto result = [&](bool with_timings) {
    return Json{{"ok", true},
                {"command", "calibrate"},
                {"input", p.input},
                {"output", p.output},
                {"trt_cache", p.trt_cache.empty() ? Json() : Json(p.trt_cache)},
                {"method", table.method},
                {"samples", table.samples},
                {"dataset_digest", table.dataset_digest},
                {"tensors", table.ranges.size()},
                {"passes", pre.to_json(with_timings)},
                {"calibration", report.stats}};
  };
  if (!p.report.empty()) {
    Json document = result(false);
    document["histograms"] = calibration_histograms_json(table, p.calib.percentile, device);
    write_report(document, p.report, "the calibration of '" + p.input + "'");
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (global.json) {
    Json out = result(true);
    out["seconds"] = seconds;
    if (!p.report.empty()) out["report"] = p.report;
    print_json(out);
  } else if (!global.quiet) {
    for (const auto& w : report.warnings) spdlog::warn("calibrate: {}", w);
    std::fprintf(stderr, "wrote %s%s%s: %zu tensor ranges, %s on %lld samples in %.2f s\n",
                 p.output.c_str(), p.trt_cache.empty() ? "" : " and ", p.trt_cache.c_str(),
                 table.ranges.size(), table.method.c_str(), static_cast<long long>(table.samples),
                 seconds);
  }
  return 0;
}

}  // namespace

void add_calib_flags(CLI::App& cmd, CalibFlags& flags, bool data_required) {
  auto* data = cmd.add_option("--calib", flags.data,
                              "Calibration data: .npz, .npy or folder (calib_data/README.md)");
  if (data_required) data->required();
  std::vector<std::string> names;
  std::string help = "Calibration method:";
  for (const CalibMethodInfo& m : kCalibMethods) {
    names.emplace_back(m.name);
    help += "\n  " + std::string(m.name) + ": " + std::string(m.description);
  }
  cmd.add_option("--method", flags.method, help)->check(CLI::IsMember(names));
  cmd.add_option("--percentile", flags.percentile, "Percentile for --method percentile")
      ->check(CLI::Range(50.0, 100.0));
  cmd.add_option("--calib-size", flags.calib_size, "Calibration samples to use (0 = all)")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--batch", flags.batch, "Samples per calibration run")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd.add_option("--calib-mask", flags.mask,
                 "Token-mask input ([batch, seq], 0 = padding): calibration counts only real "
                 "tokens of activations laid out [batch, seq, ...]; auto (attention_mask when "
                 "the model has it), none, or an input name");
  cmd.add_flag("--drop-bad-samples", flags.drop_bad_samples,
               "Skip calibration samples whose float inputs hold NaN or Inf (refused otherwise)");
}

bool calib_tuning_given(const CLI::App& cmd) {
  for (const char* flag : kCalibTuningFlags) {
    if (cmd.count(flag) > 0) return true;
  }
  return false;
}

void register_calibrate(CLI::App& app, const GlobalOptions& global, RunFn& run) {
  auto p = std::make_shared<CalibrateParams>();
  auto* cmd = app.add_subcommand(
      "calibrate", "Measure activation ranges on calibration data and write a calibration table");
  cmd->add_option("MODEL", p->input, "Model (ONNX)")->required();
  cmd->add_option("-o,--output", p->output, "Calibration table to write (JSON)")->required();
  cmd->add_option("--trt-cache", p->trt_cache,
                  "Also write a TensorRT calibration cache (for trtexec --calib)");
  add_calib_flags(*cmd, p->calib, true);
  cmd->add_option("--report", p->report,
                  "Also write an HTML report: each tensor's |x| histogram with the threshold "
                  "minmax, percentile, entropy and mse choose on it, and the ranges table");
  cmd->add_option("--device", p->device, "Kernel backend: auto, cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->add_option("--threads", p->threads, "CPU threads (0 = all cores)")
      ->check(CLI::Range(0, 1024));
  cmd->footer(
      "Example: qforge calibrate calib_data/sample_cnn.onnx --calib calib_data/calib.npz "
      "--method entropy -o sample_calib.json --trt-cache sample_calib.cache --report "
      "sample_calib.html");
  cmd->callback([&global, &run, p] { run = [&global, p] { return run_calibrate(global, *p); }; });
}

}  // namespace qforge::cli
