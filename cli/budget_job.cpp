// The accuracy budget behind `qforge convert --target-cosine / --target-sqnr / --max-drop`
// (cli/budget_job.h): the data read and split, one calibration, the trial graphs of each
// scheme's ladder, the search (quant/budget/budget_search.h) and its report.
#include "cli/budget_job.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <string_view>

#include <spdlog/spdlog.h>

#include "cli/app.h"
#include "cli/calibration_job.h"
#include "cli/hf_graph_job.h"
#include "cli/hf_quant_job.h"
#include "cli/option_parsers.h"
#include "cli/progress.h"
#include "exporters/quant_checkpoint/quant_checkpoint_writer.h"
#include "importers/calib_table_reader.h"
#include "importers/dataset/dataset.h"
#include "ir/calib_methods.h"
#include "ir/quantized_linear.h"
#include "quant/budget/budget_search.h"
#include "quant/calib/calibration.h"
#include "quant/calib/token_mask.h"
#include "quant/float16/float16_convert.h"
#include "quant/static/pre_passes.h"
#include "quant/static/static_int8_plan.h"
#include "quant/w4a16/awq.h"
#include "quant/w4a16/gptq.h"
#include "quant/weights/linear_precision.h"
#include "quant/weights/linear_weight_quant.h"
#include "quant/weights/weight_int8.h"

