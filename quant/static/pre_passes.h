#pragma once
// The inference clean-ups that run before calibration and static INT8: BatchNorm folding, then
// Identity/Dropout removal. `qforge calibrate` and `qforge convert --quant int8` both run them,
// so both calibrate the same graph and name the same tensors.
#include "ir/graph.h"
#include "ir/pass.h"

namespace qforge {

PipelineReport run_pre_calibration_passes(Graph& graph);

}  // namespace qforge
