#pragma once
// The calibration flags `qforge calibrate` and `qforge convert --quant int8` share
// (cli/calibration_job.h runs the calibration they describe).
#include <string>

#include <CLI/CLI.hpp>

#include "cli/app.h"
#include "cli/calib_flags.h"

namespace qforge::cli {

// --calib (required when `data_required`), --method, --percentile, --calib-size, --batch.
void add_calib_flags(CLI::App& cmd, CalibFlags& flags, bool data_required);
// True when any calibration flag other than --calib was given.
bool calib_tuning_given(const CLI::App& cmd);

}  // namespace qforge::cli
