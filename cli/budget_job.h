#pragma once
// `qforge convert M.onnx --quant w4a16|int8 --target-cosine C | --target-sqnr DB | --max-drop PT`:
// mixed precision to an accuracy budget (quant/budget/budget_search.h) on an ONNX graph.
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

// Quantizes `graph` (the float graph, weights bound and adapters merged) to the budget in place
// of the scheme's passes (and the 16-bit activation pass, for `act` other than F32); returns the
// reports of the passes the chosen graph went through and the "budget" report. For --quant int8,
// fills `table` with the ranges used.
PipelineReport run_budget_convert(const ConvertOptions& p, QuantScheme scheme, DType act,
                                  const W4A16Options& w4, const StaticInt8Options& int8,
                                  Graph& graph, CalibrationTable& table);

}  // namespace qforge::cli
