// qforge convert IN -o OUT [--quant ...]: import, run the passes the flags ask for, export.
// --quant int8: BatchNorm folding and clean-up, calibration on the folded graph (or an imported
// table), then static INT8 QDQ.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <regex>

#include <spdlog/spdlog.h>

#include "cli/app.h"
#include "cli/cmd_calibrate.h"
#include "cli/output_path.h"
#include "exporters/onnx/onnx_exporter.h"
#include "importers/calib_table_reader.h"
#include "importers/load_model.h"
#include "ir/error.h"
#include "kernels/device.h"
#include "quant/schemes.h"
#include "quant/static_int8.h"
#include "quant/weight_int8.h"

namespace qforge::cli {

namespace {

struct ConvertParams {
  std::string input;
  std::string output;
  std::string quant = "none";
  bool per_tensor = false;
  std::string exclude;
  std::vector<std::string> op_types;
  std::string device = "auto";
  int threads = 0;
  bool external_data = false;
  // --quant int8
  CalibFlags calib;
  std::string import_calib;
  bool int32_bias = false;
  std::vector<std::string> overrides;
  const CLI::App* cmd = nullptr;  // to ask which flags were given
};

const std::vector<std::string> kWeightOps = {"Conv", "ConvTranspose", "Gemm", "MatMul"};

std::optional<std::regex> exclude_regex(const std::string& pattern) {
  if (pattern.empty()) return std::nullopt;
  try {
    return std::regex(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    fail_usage("--exclude '" + pattern + "' is not a valid regular expression: " + e.what());
  }
}

// Flags that only some schemes take, checked before anything is read.
void check_scheme_flags(const ConvertParams& p, QuantScheme scheme) {
  const bool int8 = scheme == QuantScheme::Int8Static;
  const bool calib_given = !p.calib.data.empty() || !p.import_calib.empty();
  if (!int8 &&
      (calib_given || calib_tuning_given(*p.cmd) || p.int32_bias || !p.overrides.empty())) {
    fail_usage(
        "--calib, --import-calib, --method, --percentile, --calib-size, --batch, "
        "--int32-bias and --override need --quant int8");
  }
  if (scheme == QuantScheme::None && (p.per_tensor || !p.exclude.empty() || !p.op_types.empty())) {
    fail_usage("--per-tensor, --exclude and --op-types need --quant");
  }
  if (!int8) return;
  if (p.calib.data.empty() == p.import_calib.empty()) {
    fail_usage(
        "--quant int8 needs calibration ranges: give --calib DATA or --import-calib "
        "TABLE (one of them)");
  }
  if (!p.import_calib.empty() && calib_tuning_given(*p.cmd)) {
    fail_usage(
        "--method, --percentile, --calib-size and --batch tune --calib; an imported "
        "table (--import-calib) already holds its ranges");
  }
  if (p.per_tensor) {
    fail_usage(
        "--per-tensor is for --quant int8-weights; with int8 give a weight one scale "
        "with --override NAME=per-tensor");
  }
  const auto known = static_int8_op_types();
  for (const auto& op : p.op_types) {
    if (std::find(known.begin(), known.end(), op) == known.end()) {
      std::string list;
      for (auto k : known) list += (list.empty() ? "" : ", ") + std::string(k);
      std::string message = "--op-types: '" + op + "' is not quantized by --quant int8 (use ";
      message += list;
      fail_usage(message + ")");
    }
  }
}

Pipeline weight_only_pipeline(const ConvertParams& p) {
  Pipeline pipeline;
  WeightInt8Options opts;
  opts.per_tensor = p.per_tensor;
  opts.exclude = exclude_regex(p.exclude);
  opts.exclude_pattern = p.exclude;
  for (const auto& op : p.op_types) {
    if (std::find(kWeightOps.begin(), kWeightOps.end(), op) == kWeightOps.end()) {
      fail_usage("--op-types: '" + op +
                 "' has no weights to quantize (use Conv, "
                 "ConvTranspose, Gemm or MatMul)");
    }
  }
  opts.op_types = p.op_types;
  opts.device = resolve_device(parse_device(p.device));
  pipeline.add(make_weight_int8_pass(std::move(opts)));
  return pipeline;
}

StaticInt8Options static_options(const ConvertParams& p) {
  StaticInt8Options o;
  o.int32_bias = p.int32_bias;
  o.exclude = exclude_regex(p.exclude);
  o.exclude_pattern = p.exclude;
  o.op_types = p.op_types;
  for (const auto& text : p.overrides) {
    auto [name, value] = parse_tensor_override(text);
    if (!o.overrides.emplace(name, value).second) {
      fail_usage("--override gives '" + name + "' twice; give each tensor once");
    }
  }
  o.device = resolve_device(parse_device(p.device));
  return o;
}

// fold/cleanup -> calibrate (or import the table) -> QDQ; every step reported.
PipelineReport run_static_int8(const GlobalOptions& global, const ConvertParams& p,
                               StaticInt8Options options, Graph& graph) {
  PipelineReport report = run_pre_passes(graph);
  check_static_int8_options(graph, options);  // before the slow part
  PassReport calib;
  CalibrationTable table;
  if (p.import_calib.empty()) {
    table = run_calibration(graph, p.calib, options.device, p.threads, !global.quiet, calib);
  } else {
    calib.pass = "import-calib";
    table = read_calibration_table(p.import_calib);
    calib.stats["file"] = p.import_calib;
  }
  calib.stats["method"] = table.method;
  calib.stats["samples"] = table.samples;
  calib.stats["ranges"] = table.ranges.size();
  report.passes.push_back(std::move(calib));
  for (const auto& [name, range] : table.ranges) options.activation_amax[name] = range.amax;
  Pipeline quantize;
  quantize.add(make_static_int8_pass(std::move(options)));
  for (auto& pass : quantize.run(graph).passes) report.passes.push_back(std::move(pass));
  return report;
}

// One line per tensor: "[i/N] name [shape] f32 -> i8 axis 0  A KiB -> B KiB  SQNR x dB".
void print_tensor_row(size_t i, size_t n, const Json& row) {
  const auto text = [&](const char* key) {
    return row.contains(key)
               ? (row[key].is_string() ? row[key].get<std::string>() : row[key].dump())
               : std::string("?");
  };
  std::string line = "[" + std::to_string(i) + "/" + std::to_string(n) + "] " + text("name") + " " +
                     text("shape") + " " + text("dtype") + " -> i8";
  if (row.contains("axis")) {
    line += row["axis"].is_number() ? " axis " + row["axis"].dump() : " " + text("axis");
  }
  if (row.contains("bytes_before") && row.contains("bytes_after")) {
    line += "  " + human_bytes(row["bytes_before"].get<uint64_t>()) + " -> " +
            human_bytes(row["bytes_after"].get<uint64_t>());
  }
  if (row.contains("sqnr_db") && row["sqnr_db"].is_number()) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "  SQNR %.1f dB", row["sqnr_db"].get<double>());
    line += buf;
  }
  std::fprintf(stderr, "%s\n", line.c_str());
}

void print_pass_text(const PipelineReport& report) {
  for (const auto& pass : report.passes) {
    const auto& stats = pass.stats;
    // Quantized weights, one line each (calibration's per-tensor rows stay in --json).
    if (stats.contains("tensors") && pass.pass != "calibrate") {
      const size_t n = stats["tensors"].size();
      size_t i = 0;
      for (const auto& row : stats["tensors"]) {
        ++i;
        print_tensor_row(i, n, row);
      }
    }
    std::fprintf(stderr, "%s: %.3f s", pass.pass.c_str(), pass.seconds);
    for (const auto& [key, value] : stats.items()) {
      if (!value.is_array()) std::fprintf(stderr, ", %s %s", key.c_str(), value.dump().c_str());
    }
    std::fprintf(stderr, "\n");
    for (const auto& w : pass.warnings) spdlog::warn("{}: {}", pass.pass, w);
  }
}

int run_convert(const GlobalOptions& global, const ConvertParams& p) {
  const auto start = std::chrono::steady_clock::now();
  const auto scheme = parse_quant_scheme(p.quant);
  if (!scheme) fail_usage("--quant '" + p.quant + "' is not a known scheme");
  const OutputPath out = check_output_path(p.input, p.output);
  set_cpu_threads(p.threads);
  check_scheme_flags(p, *scheme);  // flags checked before any reading
  const bool int8 = *scheme == QuantScheme::Int8Static;
  const Pipeline pipeline =
      *scheme == QuantScheme::Int8Weights ? weight_only_pipeline(p) : Pipeline();
  const StaticInt8Options int8_options = int8 ? static_options(p) : StaticInt8Options();

  LoadedModel loaded = load_model(p.input);
  const uint64_t bytes_in = loaded.graph.parameter_bytes();
  spdlog::info("read {} ({}), {} nodes, {} initializers", p.input, format_name(loaded.format),
               loaded.graph.nodes.size(), loaded.graph.initializers().size());
  const PipelineReport report =
      int8 ? run_static_int8(global, p, int8_options, loaded.graph) : pipeline.run(loaded.graph);

  switch (out.kind) {
    case OutputKind::Onnx: {
      OnnxExportOptions opts;
      opts.external_data = p.external_data;
      export_onnx(loaded.graph, p.output, opts);
      break;
    }
  }
  const uint64_t bytes_out = loaded.graph.parameter_bytes();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (global.json) {
    print_json({{"ok", true},
                {"command", "convert"},
                {"input", p.input},
                {"output", p.output},
                {"quant", p.quant},
                {"weights_bytes_in", bytes_in},
                {"weights_bytes_out", bytes_out},
                {"seconds", seconds},
                {"passes", report.to_json()}});
  } else if (!global.quiet) {
    print_pass_text(report);
    std::fprintf(stderr, "wrote %s: weights %s -> %s in %.2f s\n", p.output.c_str(),
                 human_bytes(bytes_in).c_str(), human_bytes(bytes_out).c_str(), seconds);
  }
  return 0;
}

}  // namespace

