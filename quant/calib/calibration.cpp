#include "quant/calib/calibration.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ir/error.h"
#include "kernels/calib.h"
#include "kernels/calib_math.h"
#include "kernels/cpu_threads_scope.h"
#include "quant/calib/length_order.h"
#include "quant/calib/observer.h"
#include "quant/calib/sample_context.h"
#include "quant/calib/token_mask.h"
#include "runtime/executor.h"
#include "runtime/op_fusion.h"

namespace qforge {

namespace {

// Calibration packs the constant weights as the runtime does (runtime/README.md): each product
// element is then one FMA chain, whatever the batch, its padding or the CPU's vector width, and
// on the AVX-512 kernel the packed products beat cblas_sgemm's (static INT8 of MiniLM, minmax:
// 0.54 s against 0.58 s for calibrate(), bench_calib_overhead), for the packed copy of the
// weights in memory (MiniLM: 42 MB). The exact MatMul + bias adds its bias to the finished sums
// on a packed weight too (calibration_graph). The executor's own fusions stay off: they would
// take observed values inside.
ExecutorOptions calibration_executor_options(int threads) {
  return {.device = Device::Cpu, .threads = threads, .pack_weights = true, .fuse_ops = false};
}

void check_options(const CalibOptions& o) {
  if (!(o.percentile > 0.0 && o.percentile <= 100.0)) {
    fail_usage("--percentile " + std::to_string(o.percentile) + ": use a value in (0, 100]");
  }
  if (o.num_bins < 128 || o.num_bins > 4096) {
    fail_usage("--bins " + std::to_string(o.num_bins) + ": use 128 to 4096 histogram bins");
  }
  if (o.threads < 0) fail_usage("--threads " + std::to_string(o.threads) + ": use 0 or more");
}

// Every value name a node's subgraphs (If/Loop/Scan bodies) read, at any depth: a body may
// capture outer values that the node does not list as inputs.
void subgraph_reads(const Node& node, std::vector<std::string>& out) {
  auto visit = [&](const Graph& g) {
    for (const Node& n : g.nodes) {
      out.insert(out.end(), n.inputs.begin(), n.inputs.end());
      subgraph_reads(n, out);
    }
  };
  for (const Attribute& a : node.attributes) {
    if (a.g) visit(*a.g);
    for (const auto& g : a.graphs) visit(*g);
  }
}

// The values that depend on the data: fed inputs and everything downstream of them.
std::unordered_set<std::string> data_dependent(const Graph& graph,
                                               const std::vector<ValueInfo>& inputs) {
  std::unordered_set<std::string> live;
  for (const ValueInfo& v : inputs) live.insert(v.name);
  for (const Node& node : graph.nodes) {
    std::vector<std::string> reads = node.inputs;
    subgraph_reads(node, reads);
    bool depends = false;
    for (const std::string& r : reads) depends = depends || (!r.empty() && live.count(r) > 0);
    if (!depends) continue;
    for (const std::string& o : node.outputs) {
      if (!o.empty()) live.insert(o);
    }
  }
  return live;
}

// The nodes that the observed values need, in order, where some are not needed: the graph
// without the others, its outputs those of the kept nodes' values it had (else the last kept
// node's first output). What static INT8 observes ends before the model does: MiniLM's last
// layer feeds its FFN's first product and nothing quantized after it, so the two products and
// the rest after that input do not run (11% of the model's multiply-adds). Nodes are in
// topological order (the executor runs them so).
Graph needed_nodes(const Graph& graph, const std::unordered_set<std::string>& observed) {
  std::unordered_set<std::string> wanted = observed;
  std::vector<bool> keep(graph.nodes.size(), false);
  size_t kept = 0;
  for (size_t i = graph.nodes.size(); i-- > 0;) {
    const Node& node = graph.nodes[i];
    const bool needed = std::any_of(node.outputs.begin(), node.outputs.end(), [&](const auto& o) {
      return !o.empty() && wanted.count(o) > 0;
    });
    if (!needed) continue;
    keep[i] = true;
    ++kept;
    std::vector<std::string> reads = node.inputs;
    subgraph_reads(node, reads);
    for (const std::string& r : reads) {
      if (!r.empty()) wanted.insert(r);
    }
  }
  if (kept == graph.nodes.size() || kept == 0) return graph;
  Graph g = graph;
  g.nodes.clear();
  std::unordered_set<std::string> computed;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    if (!keep[i]) continue;
    g.nodes.push_back(graph.nodes[i]);
    for (const std::string& o : graph.nodes[i].outputs) computed.insert(o);
  }
  std::erase_if(g.outputs, [&](const ValueInfo& v) { return computed.count(v.name) == 0; });
  if (g.outputs.empty()) {
    for (const std::string& o : g.nodes.back().outputs) {
      if (o.empty()) continue;
      g.outputs.push_back(ValueInfo{.name = o});
      break;
    }
  }
  spdlog::debug("calibration runs {} of {} nodes: the rest computes nothing it observes", kept,
                graph.nodes.size());
  return g;
}

// The graph as calibration runs it: the nodes the observed values need (needed_nodes), with
// the exact fusions (runtime/op_fusion.h) around the values it observes and those subgraphs
// capture, so every observed value has the unfused graph's bits while the insides of what it
// does not observe (a GELU's five steps, a product's bias add) run as one op. Observing every
// value leaves the graph as it was.
Graph calibration_graph(const Graph& graph, const std::unordered_set<std::string>& observed) {
  Graph g = needed_nodes(graph, observed);
  std::unordered_set<std::string> keep = observed;
  std::vector<std::string> captured;
  for (const Node& node : graph.nodes) subgraph_reads(node, captured);
  keep.insert(captured.begin(), captured.end());
  const FusedOps f = fuse_float_ops(g, {.exact = true, .keep = &keep});
  spdlog::debug("calibration runs {} MatMul + bias, {} GELU, {} SiLU, {} Conv + Relu, {} "
                "Add + Relu, {} Conv + Add + Relu, {} scaled, biased Softmax and {} attention as "
                "one op each (the same bits)",
                f.matmul_bias, f.gelu, f.silu, f.conv_relu, f.add_relu, f.conv_add_relu,
                f.softmax, f.attention);
  return g;
}

bool is_float(DType d) {
  return d == DType::F32 || d == DType::F16 || d == DType::BF16 || d == DType::F64;
}

// Calls fn(name, pieces) for the activations among what the Executor reports, their values in
// pieces laid end to end: an f32 value where it lies (a padded batch's real rows, one piece per
// run of real positions); f16, bf16 and f64 values widened (or narrowed) to f32 first.
template <typename Fn>
MaskedValueObserver activation_observer(const std::unordered_set<std::string>& observed, Fn fn) {
  // `rows`: the real rows of values of other dtypes, one after another.
  return [&observed, fn, rows = std::shared_ptr<OwnedStorage>()](
             const std::string& name, const Tensor& value, const TokenMask* padded) mutable {
    if (!is_float(value.dtype()) || observed.count(name) == 0) return;
    if (value.dtype() == DType::F32 &&
        reinterpret_cast<uintptr_t>(value.bytes().data()) % alignof(float) == 0) {
      if (padded != nullptr) {
        fn(name, FloatPieces(padded->real_spans(value)));
        return;
      }
      const std::span<const float> all[] = {value.data<float>()};
      fn(name, FloatPieces(all));
      return;
    }
    const std::vector<float> f32 =
        (padded != nullptr ? padded->real_rows(value, rows) : value).to_f32();
    const std::span<const float> all[] = {f32};
    fn(name, FloatPieces(all));
  };
}

}  // namespace

