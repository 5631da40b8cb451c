#pragma once
// Calibration as `qforge calibrate` and `qforge convert --quant int8` share it: the flags, the
// clean-up passes that run before it (so both calibrate the same graph and name the same
// tensors), and the run itself with a progress bar.
#include <string>

#include <CLI/CLI.hpp>

#include "cli/app.h"
#include "cli/calib_flags.h"
#include "ir/graph.h"
#include "ir/pass.h"
#include "kernels/device.h"
#include "ir/calibration_table.h"

namespace qforge::cli {

// --calib (required when `data_required`), --method, --percentile, --calib-size, --batch.
void add_calib_flags(CLI::App& cmd, CalibFlags& flags, bool data_required);
// True when any calibration flag other than --calib was given.
bool calib_tuning_given(const CLI::App& cmd);

// BatchNorm folding and Identity/Dropout clean-up, in that order.
PipelineReport run_pre_passes(Graph& graph);

// Calibrates `graph` on flags.data; reports what it did into `report` ("calibrate").
CalibrationTable run_calibration(const Graph& graph, const CalibFlags& flags, Device device,
                                 int threads, bool show_progress, PassReport& report);

}  // namespace qforge::cli