void register_convert(CLI::App& app, const GlobalOptions& global, RunFn& run) {
  auto p = std::make_shared<ConvertParams>();
  auto* cmd = app.add_subcommand("convert", "Import a model, quantize it, write it out");
  cmd->add_option("IN", p->input, "Input model (ONNX)")->required();
  cmd->add_option("-o,--output", p->output, "Output file (.onnx)")->required();
  std::vector<std::string> names(kQuantSchemes.size());
  std::transform(kQuantSchemes.begin(), kQuantSchemes.end(), names.begin(),
                 [](const QuantSchemeInfo& info) { return std::string(info.name); });
  cmd->add_option("--quant", p->quant, "Quantization scheme:\n" + quant_schemes_help())
      ->check(CLI::IsMember(names));
  cmd->add_flag("--per-tensor", p->per_tensor, "One weight scale per tensor, not per channel");
  cmd->add_option("--exclude", p->exclude, "Leave nodes whose name matches this regex float");
  cmd->add_option("--op-types", p->op_types, "Only quantize these op types (comma-separated)")
      ->delimiter(',');
  add_calib_flags(*cmd, p->calib, false);
  cmd->add_option("--import-calib", p->import_calib,
                  "int8: ranges from a calibration table (JSON or TensorRT cache), not --calib");
  cmd->add_flag("--int32-bias", p->int32_bias,
                "int8: Conv/ConvTranspose/Gemm bias as int32 (scale s_input * s_weight)");
  cmd->add_option("--override", p->overrides,
                  "int8: NAME=amax:X (a tensor's range) or NAME=per-tensor (a weight's scale); "
                  "repeatable");
  p->cmd = cmd;
  cmd->add_option("--device", p->device, "Kernel backend: auto, cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->add_option("--threads", p->threads, "CPU threads (0 = all cores)")
      ->check(CLI::Range(0, 1024));
  cmd->add_flag("--external-data", p->external_data,
                "Write weights to an external data file beside the model");
  cmd->footer(
      "Examples:\n  qforge convert calib_data/sample_cnn.onnx -o sample_int8w.onnx "
      "--quant int8-weights\n  qforge convert calib_data/sample_cnn.onnx -o sample_int8.onnx "
      "--quant int8 --calib calib_data/calib.npz --method entropy");
  cmd->callback([&global, &run, p] { run = [&global, p] { return run_convert(global, *p); }; });
}

}  // namespace qforge::cli
