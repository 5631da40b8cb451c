#pragma once
// Mixed precision to an accuracy budget: which layers to keep at higher precision so that a
// quantized model stays within a target (output cosine, output SQNR, top-1 accuracy drop) of
// its float original on evaluation data.
//
// The search is scheme-agnostic: a layer sits on one rung of a ladder (rung 0 the scheme's
// lowest precision, the last rung the highest: float for every ladder), and the caller builds
// the trial graph for any assignment of rungs (W4A16: int4 block -> int8 per channel -> float;
// static INT8: int8 -> float). Every trial is run on the same evaluation batches against the
// float model's outputs, computed once (BudgetEvaluator).
//
// search_budget():
//  1. the top of the ladder (every layer on its last rung): when even it misses the target,
//     the budget is unreachable (BudgetResult::reachable false) and nothing more is tried;
//  2. every layer on rung 0: when it holds, the search ends there;
//  3. sensitivity: each layer alone on rung 0, every other one on the top rung; its loss is how
//     far that trial is from the float model in the target's own metric (1 - cosine, -SQNR, the
//     accuracy drop, then 1 - cosine to break ties), the most damaging first, then node order;
//  4. greedy: from every layer on rung 0, the first m layers in that order move up one rung,
//     for the fewest m that meets the target; when even all of them on rung 1 miss it, the
//     first m of them move up one rung more, and so on. The fewest m is found by galloping
//     (m = 1, 2, 4, ...) and then halving: the m that linear greedy (m = 1, 2, 3, ...) finds
//     whenever the metric improves as layers move up; where it does not, the m found still
//     meets the target, perhaps with a layer more than needed. The last possible move puts
//     every layer on the top rung, which held in step 1, so the search always ends with the
//     target met.
// Trials are deterministic (the runtime's results do not depend on the thread count), so the
// search takes the same path and picks the same layers at any thread count.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ir/batch_source.h"
#include "ir/graph.h"
#include "quant/calib/quant_error.h"

namespace qforge {

// What the budget asks for; every target given must hold.
struct BudgetTarget {
  std::optional<double> min_cosine;  // output cosine to the float model >= this
  std::optional<double> min_sqnr_db;  // output SQNR (dB) >= this
  std::optional<double> max_drop;     // top-1 accuracy drop in points (needs labels) <= this

  [[nodiscard]] bool any() const { return min_cosine || min_sqnr_db || max_drop; }
  // "cosine >= 0.98, SQNR >= 20 dB": for messages.
  [[nodiscard]] std::string text() const;
};

// How a trial graph compares with the float model on the evaluation data: the worst over the
// graph's outputs.
struct BudgetMetric {
  double cosine = 1.0;
  double sqnr_db = 0.0;
  // Top-1 accuracy (%) on labelled data: float and trial model, on the first [N, C] output.
  std::optional<double> accuracy_float, accuracy_quant;

  [[nodiscard]] double drop() const {  // accuracy points lost (0 without labels)
    return accuracy_float && accuracy_quant ? *accuracy_float - *accuracy_quant : 0.0;
  }
  [[nodiscard]] bool meets(const BudgetTarget& target) const;
  // How far from float, in the target's metric first (larger = worse): for ranking layers.
  [[nodiscard]] std::vector<double> loss(const BudgetTarget& target) const;
};

// How outputs are compared. None: every real token's values together, one cosine and one SQNR
// over all of them (as `qforge compare` measures). Mean: a sentence embedding per sample, as
// mean-pooling embedding models (sentence-transformers' MiniLM, E5, GTE) are used: each output
// of rank 3 or more ([batch, seq, ...]) is averaged over its real tokens (over every position
// where the mask does not cover it), and the cosine is the mean over samples of each sample's
// cosine (the SQNR is over the pooled values together); an output of rank 2 is compared per
// row the same way.
enum class BudgetPool { None, Mean };

// One evaluation batch: the model's inputs and the data's extras (`labels`).
struct EvalBatch {
  BatchSource::Feeds inputs;
  BatchSource::Feeds extras;
};

// Runs trial graphs on the evaluation batches against the float graph's outputs (computed once,
// in the constructor). `mask_input` as ModelCompareOptions::mask_input: outputs laid out
// [batch, seq, ...] are compared over real tokens only (pooled over them with BudgetPool::Mean).
class BudgetEvaluator {
 public:
  // Throws Error(Usage) when `needs_labels` and no batch has integer `labels` fitting an
  // [N, C] output, Error(InvalidInput) when there are no batches.
  BudgetEvaluator(const Graph& float_graph, std::vector<EvalBatch> batches, std::string mask_input,
                  int threads, bool needs_labels, BudgetPool pool = BudgetPool::None);

  [[nodiscard]] BudgetMetric evaluate(const Graph& trial) const;
  [[nodiscard]] int64_t samples() const { return samples_; }

 private:
  std::vector<EvalBatch> batches_;
  std::vector<std::string> outputs_;
  std::string mask_input_;
  int threads_ = 0;
  BudgetPool pool_ = BudgetPool::None;
  int64_t samples_ = 0;
  std::vector<std::vector<Tensor>> reference_;  // float outputs per batch
  std::optional<double> accuracy_float_;
};

// The layers the search moves, with the names of the ladder's rungs ("int4", "int8", "float").
struct BudgetProblem {
  std::vector<std::string> layers;  // node names, in node order
  std::vector<std::string> rungs;   // at least 2; the last is the highest precision
  // The trial graph with layer i on rung rung_of[i].
  std::function<Graph(const std::vector<int>& rung_of)> build;
};

struct BudgetTrial {
  std::string what;             // "top", "bottom", "alone NAME", "greedy"
  std::vector<int> rung_of;     // the assignment tried
  int kept = 0;                 // layers above rung 0
  BudgetMetric metric;
  bool meets = false;
};

struct BudgetResult {
  bool reachable = false;
  std::vector<int> rung_of;         // the chosen assignment (meets the target when reachable)
  BudgetMetric metric;              // of the chosen assignment (of the top one when unreachable)
  Graph graph;                      // the chosen trial graph, as built and measured
  std::vector<std::string> ranking;  // layers, most sensitive first (empty when not measured)
  std::vector<BudgetMetric> sensitivity;  // per layer (node order): that layer alone on rung 0
  std::vector<BudgetTrial> trials;  // every trial, in order
};

// Called before each trial with its description and the trials done so far.
using BudgetProgress = std::function<void(const std::string& what, int done)>;

// `probe`, when given, measures the sensitivities (step 3) instead of `evaluator`: a subset of
// its samples, for speed; every trial that decides (steps 1, 2 and 4) runs on `evaluator`.
BudgetResult search_budget(const BudgetProblem& problem, const BudgetEvaluator& evaluator,
                           const BudgetTarget& target, const BudgetProgress& progress = {},
                           const BudgetEvaluator* probe = nullptr);

}  // namespace qforge