int64_t stream_batches(Executor& executor, BatchSource& data, const std::string& mask_input,
                       ValueObserver observe, const std::function<void(int64_t)>& after_batch) {
  std::shared_ptr<OwnedStorage> rows;  // the real rows of one value after another
  return stream_batches(
      executor, data, mask_input,
      [&rows, observe = std::move(observe)](const std::string& name, const Tensor& value,
                                            const TokenMask* padded) {
        observe(name, padded != nullptr ? padded->real_rows(value, rows) : value);
      },
      after_batch);
}

int64_t stream_batches(Executor& executor, BatchSource& data, const std::string& mask_input,
                       MaskedValueObserver observe,
                       const std::function<void(int64_t)>& after_batch) {
  std::optional<TokenMask> mask;  // the running batch's, when it has padded positions
  executor.set_observer([&mask, observe = std::move(observe)](const std::string& name,
                                                              const Tensor& value) {
    observe(name, value, mask && mask->covers(value) ? &*mask : nullptr);
  });
  // Each batch runs only as long as its longest sequence (token_mask.h, cut_trailing_padding).
  const std::vector<SequenceAxis> axes = sequence_axes(executor.inputs(), mask_input);
  int64_t positions = 0, cut_positions = 0;
  data.rewind();
  BatchSource::Feeds batch;
  int64_t batches = 0;
  int64_t served = 0;  // in this pass
  while (data.next(batch)) {
    mask.reset();
    if (!mask_input.empty()) {
      TokenMask m(batch, mask_input);
      positions += m.batch() * m.seq();
      if (const int64_t cut = cut_trailing_padding(batch, axes, m); cut > 0) {
        cut_positions += m.batch() * cut;
        m = TokenMask(batch, mask_input);
      }
      if (!m.all_real()) mask = std::move(m);
    }
    run_batch(executor, batch, data, served);
    served += batch_samples(batch);
    ++batches;
    if (after_batch) after_batch(batch_samples(batch));
  }
  executor.set_observer(nullptr);
  if (cut_positions > 0) {
    spdlog::info("calibration ran {} of {} positions: trailing padding cut from each batch",
                 positions - cut_positions, positions);
  }
  return batches;
}

