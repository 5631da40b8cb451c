// qforge convert IN -o OUT [--quant ...]: import, run the passes the flags ask for, export.
#include <chrono>
#include <cstdio>
#include <regex>

#include <spdlog/spdlog.h>

#include "cli/app.h"
#include "cli/output_path.h"
#include "exporters/onnx/onnx_exporter.h"
#include "exporters/safetensors/safetensors_writer.h"
#include "importers/load_model.h"
#include "ir/error.h"
#include "kernels/device.h"
#include "importers/lora/lora_adapter.h"
#include "quant/lora_merge.h"
#include "quant/schemes.h"
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
    pipeline.add(make_lora_merge_pass(in.adapters, opts));
  }
}

const std::vector<std::string> kWeightOps = {"Conv", "ConvTranspose", "Gemm", "MatMul"};

void add_quant_passes(Pipeline& pipeline, const ConvertParams& p, QuantScheme scheme) {
  if (scheme == QuantScheme::Int8Weights) {
    WeightInt8Options opts;
    opts.per_tensor = p.per_tensor;
    if (!p.exclude.empty()) {
      try {
        opts.exclude = std::regex(p.exclude, std::regex::ECMAScript);
      } catch (const std::regex_error& e) {
        fail_usage("--exclude '" + p.exclude + "' is not a valid regular expression: " + e.what());
      }
      opts.exclude_pattern = p.exclude;
    }
    for (const auto& op : p.op_types) {
      if (std::find(kWeightOps.begin(), kWeightOps.end(), op) == kWeightOps.end()) {
        fail_usage("--op-types: '" + op + "' has no weights to quantize (use Conv, "
                   "ConvTranspose, Gemm or MatMul)");
      }
    }
    opts.op_types = p.op_types;
    opts.device = resolve_device(parse_device(p.device));
    pipeline.add(make_weight_int8_pass(std::move(opts)));
  } else if (p.per_tensor || !p.exclude.empty() || !p.op_types.empty()) {
    fail_usage("--per-tensor, --exclude and --op-types need --quant");
  }
}

// One line per tensor: "[i/N] name [shape] f32 -> i8 axis 0  A KiB -> B KiB  SQNR x dB".
void print_tensor_row(size_t i, size_t n, const Json& row) {
  const auto text = [&](const char* key) {
    return row.contains(key) ? (row[key].is_string() ? row[key].get<std::string>() : row[key].dump())
                             : std::string("?");
  };
  std::string line = "[" + std::to_string(i) + "/" + std::to_string(n) + "] " + text("name") +
                     " " + text("shape") + " " + text("dtype") + " -> i8";
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

int run_convert(const GlobalOptions& global, const ConvertParams& p) {
  const auto start = std::chrono::steady_clock::now();
  const auto scheme = parse_quant_scheme(p.quant);
  if (!scheme) fail_usage("--quant '" + p.quant + "' is not a known scheme");
  const OutputPath out = check_output_path(p.input, p.output);
  set_cpu_threads(p.threads);
  Pipeline quant_passes;
  add_quant_passes(quant_passes, p, *scheme);  // flags checked before any reading

  LoadedModel loaded = load_model(p.input);
  const ConvertInputs inputs = load_convert_inputs(p);
  Pipeline pipeline;
  add_weight_passes(pipeline, p, inputs);
  add_quant_passes(pipeline, p, *scheme);
  const uint64_t bytes_in = loaded.graph.parameter_bytes();
  spdlog::info("read {} ({}), {} nodes, {} initializers", p.input, format_name(loaded.format),
               loaded.graph.nodes.size(), loaded.graph.initializers().size());
  const PipelineReport report = pipeline.run(loaded.graph);

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
  cmd->add_option("IN", p->input, "Input: ONNX model, safetensors or torch.save checkpoint")->required();
  cmd->add_option("-o,--output", p->output, "Output file: .onnx, or .safetensors for weights")->required();
  std::vector<std::string> names;
  for (const auto& info : kQuantSchemes) names.emplace_back(info.name);
  cmd->add_option("--quant", p->quant, "Quantization scheme:\n" + quant_schemes_help())
      ->check(CLI::IsMember(names));
  cmd->add_flag("--per-tensor", p->per_tensor, "One weight scale per tensor, not per channel");
  cmd->add_option("--exclude", p->exclude, "Leave nodes whose name matches this regex float");
  cmd->add_option("--op-types", p->op_types, "Only quantize these op types (comma-separated)")
      ->delimiter(',');
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
  cmd->add_option("--max-shard-size", p->max_shard_size,
                  "Split a .safetensors output into shards of at most this many bytes, with a "
                  "model.safetensors.index.json (0 = one file)");
  cmd->footer(
      "Example: qforge convert calib_data/sample_cnn.onnx -o sample_int8w.onnx "
      "--quant int8-weights");
  cmd->callback([&global, &run, p] { run = [&global, p] { return run_convert(global, *p); }; });
}

}  // namespace qforge::cli
