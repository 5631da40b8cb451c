#pragma once
// `qforge convert M.onnx --quant w4a16|int8 --target-cosine C | --target-sqnr DB | --max-drop PT`:
// mixed precision to an accuracy budget (quant/budget/budget_search.h) on an ONNX graph or a
// model folder (run_folder_budget, below).
//
// Data: --eval DATA when given; otherwise a held-out part of --calib, never used to calibrate:
// its last fifth (at least one sample; the first --calib-size samples when that is given), the
// rest calibrating. W4A16 round-to-nearest calibrates nothing, so there --calib (or --eval) is
// all evaluation data. One calibration run (static INT8's ranges, AWQ's or GPTQ's statistics)
// serves every trial.
// Ladders: W4A16 int4 block -> int8 per channel (weight-only) -> float; static INT8 int8 -> float.
// An unreachable budget (the top of the ladder misses it) throws BudgetUnreachable before
// anything is written; `qforge convert` exits with kBudgetUnreachableExit.
#include <string>

#include "cli/convert_job.h"
#include "importers/load_model.h"
#include "ir/calibration_table.h"
#include "ir/error.h"
#include "ir/graph.h"
#include "ir/pass.h"
#include "quant/schemes.h"
#include "quant/static/static_int8.h"
#include "quant/w4a16/w4a16.h"

namespace qforge::cli {

// The exit code of an unreachable budget (README.md, "Exit codes").
inline constexpr int kBudgetUnreachableExit = 7;

class BudgetUnreachable : public Error {
 public:
  explicit BudgetUnreachable(const std::string& message)
      : Error(ErrorCategory::GateFailed, message) {}
};

// Whether --target-cosine, --target-sqnr or --max-drop was given.
bool budget_requested(const ConvertOptions& p);

// The budget's flags against the scheme and the other flags; Error(Usage) before any reading.
void check_budget_flags(const ConvertOptions& p, QuantScheme scheme);

// The budget against what was read (Error(Usage)): an ONNX graph takes --quant w4a16 or int8 and
// no --format; a model folder's weights (`weights_only`) take round-to-nearest w4a16 or
// int8-weights and need the folder (its config.json builds the decoder graph).
void check_budget_input(const ConvertOptions& p, QuantScheme scheme, const LoadedModel& loaded,
                        bool weights_only);

// Quantizes `graph` (the float graph, weights bound and adapters merged) to the budget in place
// of the scheme's passes (and the 16-bit activation pass, for `act` other than F32); returns the
// reports of the passes the chosen graph went through and the "budget" report. For --quant int8,
// fills `table` with the ranges used.
PipelineReport run_budget_convert(const ConvertOptions& p, QuantScheme scheme, DType act,
                                  const W4A16Options& w4, const StaticInt8Options& int8,
                                  Graph& graph, CalibrationTable& table);

// The budget for a model folder's weight-only quantization (--quant w4a16 or int8-weights,
// round-to-nearest): the decoder graph (cli/hf_graph_job.h) of `loaded` (adapters merged) runs
// the trials, each Linear's weight replaced by its dequantized int4 / int8 form as the
// checkpoint will hold it; the layers are the fused groups (q/k/v, gate/up of a layer share one
// precision) and the other projections. Ladders: int4 -> int8 -> float (int4 -> float for a
// --format holding one scheme), int8 -> float. The whole model is held in f32 with each
// quantized rung's weights: memory grows with the model, unlike the writer. Returns the
// --precision rules (exact module names) that the writer then applies, and the report.
struct FolderBudget {
  std::vector<std::string> precision;  // "^model\.layers\.0\.mlp\.down_proj$=int8", ...
  PassReport report;
};
FolderBudget run_folder_budget(const ConvertOptions& p, QuantScheme scheme,
                               const LoadedModel& loaded);

}  // namespace qforge::cli
