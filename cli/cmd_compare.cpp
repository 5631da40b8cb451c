// qforge compare FLOAT QUANT --data DATA: how far a quantized model's outputs and intermediate
// values are from the float model's on the same data, with optional accuracy gates.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "cli/app.h"
#include "cli/progress.h"
#include "importers/dataset/dataset.h"
#include "importers/load_model.h"
#include "ir/error.h"
#include "kernels/device.h"
#include "quant/calib/calibration.h"
#include "runtime/executor.h"

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
  bool json = false;
};

// Sums over every element seen, in double; f32 tensors only.
struct Agreement {
  double ref2 = 0, err2 = 0, dot = 0, q2 = 0, max_abs = 0;
  int64_t top1_same = 0, top1_total = 0;
  int64_t right_float = 0, right_quant = 0, labelled = 0;

  [[nodiscard]] double sqnr_db() const {
    if (err2 == 0.0) return std::numeric_limits<double>::infinity();
    return ref2 == 0.0 ? -std::numeric_limits<double>::infinity() : 10.0 * std::log10(ref2 / err2);
  }
  [[nodiscard]] double cosine() const {
    if (ref2 == 0.0 && q2 == 0.0) return 1.0;
    return ref2 == 0.0 || q2 == 0.0 ? 0.0 : dot / std::sqrt(ref2 * q2);
  }
};

void accumulate(const Tensor& ref, const Tensor& quant, Agreement& a) {
  const std::vector<float> r = ref.to_f32();
  const std::vector<float> q = quant.to_f32();
  for (size_t i = 0; i < r.size(); ++i) {
    const double x = r[i], y = q[i];
    a.ref2 += x * x;
    a.q2 += y * y;
    a.dot += x * y;
    a.err2 += (x - y) * (x - y);
    a.max_abs = std::max(a.max_abs, std::fabs(x - y));
  }
}

size_t argmax(const std::vector<float>& v, size_t row, size_t classes) {
  const auto first = v.begin() + static_cast<std::ptrdiff_t>(row * classes);
  return static_cast<size_t>(std::max_element(first, first + static_cast<std::ptrdiff_t>(classes)) -
                             first);
}

// Top-1 agreement (and accuracy against labels when the data has them) for [N, C] outputs.
void accumulate_top1(const Tensor& ref, const Tensor& quant, const Tensor* labels, Agreement& a) {
  if (ref.rank() != 2 || ref.shape()[1] < 2) return;
  const auto rows = static_cast<size_t>(ref.shape()[0]);
  const auto classes = static_cast<size_t>(ref.shape()[1]);
  const std::vector<float> r = ref.to_f32();
  const std::vector<float> q = quant.to_f32();
  std::vector<float> l;
  if (labels != nullptr && labels->numel() == rows && !dtype_is_float(labels->dtype())) {
    l = labels->to_f32();
  }
  for (size_t n = 0; n < rows; ++n) {
    const size_t fr = argmax(r, n, classes);
    const size_t qr = argmax(q, n, classes);
    a.top1_same += fr == qr;
    ++a.top1_total;
    if (!l.empty()) {
      a.right_float += static_cast<double>(fr) == l[n];
      a.right_quant += static_cast<double>(qr) == l[n];
      ++a.labelled;
    }
  }
}

Json number(double v) {
  if (std::isfinite(v)) return v;
  return v > 0 ? Json("inf") : Json("-inf");
}

Json agreement_json(const std::string& name, const Agreement& a) {
  Json j = {{"name", name},
            {"sqnr_db", number(a.sqnr_db())},
            {"cosine", a.cosine()},
            {"max_abs_error", a.max_abs}};
  if (a.top1_total > 0) j["top1_agreement"] = double(a.top1_same) / double(a.top1_total);
  if (a.labelled > 0) {
    j["top1_accuracy_float"] = double(a.right_float) / double(a.labelled);
    j["top1_accuracy_quant"] = double(a.right_quant) / double(a.labelled);
  }
  return j;
}

// Where the quantized graph holds a value's quantized form: DequantizeLinear(QuantizeLinear(X))
// outputs, by name, mapped to X.
std::unordered_map<std::string, std::string> dequantized_aliases(const Graph& g) {
  std::unordered_map<std::string, std::string> quantized_from;  // Q output -> X
  for (const Node& n : g.nodes) {
    if (n.op_type == "QuantizeLinear" && !n.inputs.empty() && !n.outputs.empty()) {
      quantized_from[n.outputs[0]] = n.inputs[0];
    }
  }
  std::unordered_map<std::string, std::string> out;
  for (const Node& n : g.nodes) {
    if (n.op_type != "DequantizeLinear" || n.inputs.empty() || n.outputs.empty()) continue;
    const auto it = quantized_from.find(n.inputs[0]);
    if (it != quantized_from.end()) out.emplace(n.outputs[0], it->second);
  }
  return out;
}

