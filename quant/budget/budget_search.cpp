#include "quant/budget/budget_search.h"

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <span>
#include <utility>

#include "ir/error.h"
#include "quant/calib/token_mask.h"
#include "runtime/executor.h"

namespace qforge {

namespace {

std::string figure(const char* format, double v) {
  char buf[48];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

const Tensor* find_extra(const BatchSource::Feeds& extras, const std::string& name) {
  for (const auto& [n, t] : extras) {
    if (n == name) return &t;
  }
  return nullptr;
}

// The batch's labels when they fit `out` ([N, C], C >= 2): one integer per row.
std::vector<float> labels_for(const EvalBatch& batch, const Tensor& out) {
  const Tensor* labels = find_extra(batch.extras, "labels");
  if (labels == nullptr || out.rank() != 2 || out.shape()[1] < 2) return {};
  if (dtype_is_float(labels->dtype()) || labels->numel() != static_cast<uint64_t>(out.shape()[0])) {
    return {};
  }
  return labels->to_f32();
}

// Rows of `out` ([N, C]) whose argmax equals the label.
int64_t right_rows(const Tensor& out, const std::vector<float>& labels) {
  const std::vector<float> v = out.to_f32();
  const auto classes = static_cast<size_t>(out.shape()[1]);
  int64_t right = 0;
  for (size_t n = 0; n < labels.size(); ++n) {
    const auto first = v.begin() + static_cast<std::ptrdiff_t>(n * classes);
    const auto arg = std::max_element(first, first + static_cast<std::ptrdiff_t>(classes)) - first;
    right += static_cast<double>(arg) == labels[n];
  }
  return right;
}

// BudgetPool::Mean's per-sample values of `value`, `rows` of them back to back: rank 3 or more
// ([batch, seq, rest...]) averaged over the sequence positions `mask` marks real (over every
// position when `mask` is absent or does not cover `value`), [batch, rest]; rank 2 as it is;
// lower ranks as one sample.
struct PooledRows {
  std::vector<float> values;
  int64_t rows = 1;
};

PooledRows pooled_rows(const Tensor& value, const std::optional<TokenMask>& mask) {
  std::vector<float> v = value.to_f32();
  const Shape& shape = value.shape();
  if (shape.size() < 3) return {std::move(v), shape.size() == 2 ? shape[0] : 1};
  const int64_t batch = shape[0], seq = shape[1];
  const int64_t rest = batch * seq == 0 ? 0 : static_cast<int64_t>(v.size()) / (batch * seq);
  const bool masked = mask && mask->covers(value);
  std::vector<float> out(static_cast<size_t>(batch * rest));
  std::vector<double> acc(static_cast<size_t>(rest));
  for (int64_t b = 0; b < batch; ++b) {
    std::fill(acc.begin(), acc.end(), 0.0);
    int64_t count = 0;
    for (int64_t t = 0; t < seq; ++t) {
      if (masked && !mask->is_real(b, t)) continue;
      const float* row = v.data() + (b * seq + t) * rest;
      for (int64_t k = 0; k < rest; ++k) acc[static_cast<size_t>(k)] += row[k];
      ++count;
    }
    for (int64_t k = 0; k < rest; ++k) {
      out[static_cast<size_t>(b * rest + k)] =
          count == 0 ? 0.0f : static_cast<float>(acc[static_cast<size_t>(k)] / double(count));
    }
  }
  return {std::move(out), batch};
}

}  // namespace

std::string BudgetTarget::text() const {
  std::string out;
  const auto add = [&out](const std::string& s) { out += (out.empty() ? "" : ", ") + s; };
  if (min_cosine) add("cosine >= " + figure("%g", *min_cosine));
  if (min_sqnr_db) add("SQNR >= " + figure("%g", *min_sqnr_db) + " dB");
  if (max_drop) add("top-1 drop <= " + figure("%g", *max_drop) + " points");
  return out;
}

bool BudgetMetric::meets(const BudgetTarget& target) const {
  if (target.min_cosine && !(cosine >= *target.min_cosine)) return false;
  if (target.min_sqnr_db && !(sqnr_db >= *target.min_sqnr_db)) return false;
  if (target.max_drop && !(drop() <= *target.max_drop)) return false;
  return true;
}

std::vector<double> BudgetMetric::loss(const BudgetTarget& target) const {
  std::vector<double> out;
  if (target.max_drop) out.push_back(drop());
  if (target.min_cosine) out.push_back(1.0 - cosine);
  if (target.min_sqnr_db) out.push_back(-sqnr_db);
  out.push_back(1.0 - cosine);  // ties (accuracy drops are coarse) broken by the cosine
  return out;
}

BudgetEvaluator::BudgetEvaluator(const Graph& float_graph, std::vector<EvalBatch> batches,
                                 std::string mask_input, int threads, bool needs_labels,
                                 BudgetPool pool)
    : batches_(std::move(batches)),
      mask_input_(std::move(mask_input)),
      threads_(threads),
      pool_(pool) {
  if (batches_.empty()) fail_invalid("accuracy budget: the evaluation data holds no samples");
  for (const ValueInfo& v : float_graph.outputs) outputs_.push_back(v.name);
  ExecutorOptions eo;
  eo.threads = threads_;
  const Executor exec(float_graph, eo);
  int64_t right = 0, labelled = 0;
  for (const EvalBatch& b : batches_) {
    std::vector<Tensor> out = exec.run(b.inputs);
    for (size_t i = 0; i < out.size(); ++i) {
      if (!dtype_is_float(out[i].dtype())) {
        fail_unsupported("accuracy budget: output '" + outputs_[i] + "' is " +
                         std::string(dtype_name(out[i].dtype())) +
                         "; a budget compares float outputs");
      }
    }
    if (!out.empty()) {
      const std::vector<float> labels = labels_for(b, out[0]);
      if (!labels.empty()) {
        right += right_rows(out[0], labels);
        labelled += static_cast<int64_t>(labels.size());
      }
    }
    samples_ += b.inputs.empty() ? 0 : b.inputs.front().second.shape().at(0);
    reference_.push_back(std::move(out));
  }
  if (labelled > 0) accuracy_float_ = 100.0 * double(right) / double(labelled);
  if (needs_labels && !accuracy_float_) {
    fail_usage("--max-drop needs labelled evaluation data: integer `labels` beside the inputs, "
               "one per row of the first output ([N, C] class scores)");
  }
}

BudgetMetric BudgetEvaluator::evaluate(const Graph& trial) const {
  ExecutorOptions eo;
  eo.threads = threads_;
  const Executor exec(trial, eo);
  std::vector<ErrorSums> sums(outputs_.size());
  // BudgetPool::Mean: per output, the sum of the samples' cosines and their count.
  std::vector<double> sample_cosines(outputs_.size(), 0.0);
  std::vector<int64_t> sample_count(outputs_.size(), 0);
  int64_t right = 0, labelled = 0;
  for (size_t bi = 0; bi < batches_.size(); ++bi) {
    const EvalBatch& b = batches_[bi];
    const std::vector<Tensor> out = exec.run(b.inputs);
    const std::vector<Tensor>& ref = reference_[bi];
    if (out.size() != ref.size()) {
      fail_internal("accuracy budget: a trial graph has " + std::to_string(out.size()) +
                    " outputs, the float model " + std::to_string(ref.size()));
    }
    std::optional<TokenMask> mask;
    if (!mask_input_.empty()) {
      TokenMask m(b.inputs, mask_input_);
      if (!m.all_real()) mask = std::move(m);
    }
    for (size_t i = 0; i < out.size(); ++i) {
      if (out[i].shape() != ref[i].shape()) {
        fail_internal("accuracy budget: output '" + outputs_[i] + "' changed shape");
      }
      if (pool_ == BudgetPool::Mean) {
        const PooledRows pr = pooled_rows(ref[i], mask);
        const std::vector<float>& r = pr.values;
        const std::vector<float> q = pooled_rows(out[i], mask).values;
        const int64_t rows = pr.rows;
        const size_t width = rows == 0 ? 0 : r.size() / static_cast<size_t>(rows);
        for (int64_t row = 0; row < rows; ++row) {
          ErrorSums one;
          const size_t at = static_cast<size_t>(row) * width;
          one.add(std::span(r).subspan(at, width), std::span(q).subspan(at, width));
          sample_cosines[i] += one.cosine();
        }
        sample_count[i] += rows;
        sums[i].add(r, q);
        continue;
      }
      const bool masked = mask && mask->covers(ref[i]);
      const std::vector<float> r = (masked ? mask->real_rows(ref[i]) : ref[i]).to_f32();
      const std::vector<float> q = (masked ? mask->real_rows(out[i]) : out[i]).to_f32();
      sums[i].add(r, q);
    }
    if (!out.empty()) {
      const std::vector<float> labels = labels_for(b, ref[0]);
      if (!labels.empty()) {
        right += right_rows(out[0], labels);
        labelled += static_cast<int64_t>(labels.size());
      }
    }
  }
  BudgetMetric m;
  for (size_t i = 0; i < sums.size(); ++i) {
    const double c = pool_ == BudgetPool::Mean && sample_count[i] > 0
                         ? sample_cosines[i] / double(sample_count[i])
                         : sums[i].cosine();
    const double s = sums[i].sqnr_db();
    if (i == 0 || c < m.cosine) m.cosine = c;
    if (i == 0 || s < m.sqnr_db) m.sqnr_db = s;
  }
  if (labelled > 0) {
    m.accuracy_float = accuracy_float_;
    m.accuracy_quant = 100.0 * double(right) / double(labelled);
  }
  return m;
}

BudgetResult search_budget(const BudgetProblem& problem, const BudgetEvaluator& evaluator,
                           const BudgetTarget& target, const BudgetProgress& progress,
                           const BudgetEvaluator* probe) {
  const size_t n = problem.layers.size();
  if (problem.rungs.size() < 2) fail_internal("accuracy budget: a ladder needs two rungs");
  const int top = static_cast<int>(problem.rungs.size()) - 1;
  BudgetResult result;
  // Runs one trial. A candidate's assignment, metric and graph become the result when it meets
  // the target (the search stops at the first that does after the top one), and the top one's
  // always (unreachable: its metric is reported).
  const auto trial = [&](const std::string& what, const std::vector<int>& rung_of,
                         bool candidate, const BudgetEvaluator& on) -> const BudgetTrial& {
    if (progress) progress(what, static_cast<int>(result.trials.size()));
    Graph g = problem.build(rung_of);
    BudgetTrial t;
    t.what = what;
    t.rung_of = rung_of;
    t.kept = static_cast<int>(std::count_if(rung_of.begin(), rung_of.end(),
                                            [](int r) { return r > 0; }));
    t.metric = on.evaluate(g);
    t.meets = t.metric.meets(target);
    if (candidate && (t.meets || result.trials.empty())) {
      result.rung_of = rung_of;
      result.metric = t.metric;
      result.graph = std::move(g);
    }
    result.trials.push_back(std::move(t));
    return result.trials.back();
  };

  const std::vector<int> all_top(n, top);
  if (!trial("top", all_top, true, evaluator).meets) return result;  // unreachable
  result.reachable = true;
  if (n == 0) return result;
  if (trial("bottom", std::vector<int>(n, 0), true, evaluator).meets) return result;
  std::vector<std::vector<double>> loss(n);
  for (size_t i = 0; i < n; ++i) {
    std::vector<int> alone = all_top;
    alone[i] = 0;
    const BudgetTrial& t =
        trial("alone " + problem.layers[i], alone, false, probe ? *probe : evaluator);
    result.sensitivity.push_back(t.metric);
    loss[i] = t.metric.loss(target);
  }
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&loss](size_t a, size_t b) { return loss[a] > loss[b]; });
  for (size_t i : order) result.ranking.push_back(problem.layers[i]);

