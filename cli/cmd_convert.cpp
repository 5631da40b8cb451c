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
#include "quant/schemes.h"
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
};

const std::vector<std::string> kWeightOps = {"Conv", "ConvTranspose", "Gemm", "MatMul"};

Pipeline build_pipeline(const ConvertParams& p, QuantScheme scheme) {
  Pipeline pipeline;
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
  return pipeline;
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

void print_pass_text(const PipelineReport& report) {
  for (const auto& pass : report.passes) {
    const auto& stats = pass.stats;
    if (stats.contains("tensors")) {
      const size_t n = stats["tensors"].size();
      size_t i = 0;
      for (const auto& row : stats["tensors"]) {
        ++i;
        print_tensor_row(i, n, row);
      }
    }
    std::fprintf(stderr, "%s: %.3f s", pass.pass.c_str(), pass.seconds);
    for (const auto& [key, value] : stats.items()) {
      if (key != "tensors") std::fprintf(stderr, ", %s %s", key.c_str(), value.dump().c_str());
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
  const Pipeline pipeline = build_pipeline(p, *scheme);  // flags checked before any reading

  LoadedModel loaded = load_model(p.input);
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
  cmd->add_option("--max-shard-size", p->max_shard_size,
                  "Split a .safetensors output into shards of at most this many bytes, with a "
                  "model.safetensors.index.json (0 = one file)");
  cmd->footer(
      "Example: qforge convert calib_data/sample_cnn.onnx -o sample_int8w.onnx "
      "--quant int8-weights");
  cmd->callback([&global, &run, p] { run = [&global, p] { return run_convert(global, *p); }; });
}

}  // namespace qforge::cli
