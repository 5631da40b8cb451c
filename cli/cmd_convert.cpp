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
#include "cli/job/job_config.h"
#include "cli/output_path.h"
#include "exporters/onnx/onnx_exporter.h"
#include "exporters/bundle/bundle_writer.h"
#include "exporters/safetensors/safetensors_writer.h"
#include "importers/calib_table_reader.h"
#include "importers/dataset/dataset.h"
#include "importers/load_model.h"
#include "ir/error.h"
#include "kernels/device.h"
#include "importers/lora/lora_adapter.h"
#include "quant/float16_convert.h"
#include "quant/lora_merge.h"
#include "quant/awq.h"
#include "quant/gptq.h"
#include "quant/calibration.h"
#include "quant/schemes.h"
#include "quant/static_int8.h"
#include "quant/w4a16.h"
#include "quant/weight_binding.h"
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
  uint64_t max_shard_size = 0;
  std::vector<std::string> lora;  // PATH[:WEIGHT], applied in order
  bool allow_unmatched = false;
  std::string weights;    // a checkpoint whose tensors replace the graph's weights
  std::string reference;  // the checkpoint the graph was exported from, for content matching
  // --quant int8
  CalibFlags calib;
  std::string import_calib;
  bool int32_bias = false;
  std::vector<std::string> overrides;
  // --quant w4a16
  int block_size = 128;
  std::string int4_format = "onnx-blocked";
  // activations: "" = the scheme's default (fp16 for w4a16, else fp32)
  std::string act_dtype;
  std::string keep_fp32;  // "" = default_keep_fp32_ops()
  std::string w4_method = "rtn";  // rtn, awq or gptq (awq and gptq calibrate on --calib)
  std::string w4_scale;           // mse or amax; "" = the method's default
  bool overwrite = false;         // .qfb output: replace an existing bundle
  std::string config;             // --config FILE: options from a job file
  const CLI::App* cmd = nullptr;  // to ask which flags were given
};

// Files that passes need are read here, before the pipeline runs: a pass never reads a file.
struct ConvertInputs {
  std::vector<WeightedAdapter> adapters;
  std::shared_ptr<Graph> weights;
  std::shared_ptr<Graph> reference;
};

ConvertInputs load_convert_inputs(const ConvertParams& p) {
  ConvertInputs in;
  for (const auto& spec_text : p.lora) {
    const AdapterSpec spec = parse_adapter_spec(spec_text);
    in.adapters.push_back({load_lora_adapter(spec.path), spec.weight});
  }
  if (!p.weights.empty()) in.weights = std::make_shared<Graph>(load_model(p.weights).graph);
  if (!p.reference.empty()) {
    in.reference = std::make_shared<Graph>(load_model(p.reference).graph);
  }
  return in;
}