namespace qforge::cli {

namespace {

// The share of --calib held out for evaluation when --eval is not given: its last 1/kHeldOut.
constexpr int64_t kHeldOut = 5;
// Samples the sensitivity trials run on (the first ones of the evaluation data).
constexpr int64_t kProbeSamples = 16;

BudgetTarget budget_target(const ConvertOptions& p) {
  BudgetTarget t;
  t.min_cosine = p.target_cosine;
  t.min_sqnr_db = p.target_sqnr;
  t.max_drop = p.max_drop;
  return t;
}

bool rtn_w4(const ConvertOptions& p, QuantScheme scheme) {
  return scheme == QuantScheme::W4A16 && parse_w4_method(p.w4_method) == W4Method::Rtn;
}

// Samples [begin, end) of a batch's tensors (rows along axis 0), sharing their storage.
Tensor row_window(const Tensor& t, int64_t begin, int64_t end) {
  Shape shape = t.shape();
  const int64_t rows = shape.at(0);
  const size_t row_bytes = rows == 0 ? 0 : t.nbytes() / static_cast<size_t>(rows);
  shape[0] = end - begin;
  return Tensor(t.dtype(), shape, t.storage(), t.offset() + static_cast<size_t>(begin) * row_bytes);
}

BatchSource::Feeds feeds_window(const BatchSource::Feeds& feeds, int64_t begin, int64_t end) {
  BatchSource::Feeds out;
  for (const auto& [name, t] : feeds) out.emplace_back(name, row_window(t, begin, end));
  return out;
}

// Every batch of `path`, in memory (tensors keep their storage, mapped or not).
std::vector<EvalBatch> read_batches(const std::string& path, const Graph& graph, int64_t samples,
                                    const ConvertOptions& p, const char* role) {
  Dataset data(path, calibration_inputs(graph), samples, p.calib.batch, role,
               p.calib.drop_bad_samples ? BadSamples::Drop : BadSamples::Refuse);
  std::vector<EvalBatch> out;
  EvalBatch b;
  while (data.next(b.inputs, &b.extras)) {
    out.push_back(b);
    b = EvalBatch();
  }
  return out;
}

int64_t rows_of(const EvalBatch& b) {
  return b.inputs.empty() ? 0 : b.inputs.front().second.shape().at(0);
}

int64_t count_rows(const std::vector<EvalBatch>& batches) {
  int64_t n = 0;
  for (const EvalBatch& b : batches) n += rows_of(b);
  return n;
}

// Splits `all` at sample `at`: [0, at) and [at, end).
std::pair<std::vector<EvalBatch>, std::vector<EvalBatch>> split_at(
    const std::vector<EvalBatch>& all, int64_t at) {
  std::pair<std::vector<EvalBatch>, std::vector<EvalBatch>> out;
  int64_t first = 0;
  for (const EvalBatch& b : all) {
    const int64_t rows = rows_of(b);
    const int64_t cut = std::clamp<int64_t>(at - first, 0, rows);
    if (cut > 0) {
      out.first.push_back({feeds_window(b.inputs, 0, cut), feeds_window(b.extras, 0, cut)});
    }
    if (cut < rows) {
      out.second.push_back({feeds_window(b.inputs, cut, rows), feeds_window(b.extras, cut, rows)});
    }
    first += rows;
  }
  return out;
}

// The budget's data: what calibrates (empty when nothing does) and what evaluates.
struct BudgetData {
  std::vector<EvalBatch> calib;
  std::vector<EvalBatch> eval;
  Json stats;  // which samples went where
};

// `calibrates`: whether the scheme calibrates on --calib (then part of it is held out).
BudgetData read_budget_data(const ConvertOptions& p, bool calibrates, const Graph& graph) {
  BudgetData d;
  if (!p.eval.empty()) {
    d.eval = read_batches(p.eval, graph, 0, p, "evaluation data");
    d.stats["eval"] = {{"data", p.eval}, {"samples", count_rows(d.eval)}};
    if (calibrates) {
      d.calib = read_batches(p.calib.data, graph, p.calib.calib_size, p, "calibration data");
      d.stats["calibration"] = {{"data", p.calib.data}, {"samples", count_rows(d.calib)}};
    }
    return d;
  }
  std::vector<EvalBatch> all =
      read_batches(p.calib.data, graph, p.calib.calib_size, p, "calibration data");
  const int64_t n = count_rows(all);
  if (!calibrates) {  // round-to-nearest: all of --calib evaluates
    d.eval = std::move(all);
    d.stats["eval"] = {{"data", p.calib.data}, {"samples", n}, {"first", 0}};
    return d;
  }
  if (n < 2) {
    fail_usage("--calib '" + p.calib.data + "' holds " + std::to_string(n) +
               " sample(s): an accuracy budget holds out the last fifth of --calib for "
               "evaluation and calibrates on the rest, so give at least 2, or --eval DATA");
  }
  const int64_t held = std::max<int64_t>(1, n / kHeldOut);
  auto [calib, eval] = split_at(all, n - held);
  d.calib = std::move(calib);
  d.eval = std::move(eval);
  d.stats["calibration"] = {{"data", p.calib.data}, {"samples", n - held}, {"first", 0}};
  d.stats["eval"] = {{"data", p.calib.data}, {"samples", held}, {"first", n - held}};
  return d;
}

std::vector<BatchSource::Feeds> inputs_of(const std::vector<EvalBatch>& batches) {
  std::vector<BatchSource::Feeds> out;
  for (const EvalBatch& b : batches) out.push_back(b.inputs);
  return out;
}

std::string regex_escape(const std::string& text) {
  static const std::string special = R"(\^$.|?*+()[]{}/)";
  std::string out;
  for (char c : text) {
    if (special.find(c) != std::string::npos) out += '\\';
    out += c;
  }
  return out;
}

// "^(?:a|b)$": matches exactly these names.
std::string exact_names(const std::vector<std::string>& names) {
  std::string alt;
  for (const std::string& n : names) alt += (alt.empty() ? "" : "|") + regex_escape(n);
  return "^(?:" + alt + ")$";
}

// The user's --exclude or these names (none when both are empty: an empty regex matches all).
std::optional<std::regex> exclude_also(const std::string& user,
                                       const std::vector<std::string>& names) {
  std::string pattern = names.empty() ? "" : exact_names(names);
  if (!user.empty()) pattern = pattern.empty() ? user : "(?:" + user + ")|" + pattern;
  if (pattern.empty()) return std::nullopt;
  return std::regex(pattern, std::regex::ECMAScript);
}

std::vector<std::string> names_on(const std::vector<std::string>& layers,
                                  const std::vector<int>& rung_of, int rung, bool above = false) {
  std::vector<std::string> out;
  for (size_t i = 0; i < layers.size(); ++i) {
    if (above ? rung_of[i] > rung : rung_of[i] == rung) out.push_back(layers[i]);
  }
  return out;
}

void check_layer_names(const std::vector<std::string>& layers) {
  std::set<std::string> seen;
  for (const std::string& n : layers) {
    if (n.empty() || !seen.insert(n).second) {
      fail_unsupported("accuracy budget: the quantizable nodes need distinct names to be kept "
                       "apart, and " + (n.empty() ? std::string("one has none") : "'" + n +
                       "' names two") + "; name the graph's nodes (onnx.load, set node.name, save)");
    }
  }
}

void add_float16(Pipeline& pipeline, const ConvertOptions& p, DType act) {
  if (act == DType::F32) return;
  Float16ConvertOptions opts;
  opts.act_dtype = act;
  opts.keep_fp32_ops = p.keep_fp32.empty() ? default_keep_fp32_ops() : parse_keep_fp32(p.keep_fp32);
  pipeline.add(make_float16_convert_pass(std::move(opts)));
}

// W4A16's ladder: rung 0 int4 blocks (the W4A16 pass), 1 int8 per channel (weight-only), 2 float.
BudgetProblem w4a16_problem(const ConvertOptions& p, const W4A16Options& w4, DType act,
                            const Graph& base, std::shared_ptr<PipelineReport> last) {
  BudgetProblem problem;
  for (const W4A16Target& t : plan_w4a16_targets(base, w4)) {
    const std::string& name = base.nodes[t.node].name;
    if (problem.layers.empty() || problem.layers.back() != name) problem.layers.push_back(name);
  }
  check_layer_names(problem.layers);
  problem.rungs = {"int4", "int8", "float"};
  problem.build = [&p, w4, act, &base, last, layers = problem.layers](const std::vector<int>& r) {
    Graph g = base;
    W4A16Options o = w4;
    o.exclude = exclude_also(w4.exclude_pattern, names_on(layers, r, 0, /*above=*/true));
    Pipeline pipeline;
    pipeline.add(make_w4a16_pass(std::move(o)));
    const std::vector<std::string> int8 = names_on(layers, r, 1);
    if (!int8.empty()) {
      WeightInt8Options wo;
      wo.exclude = std::regex("^(?!" + exact_names(int8).substr(1) + ")",
                              std::regex::ECMAScript);  // every node but these
      wo.exclude_pattern = "budget";
      wo.op_types = {"MatMul", "Gemm"};
      wo.device = w4.device;
      pipeline.add(make_weight_int8_pass(std::move(wo)));
    }
    add_float16(pipeline, p, act);
    *last = pipeline.run(g);
    return g;
  };
  return problem;
}

// Static INT8's ladder: rung 0 int8 (the static pass on the shared ranges), 1 float.
BudgetProblem int8_problem(const StaticInt8Options& int8, const Graph& base,
                           std::shared_ptr<PipelineReport> last) {
  BudgetProblem problem;
  PassReport plan_report;
  for (const NodePlan& n : plan_static_int8(base, int8, plan_report)) {
    problem.layers.push_back(base.nodes[n.node].name);
  }
  check_layer_names(problem.layers);
  problem.rungs = {"int8", "float"};
  problem.build = [int8, &base, last, layers = problem.layers](const std::vector<int>& r) {
    Graph g = base;
    StaticInt8Options o = int8;
    o.exclude = exclude_also(int8.exclude_pattern, names_on(layers, r, 0, /*above=*/true));
    Pipeline pipeline;
    pipeline.add(make_static_int8_pass(std::move(o)));
    *last = pipeline.run(g);
    return g;
  };
  return problem;
}

Json metric_json(const BudgetMetric& m) {
  Json j = {{"cosine", m.cosine}, {"sqnr_db", m.sqnr_db}};
  if (m.accuracy_quant) {
    j["top1_float"] = *m.accuracy_float;
    j["top1_quant"] = *m.accuracy_quant;
    j["top1_drop"] = m.drop();
  }
  return j;
}

std::string metric_text(const BudgetMetric& m) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "cosine %.6f, SQNR %.2f dB", m.cosine, m.sqnr_db);
  std::string out = buf;
  if (m.accuracy_quant) {
    std::snprintf(buf, sizeof buf, ", top-1 %.2f%% (float %.2f%%, drop %.2f points)",
                  *m.accuracy_quant, *m.accuracy_float, m.drop());
    out += buf;
  }
  return out;
}