// The per-layer comparison points: values of the float graph (node outputs, and inputs that the
// quantized graph quantizes) that the quantized graph computes too, as itself or in Q/DQ form;
// graph outputs are reported on their own.
std::unordered_set<std::string> shared_values(
    const Graph& ref, const Graph& quant,
    const std::unordered_map<std::string, std::string>& aliases) {
  std::unordered_set<std::string> in_quant;
  for (const Node& n : quant.nodes) in_quant.insert(n.outputs.begin(), n.outputs.end());
  std::unordered_set<std::string> quantized;
  for (const auto& [dq, x] : aliases) quantized.insert(x);
  std::unordered_set<std::string> out;
  for (const Node& n : ref.nodes) {
    for (const std::string& o : n.outputs) {
      if (!o.empty() && (in_quant.count(o) || quantized.count(o))) out.insert(o);
    }
  }
  for (const ValueInfo& v : ref.inputs) {
    if (quantized.count(v.name)) out.insert(v.name);
  }
  for (const ValueInfo& v : ref.outputs) out.erase(v.name);
  return out;
}

void print_text(const CompareParams& p, int64_t samples, const Json& outputs, const Json& layers) {
  std::printf("compare: %s vs %s on %lld samples of %s\n", p.float_model.c_str(),
              p.quant_model.c_str(), static_cast<long long>(samples), p.data.c_str());
  std::printf("%-32s %10s %10s %12s %10s\n", "output", "SQNR dB", "cosine", "max abs err",
              "top-1 agr");
  auto sqnr_text = [](const Json& v) {
    char buf[32];
    if (v.is_string()) return v.get<std::string>();
    std::snprintf(buf, sizeof buf, "%.2f", v.get<double>());
    return std::string(buf);
  };
  for (const Json& o : outputs) {
    std::string top1 = "-";
    if (o.contains("top1_agreement")) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.2f%%", 100.0 * o["top1_agreement"].get<double>());
      top1 = buf;
    }
    std::printf("%-32s %10s %10.6f %12.6g %10s\n", o["name"].get<std::string>().c_str(),
                sqnr_text(o["sqnr_db"]).c_str(), o["cosine"].get<double>(),
                o["max_abs_error"].get<double>(), top1.c_str());
    if (o.contains("top1_accuracy_float")) {
      std::printf("  top-1 accuracy against labels: float %.2f%%, quantized %.2f%%\n",
                  100.0 * o["top1_accuracy_float"].get<double>(),
                  100.0 * o["top1_accuracy_quant"].get<double>());
    }
  }
  const size_t shown = std::min<size_t>(20, layers.size());
  std::printf("per-layer SQNR, worst %zu of %zu values both models compute:\n", shown,
              layers.size());
  for (size_t i = 0; i < shown; ++i) {
    const Json& l = layers[i];
    std::printf("  %-40s %10s dB  cosine %.6f  max abs %.6g\n",
                l["name"].get<std::string>().c_str(), sqnr_text(l["sqnr_db"]).c_str(),
                l["cosine"].get<double>(), l["max_abs_error"].get<double>());
  }
}

// The first gate an output fails, as one line, or "".
std::string check_gates(const CompareParams& p, const std::vector<std::string>& names,
                        const std::vector<Agreement>& outputs) {
  char buf[512];
  for (size_t i = 0; i < names.size(); ++i) {
    if (p.min_sqnr && !(outputs[i].sqnr_db() >= *p.min_sqnr)) {
      std::snprintf(buf, sizeof buf,
                    "compare: output '%s' SQNR %.2f dB is below --fail-below-sqnr %g",
                    names[i].c_str(), outputs[i].sqnr_db(), *p.min_sqnr);
      return buf;
    }
    if (p.min_cosine && !(outputs[i].cosine() >= *p.min_cosine)) {
      std::snprintf(buf, sizeof buf,
                    "compare: output '%s' cosine %.6f is below --fail-below-cosine %g",
                    names[i].c_str(), outputs[i].cosine(), *p.min_cosine);
      return buf;
    }
  }
  return "";
}