namespace {

// Runs every batch of one pass through the executor, reporting progress.
int64_t run_pass(Executor& executor, BatchSource& data, const CalibOptions& options,
                 MaskedValueObserver observe, int64_t done, int64_t total) {
  const auto progress = [&](int64_t samples) {
    done += samples;
    if (options.progress) options.progress(done, total);
  };
  if (orders_by_length(executor.inputs(), options.mask_input)) {
    LengthOrderedBatches ordered(data, options.mask_input);
    return stream_batches(executor, ordered, options.mask_input, std::move(observe), progress);
  }
  return stream_batches(executor, data, options.mask_input, std::move(observe), progress);
}

}  // namespace

// TensorRT's KL threshold, floored at the least-squared-error one (the mse method's). KL
// compares the shapes of P and Q and folds every clipped value into the last kept bin, so it
// charges a value clipped from 4x the threshold no more than one clipped from just above it.
// On a tensor whose outliers are whole channels (a transformer's LayerNorm outputs: one channel
// of 384 near 28 where the rest stays below 4), it clips the channel to a quarter of its value;
// the squared error counts how far each value is clipped and keeps it. The floor only ever
// raises the threshold: entropy still clips where clipping also lowers the squared error (a
// rare noise tail), and keeps more wherever KL finds that it should.
namespace {

// entropy_kept of each histogram; the least-squared-error floors searched together.
std::vector<int64_t> entropy_kept_many(std::span<const std::span<const uint64_t>> hists,
                                       Device device) {
  std::vector<int64_t> kept;
  std::vector<size_t> floored;  // where KL clips: the floor may raise it
  std::vector<std::span<const uint64_t>> floor_hists;
  const std::vector<ThresholdChoice> kl = entropy_thresholds(hists, kEntropyLevels, device);
  for (size_t i = 0; i < hists.size(); ++i) {
    kept.push_back(kl[i].kept);
    if (kept.back() == static_cast<int64_t>(hists[i].size())) continue;  // nothing to raise
    floored.push_back(i);
    floor_hists.push_back(hists[i]);
  }
  // hist.size() >= kl >= 128 > kInt8QuantMax, as the MSE search needs.
  const std::vector<ThresholdChoice> floors = mse_thresholds(floor_hists, kInt8QuantMax, device);
  for (size_t f = 0; f < floored.size(); ++f) {
    kept[floored[f]] = std::max(kept[floored[f]], floors[f].kept);
  }
  return kept;
}

}  // namespace

int64_t entropy_kept(std::span<const uint64_t> hist, Device device) {
  const std::span<const uint64_t> hists[1] = {hist};
  return entropy_kept_many(hists, device)[0];
}