// The search on `float_graph`'s outputs over `eval` (its sensitivities on the first
// kProbeSamples samples). Throws BudgetUnreachable when the top of the ladder misses the target.
struct SearchOutcome {
  BudgetResult result;
  int64_t sensitivity_samples = 0;
};

SearchOutcome search_to_budget(const ConvertOptions& p, const BudgetProblem& problem,
                               const Graph& float_graph, std::vector<EvalBatch> eval,
                               const std::string& mask) {
  const BudgetTarget target = budget_target(p);
  const BudgetPool pool = p.eval_pool == "mean" ? BudgetPool::Mean : BudgetPool::None;
  // Sensitivities are measured on the first kProbeSamples evaluation samples (36 layers of
  // MiniLM rank the same on 16 sentences as on 80: tests/interop/test_accuracy_budget.py).
  std::optional<BudgetEvaluator> probe;
  if (count_rows(eval) > kProbeSamples) {
    probe.emplace(float_graph, split_at(eval, kProbeSamples).first, mask, p.threads,
                  p.max_drop.has_value(), pool);
  }
  const BudgetEvaluator evaluator(float_graph, std::move(eval), mask, p.threads,
                                  p.max_drop.has_value(), pool);
  spdlog::info("accuracy budget: {} layers, {} evaluation samples, target {}",
               problem.layers.size(), evaluator.samples(), target.text());
  Progress progress("budget", "trials", p.show_progress);
  const size_t bound = 2 + problem.layers.size() + 16 * problem.rungs.size();
  SearchOutcome out;
  out.result = search_budget(
      problem, evaluator, target, [&progress, bound](const std::string& what, int done) {
        spdlog::debug("budget trial {}: {}", done + 1, what);
        progress.update(done, static_cast<int64_t>(bound));
      },
      probe ? &*probe : nullptr);
  progress.finish();
  if (!out.result.reachable) {
    throw BudgetUnreachable(
        "accuracy budget " + target.text() + " is out of reach: with every one of the " +
        std::to_string(problem.layers.size()) + " quantizable layers at " +
        problem.rungs.back() + " the model reaches " + metric_text(out.result.metric) +
        " on the evaluation data; lower the target (nothing was written)");
  }
  out.sensitivity_samples = probe ? probe->samples() : evaluator.samples();
  return out;
}

