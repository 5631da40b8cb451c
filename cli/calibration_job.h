#pragma once
// Calibration as `qforge calibrate` and `qforge convert --quant int8` run it: cli/ opens the
// data set (the importer's BatchSource) from the flags and shows progress; the pass
// (quant/calib/calibration.h) reads batches and never a file.
#include <optional>
#include <set>
#include <string>

#include "cli/calib_flags.h"
#include "ir/calibration_table.h"
#include "ir/graph.h"
#include "ir/pass.h"
#include "kernels/device.h"

namespace qforge::cli {

// Calibrates `graph` on flags.data; reports what it did into `report` ("calibrate"). `only`:
// the values to observe (CalibOptions::only), or every activation.
CalibrationTable run_calibration(const Graph& graph, const CalibFlags& flags, Device device,
                                 int threads, bool show_progress, PassReport& report,
                                 std::optional<std::set<std::string>> only = std::nullopt);

// --import-calib: the table read from `path` (JSON or TensorRT cache), the pass "import-calib".
CalibrationTable import_calibration(const std::string& path, PassReport& report);

// The table's method, sample count and range count in `report`'s stats.
void add_calibration_stats(const CalibrationTable& table, PassReport& report);

}  // namespace qforge::cli