namespace {

// A threshold of `kept` bins (fractional) of a histogram of `bins` bins over [0, range], as a
// value: in double, then clamped to what was seen (the top edge may pass FLT_MAX).
double threshold_value(double range, double kept, size_t bins, float amax) {
  return std::fmin(range * kept / static_cast<double>(bins), static_cast<double>(amax));
}

}  // namespace

std::vector<MethodThreshold> choose_thresholds(CalibMethod method,
                                               std::span<const std::span<const uint64_t>> hists,
                                               std::span<const double> ranges,
                                               std::span<const float> amax, double percentile,
                                               Device device) {
  std::vector<double> kept(hists.size());  // in bins
  for (size_t i = 0; i < hists.size(); ++i) kept[i] = static_cast<double>(hists[i].size());
  switch (method) {
    case CalibMethod::MinMax:
      break;
    case CalibMethod::Percentile:
      for (size_t i = 0; i < hists.size(); ++i) {
        kept[i] = percentile_threshold(hists[i], percentile);
      }
      break;
    case CalibMethod::Entropy: {
      const std::vector<int64_t> e = entropy_kept_many(hists, device);
      for (size_t i = 0; i < hists.size(); ++i) kept[i] = static_cast<double>(e[i]);
      break;
    }
    case CalibMethod::Mse: {
      const std::vector<ThresholdChoice> m = mse_thresholds(hists, kInt8QuantMax, device);
      for (size_t i = 0; i < hists.size(); ++i) kept[i] = static_cast<double>(m[i].kept);
      break;
    }
  }
  std::vector<MethodThreshold> out;
  for (size_t i = 0; i < hists.size(); ++i) {
    if (method == CalibMethod::MinMax) {
      out.push_back({amax[i], 0.0});
      continue;
    }
    const std::span<const uint64_t> hist = hists[i];
    const auto n = static_cast<int64_t>(hist.size());
    uint64_t total = 0, above = 0;
    for (int64_t b = 0; b < n; ++b) {
      total += hist[static_cast<size_t>(b)];
      if (static_cast<double>(b) >= kept[i]) above += hist[static_cast<size_t>(b)];
    }
    const double t = threshold_value(ranges[i], kept[i], hist.size(), amax[i]);
    out.push_back({static_cast<float>(t),
                   total > 0 ? static_cast<double>(above) / static_cast<double>(total) : 0.0});
  }
  return out;
}