// The "budget" pass report: the target and data, each layer's precision (`precision`, by
// layer) and sensitivity, and the search's trials.
PassReport budget_report(const ConvertOptions& p, const Json& data_stats,
                         const BudgetProblem& problem, const SearchOutcome& outcome,
                         const std::vector<std::string>& precision,
                         std::chrono::steady_clock::time_point start) {
  const BudgetResult& result = outcome.result;
  PassReport budget;
  budget.pass = "budget";
  budget.stats["target"] = budget_target(p).text();
  budget.stats["pool"] = p.eval_pool;
  for (auto it = data_stats.begin(); it != data_stats.end(); ++it) budget.stats[it.key()] = *it;
  std::map<std::string, int> per_rung;
  for (const std::string& r : precision) ++per_rung[r];
  std::string counts;
  for (const std::string& rung : problem.rungs) {
    counts += (counts.empty() ? "" : ", ") + rung + " " + std::to_string(per_rung[rung]);
  }
  budget.stats["precision"] = counts;
  budget.stats["kept"] = std::count_if(result.rung_of.begin(), result.rung_of.end(),
                                       [](int r) { return r > 0; });
  budget.stats["metric"] = metric_text(result.metric);
  budget.stats["trials"] = result.trials.size();
  budget.stats["sensitivity_samples"] = outcome.sensitivity_samples;
  budget.stats["final"] = metric_json(result.metric);
  Json layers = Json::array();
  for (size_t i = 0; i < problem.layers.size(); ++i) {
    Json row = {{"name", problem.layers[i]}, {"precision", precision[i]}};
    if (!result.sensitivity.empty()) {
      const auto rank = std::find(result.ranking.begin(), result.ranking.end(), problem.layers[i]);
      row["sensitivity_rank"] = rank - result.ranking.begin() + 1;
      row["alone"] = metric_json(result.sensitivity[i]);
    }
    layers.push_back(std::move(row));
  }
  budget.stats["layers"] = std::move(layers);
  Json curve = Json::array();
  for (const BudgetTrial& t : result.trials) {
    if (t.what.rfind("alone ", 0) == 0) continue;
    Json row = {{"trial", t.what}, {"kept", t.kept}, {"meets", t.meets}};
    const Json m = metric_json(t.metric);
    for (auto it = m.begin(); it != m.end(); ++it) row[it.key()] = *it;
    curve.push_back(std::move(row));
  }
  budget.stats["search"] = std::move(curve);
  budget.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return budget;
}

}  // namespace

