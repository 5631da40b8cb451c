// qforge run BUNDLE|MODEL --inputs x.npz -o out.npz: runs a verified bundle or an ONNX model
// on the runtime and writes its outputs as .npz.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>

#include <spdlog/spdlog.h>

#include "cli/option_parsers.h"
#include "cli/app.h"
#include "exporters/npz_writer.h"
#include "importers/bundle/bundle_reader.h"
#include "importers/dataset/dataset.h"
#include "importers/load_model.h"
#include "ir/error.h"
#include "kernels/device.h"
#include "runtime/executor.h"

namespace qforge::cli {

namespace {

namespace fs = std::filesystem;

// The JSON object main prints for an error under the global --json, for this command's own
// --json flag.
void print_error_json(const Error& e) {
  print_json({{"ok", false},
              {"error", e.what()},
              {"category", std::string(category_name(e.category()))},
              {"exit_code", exit_code(e.category())}});
}

struct RunParams {
  std::string model;
  std::string inputs;
  std::string output;
  std::string device = "auto";
  std::string half_compute = "auto";
  int threads = 0;
  bool json = false;
};

void check_paths(const RunParams& p) {
  const fs::path out(p.output);
  if (out.extension() != ".npz") {
    fail_usage("output '" + p.output +
               "' must end in .npz (outputs are written with np.savez's layout)");
  }
  std::error_code ec;
  const fs::path parent = out.parent_path().empty() ? fs::path(".") : out.parent_path();
  if (!fs::is_directory(parent, ec)) {
    fail_io("output folder '" + parent.string() + "' does not exist: create it first");
  }
  for (const auto& in : {p.model, p.inputs}) {
    if (fs::exists(out, ec) && fs::equivalent(in, out, ec)) {
      fail_usage("output '" + p.output + "' is an input of this command; choose another name");
    }
  }
}

// Appends batch `next` to `acc` along axis 0 (outputs of successive batches).
Tensor concat_rows(const Tensor& acc, const Tensor& next, const std::string& name) {
  if (acc.empty()) return next;
  if (acc.rank() == 0 || acc.dtype() != next.dtype() ||
      !std::equal(acc.shape().begin() + 1, acc.shape().end(), next.shape().begin() + 1,
                  next.shape().end())) {
    fail_unsupported("output '" + name + "' changes shape between batches (" +
                     shape_to_string(acc.shape()) + " then " + shape_to_string(next.shape()) +
                     "); give inputs whose samples share one shape");
  }
  Shape shape = acc.shape();
  shape[0] += next.shape()[0];
  Tensor out(acc.dtype(), shape);
  auto dst = out.mutable_bytes();
  std::memcpy(dst.data(), acc.bytes().data(), acc.nbytes());
  std::memcpy(dst.data() + acc.nbytes(), next.bytes().data(), next.nbytes());
  return out;
}

std::vector<ValueInfo> feed_inputs(const Graph& g) {
  std::vector<ValueInfo> out;
  for (const auto& in : g.inputs) {
    if (!g.has_initializer(in.name)) out.push_back(in);
  }
  return out;
}

int run_model(const RunParams& p, const GlobalOptions& global) {
  check_paths(p);
  const auto start = std::chrono::steady_clock::now();
  Graph graph;
  std::error_code ec;
  const bool is_bundle = fs::is_directory(p.model, ec);  // a folder can only be a bundle here
  if (is_bundle) {
    graph = open_bundle(p.model).graph;
    spdlog::info("bundle '{}': every file matches its manifest digest", p.model);
  } else {
    LoadedModel loaded = load_model(p.model);
    if (loaded.format != FileFormat::Onnx || loaded.graph.nodes.empty()) {
      fail_usage("'" + p.model + "' is a " + std::string(format_name(loaded.format)) +
                 " file with no graph to run; give an ONNX model or a NAME.qfb bundle");
    }
    graph = std::move(loaded.graph);
  }

  ExecutorOptions opts;
  opts.device = parse_device(p.device);
  opts.threads = p.threads;
  opts.half_compute = *parse_half_compute(p.half_compute);  // checked by CLI11
  set_cpu_threads(p.threads);
  const Executor executor(graph, opts);
  spdlog::info("running on {}", opts.device == Device::Cuda ? "CUDA" : "CPU");

  Dataset data(p.inputs, feed_inputs(graph), 0, std::numeric_limits<int64_t>::max(), "input data",
               BadSamples::Keep);
  if (data.size() < data.available()) {
    spdlog::warn("input data '{}' holds {} samples; the model's fixed batch runs {} of them",
                 p.inputs, data.available(), data.size());
  }
  for (const auto& extra : data.extra_names()) {
    spdlog::info("input data '{}': array '{}' is not a model input; it is ignored", p.inputs,
                 extra);
  }
  std::vector<NamedTensor> outputs;
  for (const auto& o : executor.outputs()) outputs.emplace_back(o.name, Tensor());
  Dataset::Feeds batch;
  while (data.next(batch)) {
    const std::vector<Tensor> results = executor.run(batch);
    for (size_t i = 0; i < results.size(); ++i) {
      outputs[i].second = concat_rows(outputs[i].second, results[i], outputs[i].first);
    }
  }
  write_npz(outputs, p.output);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  if (global.json || p.json) {
    Json outs = Json::array();
    for (const auto& [name, t] : outputs) {
      outs.push_back(
          {{"name", name}, {"dtype", std::string(dtype_name(t.dtype()))}, {"shape", t.shape()}});
    }
    print_json({{"ok", true},
                {"model", p.model},
                {"bundle", is_bundle},
                {"verified", is_bundle},
                {"device", "cpu"},
                {"samples", data.size()},
                {"output_file", p.output},
                {"outputs", outs},
                {"seconds", seconds}});
  } else {
    for (const auto& [name, t] : outputs) {
      std::printf("%s %s %s\n", name.c_str(), std::string(dtype_name(t.dtype())).c_str(),
                  shape_to_string(t.shape()).c_str());
    }
    std::printf("wrote %s (%lld samples, %.2f s)\n", p.output.c_str(),
                static_cast<long long>(data.size()), seconds);
  }
  return 0;
}

}  // namespace

void register_run(CLI::App& app, const GlobalOptions& global, RunFn& run) {
  auto* cmd = app.add_subcommand(
      "run", "Run an engine bundle (verified first) or an ONNX model on inputs from an .npz");
  auto p = std::make_shared<RunParams>();
  cmd->add_option("MODEL", p->model, "Bundle folder NAME.qfb, or an ONNX model")->required();
  cmd->add_option("--inputs", p->inputs,
                  "Inputs: .npz (one array per model input, samples along axis 0), .npy, or a "
                  "folder (see calib_data/README.md)")
      ->required();
  cmd->add_option("-o,--output", p->output,
                  "Where to write the outputs (.npz, keyed by output name)")
      ->required();
  cmd->add_option("--device", p->device, "cpu (also what auto means here) or cuda (MatMul, Gemm and W4A16 products on the GPU, the other ops on CPU)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->add_option("--half-compute", p->half_compute,
                  "Where f16/bf16 activations are rounded (every op computes in f32): ort "
                  "(what ONNX Runtime's CPU provider does: f32 between ops it lacks fp16 "
                  "kernels for, rounded at graph outputs, model Casts and its fp16 kernels), "
                  "per-op (every op's output, like a GPU fp16 kernel), auto (ort on CPU, "
                  "per-op with --device cuda)")
      ->check(CLI::IsMember({"auto", "ort", "per-op"}));
  cmd->add_option("--threads", p->threads,
                  "CPU threads (0 = all cores); results do not depend on it")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--json", p->json, "Print one JSON result object on stdout");
  cmd->footer(
      "A bundle's files are checked against its manifest first; a missing or modified file "
      "stops the run (exit 3).\n"
      "Example: qforge run calib_data/sample_cnn.onnx --inputs calib_data/eval.npz -o out.npz\n"
      "Example: qforge run sample.qfb --inputs calib_data/eval.npz -o out.npz --json");
  cmd->callback([&global, &run, p] {
    run = [&global, p] {
      try {
        return run_model(*p, global);
      } catch (const Error& e) {
        // main prints the error line (and the JSON object for the global --json).
        if (p->json && !global.json) print_error_json(e);
        throw;
      }
    };
  });
}

}  // namespace qforge::cli