int run_compare(const GlobalOptions& global, const CompareParams& p) {
  set_cpu_threads(p.threads);
  const LoadedModel ref = load_model(p.float_model);
  const LoadedModel quant = load_model(p.quant_model);
  const std::vector<ValueInfo> inputs = calibration_inputs(ref.graph);
  for (const ValueInfo& v : inputs) {
    const auto& qi = quant.graph.inputs;
    if (std::none_of(qi.begin(), qi.end(), [&](const ValueInfo& q) { return q.name == v.name; })) {
      fail_invalid("compare: input '" + v.name + "' of " + p.float_model + " is not an input of " +
                   p.quant_model + "; compare a model with its own quantized version");
    }
  }
  std::vector<std::string> output_names;
  for (const ValueInfo& v : ref.graph.outputs) {
    const auto& qo = quant.graph.outputs;
    if (std::none_of(qo.begin(), qo.end(), [&](const ValueInfo& q) { return q.name == v.name; })) {
      fail_invalid("compare: output '" + v.name + "' of " + p.float_model +
                   " is not an output of " + p.quant_model);
    }
    output_names.push_back(v.name);
  }
  Dataset data(p.data, inputs, p.samples, p.batch, "comparison data");
  ExecutorOptions eo;
  eo.threads = p.threads;
  Executor ref_exec(ref.graph, eo);
  Executor quant_exec(quant.graph, eo);
  const auto aliases = dequantized_aliases(quant.graph);
  const std::unordered_set<std::string> shared = shared_values(ref.graph, quant.graph, aliases);
  std::unordered_set<std::string> has_dequantized;
  for (const auto& [dq, x] : aliases) has_dequantized.insert(x);
  std::unordered_map<std::string, Tensor> ref_values;
  std::map<std::string, Agreement> layers;
  ref_exec.set_observer([&](const std::string& name, const Tensor& t) {
    if (t.dtype() == DType::F32 && shared.count(name)) ref_values[name] = t;
  });
  quant_exec.set_observer([&](const std::string& observed, const Tensor& t) {
    // A quantized value is compared in the form its readers see: after Q/DQ.
    const auto alias = aliases.find(observed);
    if (alias == aliases.end() && has_dequantized.count(observed)) return;
    const std::string& name = alias == aliases.end() ? observed : alias->second;
    const auto it = ref_values.find(name);
    if (it == ref_values.end() || t.dtype() != DType::F32 || t.shape() != it->second.shape())
      return;
    accumulate(it->second, t, layers[name]);
    ref_values.erase(it);
  });

  std::vector<Agreement> outputs(output_names.size());
  Progress progress("compare", "samples", !global.quiet);
  Dataset::Feeds batch, extras;
  int64_t done = 0;
  const auto labels_at = std::find(data.extra_names().begin(), data.extra_names().end(), "labels");
  while (data.next(batch, &extras)) {
    const std::vector<Tensor> r = ref_exec.run(batch);
    const std::vector<Tensor> q = quant_exec.run(batch);
    ref_values.clear();
    const Tensor* labels =
        labels_at == data.extra_names().end()
            ? nullptr
            : &extras[static_cast<size_t>(labels_at - data.extra_names().begin())].second;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (r[i].shape() != q[i].shape() || !dtype_is_float(r[i].dtype()) ||
          !dtype_is_float(q[i].dtype())) {
        fail_invalid("compare: output '" + output_names[i] + "' is " +
                     std::string(dtype_name(r[i].dtype())) + " " + shape_to_string(r[i].shape()) +
                     " in the float model but " + std::string(dtype_name(q[i].dtype())) + " " +
                     shape_to_string(q[i].shape()) + " in the quantized one");
      }
      accumulate(r[i], q[i], outputs[i]);
      accumulate_top1(r[i], q[i], labels, outputs[i]);
    }
    const Tensor& first = batch.front().second;
    done += first.rank() == 0 ? 1 : first.shape()[0];
    progress.update(done, data.size());
  }
  progress.finish();

  Json out_json = Json::array();
  for (size_t i = 0; i < outputs.size(); ++i)
    out_json.push_back(agreement_json(output_names[i], outputs[i]));
  std::vector<std::pair<std::string, Agreement>> sorted(layers.begin(), layers.end());
  std::stable_sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
    return a.second.sqnr_db() < b.second.sqnr_db();
  });
  Json layer_json = Json::array();
  for (const auto& [name, a] : sorted) layer_json.push_back(agreement_json(name, a));
  const std::string gate = check_gates(p, output_names, outputs);
  if (global.json || p.json) {
    print_json({{"ok", gate.empty()},
                {"command", "compare"},
                {"float", p.float_model},
                {"quantized", p.quant_model},
                {"data", p.data},
                {"samples", done},
                {"outputs", out_json},
                {"layers", layer_json},
                {"gate_failed", gate.empty() ? Json() : Json(gate)}});
  } else {
    print_text(p, done, out_json, layer_json);
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
  cmd->add_flag("--json", p->json, "Print one JSON object on stdout (every layer)");
  cmd->footer(
      "Example: qforge compare calib_data/sample_cnn.onnx sample_int8.onnx "
      "--data calib_data/eval.npz --fail-below-cosine 0.99");
  cmd->callback([&global, &run, p] { run = [&global, p] { return run_compare(global, *p); }; });
}

}  // namespace qforge::cli