bool budget_requested(const ConvertOptions& p) {
  return p.target_cosine || p.target_sqnr || p.max_drop;
}

void check_budget_flags(const ConvertOptions& p, QuantScheme scheme) {
  if (!budget_requested(p)) {
    if (!p.eval.empty() || p.was_given("--eval-pool")) {
      fail_usage("--eval and --eval-pool are the accuracy budget's: give --target-cosine, "
                 "--target-sqnr or --max-drop with them");
    }
    return;
  }
  if (scheme != QuantScheme::W4A16 && scheme != QuantScheme::Int8Static &&
      scheme != QuantScheme::Int8Weights) {
    fail_usage("--target-cosine, --target-sqnr and --max-drop choose per-layer precision for "
               "--quant w4a16 or int8 (or int8-weights of a model folder)");
  }
  if (p.target_cosine && !(*p.target_cosine > -1.0 && *p.target_cosine <= 1.0)) {
    fail_usage("--target-cosine must lie in (-1, 1]");
  }
  if (p.max_drop && !(*p.max_drop >= 0.0)) fail_usage("--max-drop must be at least 0 (points)");
  if (p.target_sqnr && !std::isfinite(*p.target_sqnr)) fail_usage("--target-sqnr must be finite");
  if (!p.precision.empty()) {
    fail_usage("--precision and an accuracy budget both choose per-layer precision: give one");
  }
  if (rtn_w4(p, scheme) || scheme == QuantScheme::Int8Weights) {
    if (p.calib.data.empty() == p.eval.empty()) {
      fail_usage("--quant " + std::string(quant_scheme_name(scheme)) +
                 (scheme == QuantScheme::W4A16 ? " --w4-method rtn" : "") +
                 " calibrates nothing: give its accuracy budget's evaluation data as --eval "
                 "DATA (or --calib DATA), one of them");
    }
    if (!p.import_calib.empty() || p.int32_bias || !p.overrides.empty() ||
        p.was_given("--method") || p.was_given("--percentile")) {
      fail_usage("--import-calib, --method, --percentile, --int32-bias and --override are not "
                 "used by a round-to-nearest accuracy budget");
    }
    return;
  }
  if (!p.import_calib.empty() && p.eval.empty()) {
    fail_usage("--import-calib ranges come with no samples to hold out: give the accuracy "
               "budget's evaluation data as --eval DATA");
  }
}

void check_budget_input(const ConvertOptions& p, QuantScheme scheme, const LoadedModel& loaded,
                        bool weights_only) {
  if (!weights_only) {
    if (scheme == QuantScheme::Int8Weights || !p.format.empty()) {
      fail_usage("an accuracy budget on an ONNX graph writes an ONNX graph (.onnx or .qfb) with "
                 "--quant w4a16 or int8; --quant int8-weights and --format are for a model "
                 "folder's weights (-o OUT/)");
    }
    return;
  }
  if (loaded.format != FileFormat::HfFolder) {
    fail_usage("an accuracy budget on weights runs the model: give a Hugging Face model folder "
               "(config.json beside the weights), not '" + p.input + "' alone");
  }
  if (!rtn_w4(p, scheme) && scheme != QuantScheme::Int8Weights) {
    fail_usage("an accuracy budget on a model folder quantizes round-to-nearest: drop "
               "--w4-method " + p.w4_method + " (or convert the folder to ONNX first and budget "
               "that graph)");
  }
}