namespace {

// Percentile clips a fixed share of the values however far they lie. Where a tensor's outliers
// are a few channels at some tokens (a transformer's LayerNorm outputs on text of spread
// lengths: MiniLM keeps 27-68% of their largest |x| at 99.99, where the least squared error
// keeps 94%), those are the values the next layer needs, and the model's output drifts
// (bench/RESULTS.md: mean cosine 0.927 against mse's 0.994). The method stays what was asked
// for; one warning names the tensors where a wider threshold has less than 1/kCostlyClip of
// the expected squared int8 error that the percentile's gives (the mse method's model,
// kernels/calib_math.h). The ratio of the thresholds would not do: one value at 20 among half
// a million ReLU outputs moves the least-error threshold from 3.7 to 5.7 for an error only 8%
// lower. The wider thresholds tried are the histogram's top edge and steps of sqrt(2) below
// it (at most 8), not the mse search, which took 21 ms for MiniLM's 42 histograms (4% of the
// conversion) where these take a few milliseconds.
constexpr double kCostlyClip = 2.0;

// The expected squared error of the histogram's values, in bin widths squared, at a threshold
// of `kept` bins.
double expected_squared_error(std::span<const uint64_t> hist, int64_t kept) {
  double sum = 0.0;
  for (size_t j = 0; j < hist.size(); ++j) {
    if (hist[j] == 0) continue;
    sum += static_cast<double>(hist[j]) *
           calib_math::mse_bin_error(static_cast<int64_t>(j), kept, kInt8QuantMax);
  }
  return sum;
}

void warn_percentile_clipping(std::span<const std::string> names,
                              std::span<const std::span<const uint64_t>> hists,
                              std::span<const double> ranges, std::span<const float> amax,
                              std::span<const MethodThreshold> chosen, double percentile,
                              PassReport& report) {
  struct Worse {
    double ratio;
    size_t tensor;
    int64_t wider;  // the wider threshold, in bins
  };
  std::vector<Worse> worse;
  for (size_t i = 0; i < hists.size(); ++i) {
    // A histogram has at least 128 bins > kInt8QuantMax (HistogramObserver), as the model needs.
    const auto n = static_cast<int64_t>(hists[i].size());
    const int64_t kept = std::clamp<int64_t>(
        std::llround(percentile_threshold(hists[i], percentile)), kInt8QuantMax + 1, n);
    const double at_percentile = expected_squared_error(hists[i], kept);
    Worse best{1.0, i, kept};
    double factor = 1.0;
    for (int step = 0; step < 8; ++step, factor *= 0.7071067811865476) {
      const auto wider = static_cast<int64_t>(std::llround(static_cast<double>(n) * factor));
      if (wider <= kept || wider <= kInt8QuantMax) break;
      const double error = expected_squared_error(hists[i], wider);
      if (at_percentile > best.ratio * error) best = {at_percentile / error, i, wider};
    }
    if (best.ratio > kCostlyClip) worse.push_back(best);
  }
  if (worse.empty()) return;
  const Worse& w = *std::max_element(worse.begin(), worse.end(), [](const Worse& a,
                                                                    const Worse& b) {
    return a.ratio < b.ratio;
  });
  const size_t i = w.tensor;
  report.count("percentile_costly_clips", static_cast<int64_t>(worse.size()));
  char figures[160];
  std::snprintf(figures, sizeof figures,
                "' at %.4g (largest |x| %.4g), where %.4g gives 1/%.3g of its squared error",
                static_cast<double>(chosen[i].amax), static_cast<double>(amax[i]),
                threshold_value(ranges[i], static_cast<double>(w.wider), hists[i].size(),
                                amax[i]),
                w.ratio);
  report.warn(std::to_string(worse.size()) + " of " + std::to_string(hists.size()) +
              " activations clip at the percentile with over " +
              std::to_string(static_cast<int>(kCostlyClip)) +
              "x the squared int8 error of a wider threshold, the worst '" + names[i] + figures +
              ": their rare large values saturate; if `qforge compare` shows the loss, "
              "calibrate with --method entropy or mse");
}

}  // namespace

MethodThreshold choose_threshold(CalibMethod method, std::span<const uint64_t> hist, double range,
                                 float amax, double percentile, Device device) {
  const std::span<const uint64_t> hists[1] = {hist};
  const double ranges[1] = {range};
  const float amaxes[1] = {amax};
  return choose_thresholds(method, hists, ranges, amaxes, percentile, device)[0];
}

std::vector<ValueInfo> calibration_inputs(const Graph& graph) {
  std::vector<ValueInfo> out;
  for (const ValueInfo& v : graph.inputs) {
    if (!graph.has_initializer(v.name)) out.push_back(v);
  }
  return out;
}

