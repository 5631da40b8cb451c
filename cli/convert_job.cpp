// The convert driver (cli/convert_job.h): options checked, inputs read, passes assembled in
// order (weights bound, LoRA merged, AWQ/GPTQ calibration, then the scheme's quantization and
// the 16-bit activation conversion), the output written.
// --quant int8: BatchNorm folding and clean-up, calibration on the folded graph (or an imported
// table), then static INT8 QDQ.
#include "cli/convert_job.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <regex>
#include <set>

#include <spdlog/spdlog.h>

#include "cli/option_parsers.h"
#include "cli/budget_job.h"
#include "cli/calibration_job.h"
#include "cli/gguf_job.h"
#include "cli/hf_quant_job.h"
#include "cli/precision_flags.h"
#include "exporters/quant_checkpoint/quant_checkpoint_writer.h"
#include "cli/hf_graph_job.h"
#include "cli/output_path.h"
#include "cli/report_job.h"
#include "cli/quantized_folder_job.h"
#include "exporters/bundle/bundle_writer.h"
#include "exporters/hf_folder/hf_folder_writer.h"
#include "exporters/onnx/onnx_exporter.h"
#include "exporters/safetensors/safetensors_writer.h"
#include "importers/calib_table_reader.h"
#include "importers/dataset/dataset.h"
#include "importers/hf/hf_folder.h"
#include "importers/load_model.h"
#include "importers/lora/lora_adapter.h"
#include "ir/error.h"
#include "ir/weight_inventory.h"
#include "kernels/device.h"
#include "quant/w4a16/awq.h"
#include "quant/calib/calibration.h"
#include "quant/calib/token_mask.h"
#include "quant/float16/float16_convert.h"
#include "quant/w4a16/gptq.h"
#include "quant/lora/lora_merge.h"
#include "quant/schemes.h"
#include "quant/static/pre_passes.h"
#include "quant/static/shared_scales.h"
#include "quant/static/static_int8.h"
#include "quant/static/static_int8_plan.h"
#include "quant/w4a16/w4a16.h"
#include "quant/lora/weight_binding.h"
#include "quant/weights/weight_int8.h"