PipelineReport run_budget_convert(const ConvertOptions& p, QuantScheme scheme, DType act,
                                  const W4A16Options& w4, const StaticInt8Options& int8,
                                  Graph& graph, CalibrationTable& table) {
  const auto start = std::chrono::steady_clock::now();
  PipelineReport report;
  std::map<std::string, std::string> op_of;  // node name -> op type, for the report
  for (const Node& n : graph.nodes) op_of.emplace(n.name, n.op_type);
  const std::string mask = resolve_mask_input(graph, p.calib.mask);
  BudgetData data =
      read_budget_data(p, !rtn_w4(p, scheme) && p.import_calib.empty(), graph);
  auto last = std::make_shared<PipelineReport>();
  BudgetProblem problem;
  W4A16Options w4_opts = w4;
  StaticInt8Options int8_opts = int8;
  if (scheme == QuantScheme::Int8Static) {
    for (auto& pass : run_pre_calibration_passes(graph).passes) {
      report.passes.push_back(std::move(pass));
    }
    check_static_int8_options(graph, int8_opts);
    PassReport calib;
    if (p.import_calib.empty()) {
      calib.pass = "calibrate";
      const auto t0 = std::chrono::steady_clock::now();
      MemoryBatches source(inputs_of(data.calib), "calibration data '" + p.calib.data + "'");
      CalibOptions options;
      const auto method = calib_method_from_name(p.calib.method);
      if (!method) fail_usage("--method '" + p.calib.method + "' is not " + calib_method_list());
      options.method = *method;
      options.percentile = p.calib.percentile;
      options.device = int8_opts.device;
      options.threads = p.threads;
      options.mask_input = mask;
      Progress progress("calibrate", "samples", p.show_progress);
      options.progress = [&progress](int64_t done, int64_t total) { progress.update(done, total); };
      table = calibrate(graph, source, options, calib);
      progress.finish();
      calib.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } else {
      table = import_calibration(p.import_calib, calib);
    }
    add_calibration_stats(table, calib);
    report.passes.push_back(std::move(calib));
    for (const auto& [name, range] : table.ranges) int8_opts.activation_amax[name] = range.amax;
    problem = int8_problem(int8_opts, graph, last);
  } else {
    if (w4.method == W4Method::Awq || w4.method == W4Method::Gptq) {
      MemoryBatches source(inputs_of(data.calib), "calibration data '" + p.calib.data + "'");
      const std::vector<W4A16Target> targets = plan_w4a16_targets(graph, w4_opts);
      PassReport calib;
      if (w4.method == W4Method::Awq) {
        AwqOptions awq_options;
        awq_options.block_size = w4_opts.block_size;
        awq_options.device = w4_opts.device;
        w4_opts.awq = std::make_shared<AwqCalibration>(collect_awq_calibration(
            graph, source, targets, awq_options, p.threads, mask, calib));
      } else {
        w4_opts.gptq = std::make_shared<GptqCalibration>(
            collect_gptq_calibration(graph, source, targets, p.threads, mask, calib));
      }
      report.passes.push_back(std::move(calib));
    }
    problem = w4a16_problem(p, w4_opts, act, graph, last);
  }

  const SearchOutcome outcome = search_to_budget(p, problem, graph, std::move(data.eval), mask);
  const BudgetResult& result = outcome.result;
  // The chosen graph once more, for its passes' reports (the build is deterministic).
  graph = problem.build(result.rung_of);
  for (auto& pass : last->passes) report.passes.push_back(std::move(pass));
  std::vector<std::string> precision(problem.layers.size());
  for (size_t i = 0; i < problem.layers.size(); ++i) {
    precision[i] = problem.rungs[static_cast<size_t>(result.rung_of[i])];
    // W4A16's int8 rung is weight-only int8 of MatMul and Gemm: an embedding table (Gather,
    // --w4-include embeddings) on it stays float.
    if (precision[i] == "int8" && op_of[problem.layers[i]] == "Gather") precision[i] = "float";
  }
  report.passes.push_back(budget_report(p, data.stats, problem, outcome, precision, start));
  return report;
}