CalibrationTable calibrate(const Graph& graph, BatchSource& data, const CalibOptions& options,
                           PassReport& report) {
  check_options(options);
  const auto start = std::chrono::steady_clock::now();
  const CpuThreadsScope threads(options.threads);
  const Device device = resolve_device(options.device);
  std::unordered_set<std::string> observed = data_dependent(graph, calibration_inputs(graph));
  if (options.only) std::erase_if(observed, [&](const auto& n) { return !options.only->count(n); });
  Executor executor(calibration_graph(graph, observed),
                    calibration_executor_options(options.threads));
  const bool histograms = options.method != CalibMethod::MinMax || options.histograms_for_minmax;

  // One pass: ranges and histograms together (quant/calib/observer.h).
  RangeObserver ranges(device);
  HistogramObserver hists(options.num_bins, device);
  const int64_t batches = run_pass(
      executor, data, options,
      activation_observer(observed,
                          [&](const std::string& name, FloatPieces v) {
                            if (histograms) {
                              ranges.add(name, hists.observe(name, v));  // one read
                            } else {
                              ranges.observe(name, v);
                            }
                          }),
      0, data.size());

  // An activation that reaches +-inf (an additive attention mask of -inf, say) has no int8
  // range: it is left out of the table, so the QDQ pass keeps its readers float, and reported.
  std::map<std::string, float> amax;
  std::vector<std::string> infinite;
  for (const auto& [name, s] : ranges.stats()) {
    if (!std::isfinite(s.min) || !std::isfinite(s.max)) {
      infinite.push_back(name);
      continue;
    }
    amax[name] = s.amax();
  }
  CalibrationTable table;
  table.method = std::string(calib_method_name(options.method));
  table.dataset_digest = data.digest();
  table.samples = data.size();
  report.pass = "calibrate";
  report.stats["method"] = table.method;
  if (options.method == CalibMethod::Percentile) report.stats["percentile"] = options.percentile;
  if (histograms) report.stats["bins"] = options.num_bins;
  report.stats["device"] = std::string(device_name(device));
  report.stats["samples"] = data.size();
  report.stats["batches"] = batches;
  report.stats["mask"] = options.mask_input.empty() ? nlohmann::ordered_json(nullptr)
                                                    : nlohmann::ordered_json(options.mask_input);
  report.stats["dataset_digest"] = table.dataset_digest;
  report.stats["observed"] = options.only ? "the values the consumer reads" : "every activation";
  report.stats["tensors"] = nlohmann::ordered_json::array();
  for (const auto& name : infinite) {
    report.warn("activation '" + name + "' reaches infinity on " + data.source() +
                " (an additive mask?); it gets no range and its readers stay float");
    report.count("infinite");
  }
  // Every tensor's threshold first, the searches of all of them together (choose_thresholds).
  std::map<std::string, HistogramObserver::Histogram> counted;
  std::vector<std::span<const uint64_t>> searched;
  std::vector<double> searched_range;
  std::vector<float> searched_amax;
  std::vector<std::string> searched_names;
  if (histograms) {
    for (const auto& [name, s] : ranges.stats()) {
      if (!amax.count(name)) continue;
      std::optional<HistogramObserver::Histogram> h = hists.histogram(name);
      if (!h) continue;
      const HistogramObserver::Histogram& kept = counted[name] = std::move(*h);
      searched.emplace_back(kept.counts);
      searched_range.push_back(kept.range);
      searched_amax.push_back(amax[name]);
      searched_names.push_back(name);
    }
  }
  const std::vector<MethodThreshold> thresholds = choose_thresholds(
      options.method, searched, searched_range, searched_amax, options.percentile, device);
  if (options.method == CalibMethod::Percentile) {
    warn_percentile_clipping(searched_names, searched, searched_range, searched_amax, thresholds,
                             options.percentile, report);
  }
  size_t next_searched = 0;
  for (const auto& [name, s] : ranges.stats()) {
    if (!amax.count(name)) continue;
    const auto hist = counted.find(name);
    const MethodThreshold t = hist != counted.end() ? thresholds[next_searched++]
                                                    : MethodThreshold{amax[name], 0.0};
    table.ranges[name] = {t.amax, s.min, s.max};
    if (hist != counted.end()) {  // searched already: the table takes the counts
      table.histograms[name] = std::move(hist->second.counts);
      table.histogram_ranges[name] = hist->second.range;
    }
    report.stats["tensors"].push_back({{"name", name},
                                       {"min", s.min},
                                       {"max", s.max},
                                       {"observed_amax", amax[name]},
                                       {"amax", t.amax},
                                       {"clipped_fraction", t.clipped},
                                       {"nan", s.nan}});
    if (s.nan > 0) {
      report.warn("activation '" + name + "' held " + std::to_string(s.nan) +
                  " NaN value(s), left out of its range");
    }
    if (s.count > 0 && amax[name] == 0.0f) report.count("all_zero");
  }
  report.stats["calibrated"] = static_cast<int64_t>(table.ranges.size());
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  spdlog::info("calibrate: {} activations over {} samples ({}), {:.2f} s", table.ranges.size(),
               data.size(), table.method, report.seconds);
  return table;
}

int64_t observe_dataset(const Graph& graph, BatchSource& data, int threads,
                        const std::string& mask_input, ValueObserver observe) {
  Executor executor(graph, calibration_executor_options(threads));
  return stream_batches(executor, data, mask_input, std::move(observe), nullptr);
}

}  // namespace qforge