namespace qforge::cli {

namespace {

bool calib_tuning_given(const ConvertOptions& p) {
  return std::any_of(std::begin(kCalibTuningFlags), std::end(kCalibTuningFlags),
                     [&p](const char* flag) { return p.was_given(flag); });
}

// Files that passes need are read here, before the pipeline runs: a pass never reads a file.
struct ConvertInputs {
  std::vector<WeightedAdapter> adapters;
  std::shared_ptr<Graph> weights;
  std::shared_ptr<Graph> reference;
};

ConvertInputs load_convert_inputs(const ConvertOptions& p) {
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

void add_weight_passes(Pipeline& pipeline, const ConvertOptions& p, const ConvertInputs& in) {
  if (in.weights) {
    BindOptions opts;
    opts.reference = in.reference.get();
    opts.allow_unmatched = p.allow_unmatched;
    pipeline.add(make_function_pass(
        "bind-weights", [weights = in.weights, reference = in.reference, opts](
                            Graph& g, PassReport& r) { bind_weights(g, *weights, opts, r); }));
  }
  if (!in.adapters.empty()) {
    LoraMergeOptions opts;
    opts.reference = in.reference.get();
    opts.allow_unmatched = p.allow_unmatched;
    // cuBLAS for the B.A products only when asked for: auto keeps the CPU's exact sum order.
    opts.device =
        parse_device(p.device) == Device::Cuda ? resolve_device(Device::Cuda) : Device::Cpu;
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

// --calib token ids with a weight-only scheme of a model folder: the layer-by-layer path.
bool layerwise_weight_only(const ConvertOptions& p, QuantScheme scheme) {
  return (scheme == QuantScheme::W4A16 || scheme == QuantScheme::Int8Weights) &&
         !p.calib.data.empty() && is_hf_folder(p.input);
}

// Flags that only some schemes take, checked before anything is read.
void check_scheme_flags(const ConvertOptions& p, QuantScheme scheme) {
  const bool int8 = scheme == QuantScheme::Int8Static;
  const bool calib_given = !p.calib.data.empty() || !p.import_calib.empty();
  const bool w4 = scheme == QuantScheme::W4A16;
  if (!w4 && p.was_given("--w4-method")) fail_usage("--w4-method needs --quant w4a16");
  if (!w4 && p.was_given("--w4-scale")) fail_usage("--w4-scale needs --quant w4a16");
  if (!w4 && p.was_given("--w4-include")) fail_usage("--w4-include needs --quant w4a16");
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
        p.was_given("--method") || p.was_given("--percentile")) {
      fail_usage(
          "--import-calib, --method, --percentile, --int32-bias and --override are not "
          "used by --w4-method " +
          m + " (it takes --calib, --calib-size and --batch)");
    }
  } else if (!int8 && layerwise_weight_only(p, scheme)) {
    // A model folder quantized layer by layer (cli/hf_layerwise_job.h): round-to-nearest
    // weights, with per-layer output errors measured on the token ids.
    if (!p.import_calib.empty() || p.int32_bias || !p.overrides.empty() ||
        p.was_given("--method") || p.was_given("--percentile")) {
      fail_usage("--import-calib, --method, --percentile, --int32-bias and --override are not "
                 "used by a model folder's layer-by-layer --quant " +
                 std::string(quant_scheme_name(scheme)) +
                 " (it takes --calib, --calib-size, --batch and --seq-len)");
    }
  } else if (!int8 && !(w4 && budget_requested(p)) &&
             (calib_given || calib_tuning_given(p) || p.int32_bias || !p.overrides.empty())) {
    fail_usage(
        "--calib, --import-calib, --method, --percentile, --calib-size, --batch, "
        "--drop-bad-samples, --int32-bias and --override need --quant int8 (--calib, "
        "--calib-size, --batch and --drop-bad-samples also go with --quant w4a16 --w4-method "
        "awq or gptq, and with a model folder's --quant w4a16 or int8-weights)");
  }
  if (p.seq_len > 0 && p.calib.data.empty()) {
    fail_usage("--seq-len cuts --calib token ids: give --calib ids.npz with it");
  }
  if (scheme == QuantScheme::None && (p.per_tensor || !p.exclude.empty() || !p.op_types.empty())) {
    fail_usage("--per-tensor, --exclude and --op-types need --quant");
  }
  // --precision REGEX=int4 on an int8-weights default takes --block-size too.
  const bool int4_rule = std::any_of(p.precision.begin(), p.precision.end(),
                                     [](const std::string& r) { return r.ends_with("=int4"); });
  if (!w4 && ((p.was_given("--block-size") && !int4_rule) || p.was_given("--int4-format"))) {
    fail_usage("--block-size and --int4-format need --quant w4a16 (--block-size also a "
               "--precision REGEX=int4 rule)");
  }
  if (w4 && (p.per_tensor || !p.op_types.empty())) {
    fail_usage(
        "--per-tensor and --op-types are not used by --quant w4a16 (MatMul and Gemm "
        "weights are quantized in blocks; use --exclude to keep nodes float)");
  }
  if (!int8 && (p.was_given("--concat-shared-scale") || p.was_given("--no-concat-shared-scale") ||
                p.was_given("--add-shared-scale"))) {
    fail_usage("--concat-shared-scale, --no-concat-shared-scale and --add-shared-scale choose "
               "activation scales of --quant int8");
  }
  if (!int8) return;
  if (p.calib.data.empty() == p.import_calib.empty()) {
    fail_usage(
        "--quant int8 needs calibration ranges: give --calib DATA or --import-calib "
        "TABLE (one of them)");
  }
  if (!p.import_calib.empty() && calib_tuning_given(p)) {
    fail_usage(
        "--method, --percentile, --calib-size, --batch and --drop-bad-samples tune --calib; "
        "an imported table (--import-calib) already holds its ranges");
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

void add_weight_only_pass(Pipeline& pipeline, const ConvertOptions& p) {
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

// The W4A16 options; with --w4-method awq or gptq, `awq` or `gptq` is filled by
// run_w4_calibration() once the graph is read, before the pass runs.
W4A16Options w4a16_options(const ConvertOptions& p, std::shared_ptr<AwqCalibration> awq,
                           std::shared_ptr<GptqCalibration> gptq) {
  W4A16Options opts;
  opts.block_size = p.block_size;
  opts.method = parse_w4_method(p.w4_method);
  if (!p.w4_scale.empty()) opts.scale = parse_int4_scale(p.w4_scale);
  for (const std::string& kind : p.w4_include) {
    if (kind == "embeddings") {
      opts.include_gather = true;
    } else if (kind == "output-projection") {
      opts.exclude_output_projection = false;
      opts.exclude_default.clear();
    } else {
      fail_usage("--w4-include '" + kind + "': use embeddings or output-projection");
    }
  }
  if (opts.method == W4Method::Awq) opts.awq = std::move(awq);
  if (opts.method == W4Method::Gptq) opts.gptq = std::move(gptq);
  opts.format = parse_int4_format(p.int4_format);
  opts.exclude = exclude_regex(p.exclude);
  opts.exclude_pattern = p.exclude;
  opts.device = resolve_device(parse_device(p.device));
  return opts;
}

// AWQ's or GPTQ's calibration run over --calib, on the activations feeding the weights the
// W4A16 pass will quantize: fills `awq` (activation rows) or `gptq` (H = X^T X), whichever
// the options carry.
PassReport run_w4_calibration(const Graph& graph, const ConvertOptions& p, const W4A16Options& opts,
                              AwqCalibration& awq, GptqCalibration& gptq) {
  Dataset data(p.calib.data, calibration_inputs(graph), p.calib.calib_size, p.calib.batch,
               "calibration data",
               p.calib.drop_bad_samples ? BadSamples::Drop : BadSamples::Refuse);
  const std::vector<W4A16Target> targets = plan_w4a16_targets(graph, opts);
  const std::string mask = resolve_mask_input(graph, p.calib.mask);
  PassReport report;
  if (opts.awq) {
    AwqOptions awq_options;
    awq_options.block_size = opts.block_size;
    awq_options.device = opts.device;
    awq = collect_awq_calibration(graph, data, targets, awq_options, p.threads, mask, report);
  } else {
    gptq = collect_gptq_calibration(graph, data, targets, p.threads, mask, report);
  }
  return report;
}

// --act-dtype: fp16 by default for w4a16 (the "A16"), fp32 for the other schemes; 16-bit
// activations only where no int8 Q/DQ pairs with them (none, w4a16).
DType activation_dtype(const ConvertOptions& p, QuantScheme scheme) {
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

void add_float16_pass(Pipeline& pipeline, const ConvertOptions& p, DType act) {
  if (act == DType::F32) return;
  Float16ConvertOptions opts;
  opts.act_dtype = act;
  opts.keep_fp32_ops = p.keep_fp32.empty() ? default_keep_fp32_ops() : parse_keep_fp32(p.keep_fp32);
  pipeline.add(make_float16_convert_pass(std::move(opts)));
}

StaticInt8Options static_options(const ConvertOptions& p) {
  StaticInt8Options o;
  o.int32_bias = p.int32_bias;
  o.exclude = exclude_regex(p.exclude);
  o.exclude_pattern = p.exclude;
  o.op_types = p.op_types;
  o.concat_shared_scale = p.concat_shared_scale;
  o.add_shared_scale = p.add_shared_scale;
  for (const auto& text : p.overrides) {
    auto [name, value] = parse_tensor_override(text);
    if (!o.overrides.emplace(name, value).second) {
      fail_usage("--override gives '" + name + "' twice; give each tensor once");
    }
  }
  o.device = resolve_device(parse_device(p.device));
  return o;
}

// fold/cleanup -> calibrate (or import the table) -> QDQ; every step reported. Calibration
// observes only what the QDQ pass can read unless `every_range` (a bundle's calibration cache
// holds every activation's range, as TensorRT's implicit quantization wants).
PipelineReport run_static_int8(const ConvertOptions& p, StaticInt8Options options, Graph& graph,
                               CalibrationTable& table, bool every_range) {
  PipelineReport report = run_pre_calibration_passes(graph);
  check_static_int8_options(graph, options);  // before the slow part
  PassReport calib;
  if (p.import_calib.empty()) {
    std::optional<std::set<std::string>> only;
    if (!every_range) only = static_int8_range_needs(graph, options);
    table = run_calibration(graph, p.calib, options.device, p.threads, p.show_progress, calib,
                            std::move(only));
  } else {
    table = import_calibration(p.import_calib, calib);
  }
  add_calibration_stats(table, calib);
  report.passes.push_back(std::move(calib));
  for (const auto& [name, range] : table.ranges) options.activation_amax[name] = range.amax;
  share_table_ranges(graph, options, table);
  Pipeline quantize;
  quantize.add(make_static_int8_pass(std::move(options)));
  for (auto& pass : quantize.run(graph).passes) report.passes.push_back(std::move(pass));
  return report;
}

// The weight-only schemes quantize the weights that nodes read, and int8 and 16-bit activations
// need activations: a weights-only checkpoint (a state dict) has neither, so each such request
// stops here, before anything is written, instead of writing a checkpoint without its tensors.
void check_weights_only_input(const Graph& graph, const ConvertOptions& p, QuantScheme scheme,
                              DType act, OutputKind out) {
  if (!graph.nodes.empty()) return;
  const std::string what = "'" + p.input + "' is a weights-only checkpoint (" +
                           std::to_string(graph.initializers().size()) + " tensors, no nodes)";
  const std::string instead =
      "convert it without --quant to rewrite the tensors, or export the model to ONNX "
      "(torch.onnx.export) and quantize that";
  switch (scheme) {
    case QuantScheme::None:
      break;
    case QuantScheme::Int8Weights:
      fail_usage("--quant int8-weights quantizes the weights that Conv, Gemm and MatMul nodes "
                 "read, and " + what + "; " + instead);
    case QuantScheme::W4A16:
      fail_usage("--quant w4a16 quantizes the weights that MatMul and Gemm nodes read, and " +
                 what + "; " + instead);
    case QuantScheme::Int8Static:
      fail_usage("--quant int8 calibrates a graph's activations, and " + what + "; " + instead);
  }
  if (act != DType::F32) {
    fail_usage("--act-dtype " + p.act_dtype + " converts a graph's activations, and " +
               what + "; " + instead);
  }
  if (out != OutputKind::Safetensors && out != OutputKind::HfFolder) {
    fail_usage(std::string(out == OutputKind::Onnx ? "an .onnx output" : "an engine bundle") +
               " holds a graph to run, and " + what +
               "; write .safetensors, or export the model to ONNX (torch.onnx.export) and "
               "convert that");
  }
}

// The invariant behind every output: each tensor read reaches the output in some form.
void check_output_keeps_inputs(const WeightInventory& inventory, const Graph& graph,
                               const ConvertOptions& p) {
  const std::vector<std::string> unread = check_nothing_lost(
      inventory, graph, "the conversion of '" + p.input + "' to '" + p.output + "'");
  if (!unread.empty()) {
    spdlog::warn("dropped {} initializers of '{}' that no node reads: {}", unread.size(), p.input,
                 list_names(unread));
  }
}

}  // namespace

ConvertResult convert_model(const ConvertOptions& p) {
  if (p.tensor_parallel != 1 && p.format != "trtllm-ckpt") {
    const std::string other = p.format.empty() ? "this output" : "--format " + p.format;
    fail_usage("--tp " + std::to_string(p.tensor_parallel) + " splits a --format trtllm-ckpt "
               "checkpoint into ranks; " + other + " has none: drop --tp or give --format "
               "trtllm-ckpt");
  }
  if (!p.precision.empty() && (p.format == "gguf" || is_gguf_quant(p.quant))) {
    fail_usage("--precision sets a Linear's precision in a weight-only --quant w4a16|"
               "int8-weights of a model folder; GGUF output has its own --quant types");
  }
  parse_precision_rules(p.precision);  // its usage errors before any reading
  // GGUF (llama.cpp) has its own folder-to-file path: cli/gguf_job.h.
  if (p.format == "gguf" || is_gguf_quant(p.quant)) return export_gguf(p);
  const auto scheme = parse_quant_scheme(p.quant);
  if (!scheme) fail_usage("--quant '" + p.quant + "' is not a known scheme");
  const OutputPath out = check_output_path(p.input, p.output, p.overwrite);
  set_cpu_threads(p.threads);
  check_scheme_flags(p, *scheme);  // flags checked before any reading
  check_budget_flags(p, *scheme);
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
  // An already quantized folder: re-emitted as stored, or dequantized for --requantize.
  if (keep_checkpoint_scheme(p, *scheme, out.kind, loaded)) {
    if (!p.precision.empty()) {
      fail_usage("--precision quantizes a float model folder; '" + p.input +
                 "' is quantized already: convert it without --precision");
    }
    return reemit_quantized_checkpoint(p, out.kind, loaded);
  }
  const bool weights_only = is_weights_only_quant(loaded, *scheme, out.kind);
  if (!p.precision.empty() && !weights_only) {
    fail_usage("--precision sets Linear precisions in a weight-only --quant w4a16|int8-weights "
               "of a model folder (or safetensors weights) written to OUT/ or OUT.safetensors");
  }
  if (is_quant_checkpoint_format(p.format) && !weights_only) {
    fail_usage("--format " + p.format + " is the layout of a weights-only quantized checkpoint: "
               "give a model folder (or safetensors weights), --quant w4a16 or int8-weights, "
               "and -o OUT/ or OUT.safetensors");
  }
  const bool budget = budget_requested(p);
  if (budget) check_budget_input(p, *scheme, loaded, weights_only);
  if (weights_only) {
    // LoRA merges before quantization, so calibration sees the merged weights.
    Pipeline merge;
    add_weight_passes(merge, p, load_convert_inputs(p));
    PipelineReport merged = merge.run(loaded.graph);
    if (!budget) return convert_weights_only_quant(p, *scheme, out.kind, loaded, std::move(merged));
    // The budget's per-module precisions, then the checkpoint written with them (round to
    // nearest: --calib was the budget's evaluation data and calibrates nothing).
    FolderBudget chosen = run_folder_budget(p, *scheme, loaded);
    ConvertOptions with = p;
    with.precision = std::move(chosen.precision);
    with.calib.data.clear();
    merged.passes.push_back(std::move(chosen.report));
    return convert_weights_only_quant(with, *scheme, out.kind, loaded, std::move(merged));
  }
  if (wants_decoder_graph(loaded, out.kind)) loaded.graph = build_decoder_graph(p.input, loaded);
  check_weights_only_input(loaded.graph, p, *scheme, act_dtype, out.kind);
  const WeightInventory inventory = take_weight_inventory(loaded.graph);
  const ConvertInputs inputs = load_convert_inputs(p);
  ConvertResult result;
  result.act_dtype = act_dtype;
  result.weights_bytes_in = loaded.graph.parameter_bytes();
  spdlog::info("read {} ({}), {} nodes, {} initializers", p.input, format_name(loaded.format),
               loaded.graph.nodes.size(), loaded.graph.initializers().size());
  Pipeline weight_passes;
  add_weight_passes(weight_passes, p, inputs);
  PipelineReport report = weight_passes.run(loaded.graph);
  if ((w4_options.awq || w4_options.gptq) && !budget) {
    report.passes.push_back(run_w4_calibration(loaded.graph, p, w4_options, *awq, *gptq));
  }
  CalibrationTable table;
  PipelineReport quant =
      budget ? run_budget_convert(p, *scheme, act_dtype, w4_options, int8_options, loaded.graph,
                                  table)
      : int8 ? run_static_int8(p, int8_options, loaded.graph, table,
                               /*every_range=*/out.kind == OutputKind::Bundle)
             : quant_passes.run(loaded.graph);
  for (auto& pass : quant.passes) report.passes.push_back(std::move(pass));
  check_output_keeps_inputs(inventory, loaded.graph, p);

  switch (out.kind) {
    case OutputKind::Onnx: {
      OnnxExportOptions opts;
      opts.external_data = p.external_data;
      export_onnx(loaded.graph, p.output, opts);
      break;
    }
    case OutputKind::Safetensors: {
      if (!loaded.graph.nodes.empty()) {
        fail_usage("'" + p.input + "' is a graph with " +
                   std::to_string(loaded.graph.nodes.size()) +
                   " nodes; a .safetensors output holds weights only, write .onnx instead");
      }
      SafetensorsWriteOptions opts;
      opts.max_shard_size = p.max_shard_size.value_or(0);
      export_safetensors(loaded.graph, p.output, opts);
      break;
    }
    case OutputKind::HfFolder: {
      if (!loaded.graph.nodes.empty()) {
        fail_usage("'" + p.input + "' is a graph with " +
                   std::to_string(loaded.graph.nodes.size()) +
                   " nodes; a model folder holds weights only, write .onnx instead");
      }
      HfFolderWriteOptions opts;
      if (loaded.format == FileFormat::HfFolder) opts.source_dir = p.input;
      if (p.max_shard_size) opts.max_shard_size = *p.max_shard_size;
      opts.overwrite = p.overwrite;
      write_hf_folder(loaded.graph, p.output, opts);
      break;
    }
    case OutputKind::Bundle: {
      BundleInfo info;
      info.source_path = p.input;
      info.scheme = p.quant;
      info.activation_dtype = std::string(dtype_name(act_dtype));
      if (int8) info.calibration = table;
      info.report = {{"passes", report.to_json(/*with_timings=*/false)}};
      // For `qforge report`: calibration's histograms with every method's threshold, when
      // --report asks for them (the four threshold searches per tensor cost a second or more).
      if (p.calib.report_histograms && !table.histograms.empty()) {
        info.report["histograms"] = calibration_histograms_json(
            table, p.calib.percentile, resolve_device(parse_device(p.device)));
      }
      info.overwrite = p.overwrite;
      write_bundle(loaded.graph, p.output, info);
      break;
    }
  }
  result.weights_bytes_out = loaded.graph.parameter_bytes();
  result.report = std::move(report);
  result.calibration = std::move(table);
  return result;
}

}  // namespace qforge::cli