FolderBudget run_folder_budget(const ConvertOptions& p, QuantScheme scheme,
                               const LoadedModel& loaded) {
  const auto start = std::chrono::steady_clock::now();
  const LinearWeightQuantOptions opts = folder_linear_options(p, scheme);
  const LinearWeightPlan plan = plan_linear_weight_quant(loaded.graph, opts);
  if (plan.quantize.empty()) {
    fail_usage("an accuracy budget found no decoder Linear to quantize in '" + p.input + "'");
  }
  // The search's layers: one per fused group (q/k/v, gate/up of one layer: engines refuse a
  // fused Linear whose parts differ), else one per module; each with its weights.
  BudgetProblem problem;
  std::vector<std::vector<std::string>> weights_of;
  std::vector<std::vector<std::string>> modules_of;
  for (const std::string& w : plan.quantize) {
    constexpr std::string_view kWeight = ".weight";
    const std::string module = w.ends_with(kWeight) ? w.substr(0, w.size() - kWeight.size()) : w;
    const std::string key = fused_group_key(module);
    const std::string unit = key.empty() ? module : key;
    const auto at = std::find(problem.layers.begin(), problem.layers.end(), unit);
    if (at == problem.layers.end()) {
      problem.layers.push_back(unit);
      weights_of.push_back({w});
      modules_of.push_back({module});
    } else {
      const auto i = static_cast<size_t>(at - problem.layers.begin());
      weights_of[i].push_back(w);
      modules_of[i].push_back(module);
    }
  }
  const std::string format =
      p.format.empty() ? std::string(quant_checkpoint_formats().front()) : p.format;
  if (opts.bits == 8) {
    problem.rungs = {"int8", "float"};
  } else if (quant_checkpoint_holds_mixed_schemes(format)) {
    problem.rungs = {"int4", "int8", "float"};
  } else {  // one quantized scheme per checkpoint: int4 or float
    problem.rungs = {"int4", "float"};
  }
  const int top = static_cast<int>(problem.rungs.size()) - 1;

  // Each weight on each quantized rung, dequantized once as the checkpoint's readers compute it
  // (q * scale in the model dtype), then f32 as the decoder graph holds its weights.
  std::vector<std::map<std::string, Tensor>> dequantized(problem.rungs.size() - 1);
  for (int rung = 0; rung < top; ++rung) {
    LinearWeightQuantOptions one = opts;
    one.bits = problem.rungs[static_cast<size_t>(rung)] == "int4" ? 4 : 8;
    for (const std::string& w : plan.quantize) {
      Graph scratch;
      scratch.set_initializer(w, *loaded.graph.find_initializer(w));
      quantize_linear_weight(scratch, w, one);
      const Tensor deq = dequantize_quantized_linear(scratch, *scratch.find_quant_record(w));
      dequantized[static_cast<size_t>(rung)].emplace(w, Tensor::from_f32(deq.to_f32(),
                                                                          deq.shape()));
    }
  }
  const Graph float_graph = build_decoder_graph(p.input, loaded);
  for (const std::string& w : plan.quantize) {
    if (float_graph.find_initializer(w) == nullptr) {
      fail_internal("accuracy budget: the decoder graph of '" + p.input + "' holds no '" + w +
                    "'");
    }
  }
  problem.build = [&](const std::vector<int>& rung_of) {
    Graph g = float_graph;
    for (size_t i = 0; i < rung_of.size(); ++i) {
      if (rung_of[i] == top) continue;
      for (const std::string& w : weights_of[i]) {
        g.set_initializer(w, dequantized[static_cast<size_t>(rung_of[i])].at(w));
      }
    }
    return g;
  };

  const std::string mask = resolve_mask_input(float_graph, p.calib.mask);
  BudgetData data = read_budget_data(p, /*calibrates=*/false, float_graph);
  const SearchOutcome outcome =
      search_to_budget(p, problem, float_graph, std::move(data.eval), mask);
  FolderBudget out;
  std::vector<std::string> precision;
  for (size_t i = 0; i < problem.layers.size(); ++i) {
    const std::string& rung = problem.rungs[static_cast<size_t>(outcome.result.rung_of[i])];
    precision.push_back(rung);
    if (outcome.result.rung_of[i] == 0) continue;
    for (const std::string& m : modules_of[i]) {
      out.precision.push_back("^" + regex_escape(m) + "$=" + rung);
    }
  }
  out.report = budget_report(p, data.stats, problem, outcome, precision, start);
  return out;
}

}  // namespace qforge::cli