  // Rung r's phase: every layer is on rung r - 1 or above; the first m in `order` move to r.
  std::vector<int> base(n, 0);
  for (int rung = 1; rung <= top; ++rung) {
    const auto with_first = [&](size_t m) {
      std::vector<int> state = base;
      for (size_t j = 0; j < m; ++j) state[order[j]] = std::max(state[order[j]], rung);
      return state;
    };
    // The whole phase done is the top of the ladder (known to meet) on the last rung.
    const auto meets_with = [&](size_t m) {
      const std::vector<int> state = with_first(m);
      if (state == all_top) {
        result.rung_of = all_top;
        result.metric = result.trials.front().metric;
        result.graph = problem.build(all_top);
        return true;
      }
      return trial("greedy", state, true, evaluator).meets;
    };
    // Galloping: m = 1, 2, 4, ... until the target holds; then halving between the last m that
    // missed and the first that held, so m is the fewest where the metric grows with m.
    size_t missed = 0, held = 0;
    for (size_t m = 1;; m = std::min(2 * m, n)) {
      if (meets_with(m)) {
        held = m;
        break;
      }
      missed = m;
      if (m == n) break;
    }
    if (held == 0) {  // the whole phase missed: on to the next rung
      base = with_first(n);
      continue;
    }
    // The best trial so far: held. Narrow it down; keep the result of the fewest that held.
    BudgetResult best_state;
    best_state.rung_of = result.rung_of;
    best_state.metric = result.metric;
    best_state.graph = std::move(result.graph);
    while (held - missed > 1) {
      const size_t mid = missed + (held - missed) / 2;
      if (meets_with(mid)) {
        held = mid;
        best_state.rung_of = result.rung_of;
        best_state.metric = result.metric;
        best_state.graph = std::move(result.graph);
      } else {
        missed = mid;
      }
    }
    result.rung_of = std::move(best_state.rung_of);
    result.metric = best_state.metric;
    result.graph = std::move(best_state.graph);
    return result;
  }
  fail_internal("accuracy budget: the greedy search ended without meeting the target");
}

}  // namespace qforge