void add_weight_passes(Pipeline& pipeline, const ConvertParams& p, const ConvertInputs& in) {
  if (in.weights) {
    BindOptions opts;
    opts.reference = in.reference.get();
    opts.allow_unmatched = p.allow_unmatched;
    pipeline.add(make_function_pass("bind-weights", [weights = in.weights, reference = in.reference,
                                                     opts](Graph& g, PassReport& r) {
      bind_weights(g, *weights, opts, r);
    }));
  }
  if (!in.adapters.empty()) {
    LoraMergeOptions opts;
    opts.reference = in.reference.get();
    opts.allow_unmatched = p.allow_unmatched;
    // cuBLAS for the B.A products only when asked for: auto keeps the CPU's exact sum order.
    opts.device = parse_device(p.device) == Device::Cuda ? resolve_device(Device::Cuda) : Device::Cpu;
    pipeline.add(make_lora_merge_pass(in.adapters, opts));
  }
}

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
  const bool w4 = scheme == QuantScheme::W4A16;
  if (!w4 && p.cmd->count("--w4-method") > 0) fail_usage("--w4-method needs --quant w4a16");
  if (!w4 && p.cmd->count("--w4-scale") > 0) fail_usage("--w4-scale needs --quant w4a16");
  const W4Method w4_method = w4 ? parse_w4_method(p.w4_method) : W4Method::Rtn;
  if (w4_method == W4Method::Awq || w4_method == W4Method::Gptq) {
    const std::string m(w4_method_name(w4_method));
    if (p.calib.data.empty()) {
      const char* what =
          w4_method == W4Method::Awq ? " searches its scales" : " compensates rounding errors";
      fail_usage("--w4-method " + m + what +
                 " on calibration activations: give --calib DATA (as for --quant int8)");
    }
    if (!p.import_calib.empty() || p.int32_bias || !p.overrides.empty() ||
        p.cmd->count("--method") > 0 || p.cmd->count("--percentile") > 0) {
      fail_usage(
          "--import-calib, --method, --percentile, --int32-bias and --override are not "
          "used by --w4-method " +
          m + " (it takes --calib, --calib-size and --batch)");
    }
  } else if (!int8 &&
      (calib_given || calib_tuning_given(*p.cmd) || p.int32_bias || !p.overrides.empty())) {
    fail_usage(
        "--calib, --import-calib, --method, --percentile, --calib-size, --batch, "
        "--int32-bias and --override need --quant int8 (--calib, --calib-size and --batch "
        "also go with --quant w4a16 --w4-method awq or gptq)");
  }
  if (scheme == QuantScheme::None && (p.per_tensor || !p.exclude.empty() || !p.op_types.empty())) {
    fail_usage("--per-tensor, --exclude and --op-types need --quant");
  }
  if (!w4 && (p.cmd->count("--block-size") > 0 || p.cmd->count("--int4-format") > 0)) {
    fail_usage("--block-size and --int4-format need --quant w4a16");
  }
  if (w4 && (p.per_tensor || !p.op_types.empty())) {
    fail_usage("--per-tensor and --op-types are not used by --quant w4a16 (MatMul and Gemm "
               "weights are quantized in blocks; use --exclude to keep nodes float)");
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

void add_weight_only_pass(Pipeline& pipeline, const ConvertParams& p) {
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
}

// The W4A16 options; with --w4-method awq, `awq` is filled by run_awq_calibration() once the
// graph is read, before the pass runs.
W4A16Options w4a16_options(const ConvertParams& p, std::shared_ptr<AwqCalibration> awq,
                           std::shared_ptr<GptqCalibration> gptq) {
  W4A16Options opts;
  opts.block_size = p.block_size;
  opts.method = parse_w4_method(p.w4_method);
  if (!p.w4_scale.empty()) opts.scale = parse_int4_scale(p.w4_scale);
  if (opts.method == W4Method::Awq) opts.awq = std::move(awq);
  if (opts.method == W4Method::Gptq) opts.gptq = std::move(gptq);
  opts.format = parse_int4_format(p.int4_format);
  opts.exclude = exclude_regex(p.exclude);
  opts.exclude_pattern = p.exclude;
  opts.device = resolve_device(parse_device(p.device));
  return opts;
}

// AWQ's calibration: the activations feeding the weights the W4A16 pass will quantize.
PassReport run_awq_calibration(const Graph& graph, const ConvertParams& p,
                               const W4A16Options& opts, AwqCalibration& out) {
  Dataset data(p.calib.data, calibration_inputs(graph), p.calib.calib_size, p.calib.batch,
               "calibration data");
  const std::vector<W4A16Target> targets = plan_w4a16_targets(graph, opts);
  AwqOptions awq;
  awq.block_size = opts.block_size;
  awq.device = opts.device;
  PassReport report;
  out = collect_awq_calibration(graph, data, targets, awq, p.threads, report);
  return report;
}

// GPTQ's calibration: H = X^T X of the activations feeding the weights the pass will quantize.
PassReport run_gptq_calibration(const Graph& graph, const ConvertParams& p,
                                const W4A16Options& opts, GptqCalibration& out) {
  Dataset data(p.calib.data, calibration_inputs(graph), p.calib.calib_size, p.calib.batch,
               "calibration data");
  const std::vector<W4A16Target> targets = plan_w4a16_targets(graph, opts);
  PassReport report;
  out = collect_gptq_calibration(graph, data, targets, p.threads, report);
  return report;
}

// --act-dtype: fp16 by default for w4a16 (the "A16"), fp32 for the other schemes; 16-bit
// activations only where no int8 Q/DQ pairs with them (none, w4a16).
DType activation_dtype(const ConvertParams& p, QuantScheme scheme) {
  const bool w4 = scheme == QuantScheme::W4A16;
  DType act = w4 ? DType::F16 : DType::F32;
  if (p.act_dtype == "fp16") act = DType::F16;
  if (p.act_dtype == "bf16") act = DType::BF16;
  if (p.act_dtype == "fp32") act = DType::F32;
  if (act != DType::F32 && !w4 && scheme != QuantScheme::None) {
    fail_usage("--act-dtype " + p.act_dtype +
               " is for --quant w4a16 or none; the int8 schemes keep f32 activations");
  }
  if (!p.keep_fp32.empty() && act == DType::F32) {
    fail_usage("--keep-fp32 needs 16-bit activations (--act-dtype fp16 or bf16, or --quant w4a16)");
  }
  return act;
}

void add_float16_pass(Pipeline& pipeline, const ConvertParams& p, DType act) {
  if (act == DType::F32) return;
  Float16ConvertOptions opts;
  opts.act_dtype = act;
  opts.keep_fp32_ops = p.keep_fp32.empty() ? default_keep_fp32_ops() : parse_keep_fp32(p.keep_fp32);
  pipeline.add(make_float16_convert_pass(std::move(opts)));
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
                               StaticInt8Options options, Graph& graph,
                               CalibrationTable& table) {
  PipelineReport report = run_pre_passes(graph);
  check_static_int8_options(graph, options);  // before the slow part
  PassReport calib;
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

// Other per-row reports (LoRA modules, bound weights): "  key[i/N] k=v k=v ...".
void print_generic_row(const std::string& key, size_t i, size_t n, const Json& row) {
  std::string line = "  " + key + "[" + std::to_string(i) + "/" + std::to_string(n) + "]";
  if (row.is_object()) {
    for (const auto& [k, v] : row.items()) {
      if (v.is_string() && v.get<std::string>().empty()) continue;
      line += " " + k + "=" + (v.is_string() ? v.get<std::string>() : v.dump());
    }
  } else {
    line += " " + (row.is_string() ? row.get<std::string>() : row.dump());
  }
  std::fprintf(stderr, "%s\n", line.c_str());
}

void print_pass_text(const PipelineReport& report) {
  for (const auto& pass : report.passes) {
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%.3f s", pass.seconds);
    std::string summary = pass.pass + ": " + seconds;
    for (const auto& [key, value] : pass.stats.items()) {
      if (value.is_array() && pass.pass == "calibrate") continue;  // rows stay in --json
      if (!value.is_array()) {
        summary += ", " + key + " " + (value.is_string() ? value.get<std::string>() : value.dump());
        continue;
      }
      size_t i = 0;
      for (const auto& row : value) {
        ++i;
        if (key == "tensors") {
          print_tensor_row(i, value.size(), row);
        } else {
          print_generic_row(key, i, value.size(), row);
        }
      }
    }
    std::fprintf(stderr, "%s\n", summary.c_str());
    for (const auto& w : pass.warnings) spdlog::warn("{}: {}", pass.pass, w);
  }
}

// --config: the file's options for those not on the command line; IN and -o from either.
void apply_config_file(CLI::App& cmd, const ConvertParams& p) {
  if (!p.config.empty()) {
    const JobSpec job = parse_job_config(read_job_file(p.config), p.config);
    apply_job(bind_job(cmd, job), p.config);
  }
  if (p.input.empty() || p.output.empty()) {
    fail_usage(std::string(p.input.empty() ? "IN (the model to read)" : "-o OUT") +
               " is required: give it on the command line or in --config");
  }
}

int run_convert(const GlobalOptions& global, const ConvertParams& p) {
  const auto start = std::chrono::steady_clock::now();
  const auto scheme = parse_quant_scheme(p.quant);
  if (!scheme) fail_usage("--quant '" + p.quant + "' is not a known scheme");
  const OutputPath out = check_output_path(p.input, p.output, p.overwrite);
  set_cpu_threads(p.threads);
  check_scheme_flags(p, *scheme);  // flags checked before any reading
  const bool int8 = *scheme == QuantScheme::Int8Static;
  const StaticInt8Options int8_options = int8 ? static_options(p) : StaticInt8Options();
  Pipeline quant_passes;  // built here so that bad flags fail before any reading
  if (*scheme == QuantScheme::Int8Weights) add_weight_only_pass(quant_passes, p);
  const auto awq = std::make_shared<AwqCalibration>();
  const auto gptq = std::make_shared<GptqCalibration>();
  const W4A16Options w4_options =
      *scheme == QuantScheme::W4A16 ? w4a16_options(p, awq, gptq) : W4A16Options();
  if (*scheme == QuantScheme::W4A16) quant_passes.add(make_w4a16_pass(w4_options));
  const DType act_dtype = activation_dtype(p, *scheme);
  add_float16_pass(quant_passes, p, act_dtype);

  LoadedModel loaded = load_model(p.input);
  const ConvertInputs inputs = load_convert_inputs(p);
  const uint64_t bytes_in = loaded.graph.parameter_bytes();
  spdlog::info("read {} ({}), {} nodes, {} initializers", p.input, format_name(loaded.format),
               loaded.graph.nodes.size(), loaded.graph.initializers().size());
  Pipeline weight_passes;
  add_weight_passes(weight_passes, p, inputs);
  PipelineReport report = weight_passes.run(loaded.graph);
  if (w4_options.awq) {
    report.passes.push_back(run_awq_calibration(loaded.graph, p, w4_options, *awq));
  }
  if (w4_options.gptq) {
    report.passes.push_back(run_gptq_calibration(loaded.graph, p, w4_options, *gptq));
  }
  CalibrationTable table;
  PipelineReport quant = int8 ? run_static_int8(global, p, int8_options, loaded.graph, table)
                              : quant_passes.run(loaded.graph);
  for (auto& pass : quant.passes) report.passes.push_back(std::move(pass));

  switch (out.kind) {
    case OutputKind::Onnx: {
      OnnxExportOptions opts;
      opts.external_data = p.external_data;
      export_onnx(loaded.graph, p.output, opts);
      break;
    }
    case OutputKind::Safetensors: {
      if (!loaded.graph.nodes.empty()) {
        fail_usage("'" + p.input + "' is a graph with " + std::to_string(loaded.graph.nodes.size()) +
                   " nodes; a .safetensors output holds weights only, write .onnx instead");
      }
      SafetensorsWriteOptions opts;
      opts.max_shard_size = p.max_shard_size;
      export_safetensors(loaded.graph, p.output, opts);
      break;
    }
    case OutputKind::Bundle: {
      BundleInfo info;
      info.source_path = p.input;
      info.scheme = p.quant;
      info.activation_dtype = std::string(dtype_name(act_dtype));
      if (int8) info.calibration = table;
      info.report = {{"passes", report.to_json(/*with_timings=*/false)}};
      info.overwrite = p.overwrite;
      write_bundle(loaded.graph, p.output, info);
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
                {"act_dtype", std::string(dtype_name(act_dtype))},
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
  // IN and -o are required, from the command line or --config (checked in apply_config_file).
  cmd->add_option("IN", p->input, "Input: ONNX model, safetensors or torch.save checkpoint");
  cmd->add_option("-o,--output", p->output,
                  "Output: .onnx, .safetensors (weights only) or an engine bundle folder NAME.qfb");
  cmd->add_option("--config", p->config,
                  "Options from a YAML or JSON file (keys: option names without dashes, input, "
                  "output); flags on the command line override it");
  std::vector<std::string> names;
  for (const auto& info : kQuantSchemes) names.emplace_back(info.name);
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
  cmd->add_option("--lora", p->lora,
                  "Merge a LoRA adapter (PEFT folder or Kohya file), optionally weighted: "
                  "PATH[:WEIGHT]; repeat to merge several in order")
      ->allow_extra_args(false)
      ->take_all();
  cmd->add_flag("--allow-unmatched", p->allow_unmatched,
                "Warn about adapter or checkpoint tensors that match no weight instead of failing");
  cmd->add_option("--weights", p->weights,
                  "Bind a checkpoint's tensors into the ONNX graph (a fine-tuned state dict into "
                  "an exported architecture)");
  cmd->add_option("--reference", p->reference,
                  "The checkpoint the ONNX graph was exported from, to find anonymous weight "
                  "copies (onnx::MatMul_N) by content");
  cmd->add_option("--block-size", p->block_size,
                  "w4a16: weights per scale along the reduction axis (32, 64 or 128)")
      ->check(CLI::IsMember({16, 32, 64, 128, 256}));
  cmd->add_option("--int4-format", p->int4_format,
                  "w4a16: onnx-blocked (int4 + blocked DequantizeLinear, opset 21) or "
                  "matmulnbits (com.microsoft.MatMulNBits for ONNX Runtime)")
      ->check(CLI::IsMember({"onnx-blocked", "matmulnbits"}));
  cmd->add_option("--act-dtype", p->act_dtype,
                  "Activation dtype: fp16 (default with --quant w4a16), bf16 or fp32 (default "
                  "otherwise; fp16/bf16 also with --quant none); graph inputs and outputs stay "
                  "fp32, with Casts at the boundary")
      ->check(CLI::IsMember({"fp16", "bf16", "fp32"}));
  cmd->add_option("--keep-fp32", p->keep_fp32,
                  "With fp16/bf16 activations, op types kept in fp32 behind Casts "
                  "(comma-separated; 'default' = LayerNormalization, Softmax, LogSoftmax, "
                  "reductions, Pow, Sqrt, Exp, output-projection, embeddings; 'none')");
  cmd->add_option("--w4-method", p->w4_method,
                  "w4a16: rtn (round to nearest with a per-block scale search), awq "
                  "(activation-aware scales searched on --calib DATA, then round to nearest) or "
                  "gptq (rows quantized in order, each one's rounding error compensated by the "
                  "rows after it, weighted by --calib DATA's X^T X)")
      ->check(CLI::IsMember({"rtn", "awq", "gptq"}));
  cmd->add_option("--w4-scale", p->w4_scale,
                  "w4a16 int4 block scale: mse (default with rtn: the scale among amax/7 x "
                  "{1.00, 0.98, ..., 0.80} and amax/8 with the least block error) or amax "
                  "(scale = amax/7; default with awq, whose clip search chooses the clip)")
      ->check(CLI::IsMember({"mse", "amax"}));
  cmd->add_flag("--overwrite", p->overwrite, "Replace an existing .qfb bundle");
  cmd->add_option("--max-shard-size", p->max_shard_size,
                  "Split a .safetensors output into shards of at most this many bytes, with a "
                  "model.safetensors.index.json (0 = one file)");
  cmd->footer(
      "Examples:\n  qforge convert calib_data/sample_cnn.onnx -o sample_int8w.onnx "
      "--quant int8-weights\n  qforge convert calib_data/sample_cnn.onnx -o sample_int8.onnx "
      "--quant int8 --calib calib_data/calib.npz --method entropy\n  qforge convert "
      "calib_data/sample_cnn.onnx -o sample.qfb --quant int8 --calib calib_data/calib.npz\n  "
      "qforge convert model.onnx -o model_w4.onnx --quant w4a16 --block-size 128\n  qforge "
      "convert model.onnx -o model_awq.onnx --quant w4a16 --w4-method awq --calib calib.npz\n  "
      "qforge convert model.onnx -o model_fp16.onnx --act-dtype fp16 --keep-fp32 default,Gelu");
  cmd->callback([&global, &run, p, cmd] {
    run = [&global, p, cmd] {
      apply_config_file(*cmd, *p);
      return run_convert(global, *p);
    };
  });
}

}  // namespace qforge::cli
