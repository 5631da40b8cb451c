#pragma once
// CUDA backend of kernels/calib.h (host buffers in and out), compiled only when
// QFORGE_HAVE_CUDA. Arguments are already validated by the dispatch in kernels/calib.cpp.
// Plain C++ so that the dispatch can include it without nvcc.
#include <cstdint>
#include <span>

#include "kernels/calib.h"
#include "kernels/workspace.h"

namespace qforge::cuda {

// Device buffers come from `workspace` (kernels/workspace.h).
ValueRange minmax(std::span<const float> x, KernelWorkspace& workspace);
uint64_t histogram_abs(std::span<const float> x, float scale, std::span<uint64_t> bins,
                       KernelWorkspace& workspace);
// `total` is the sum of `hist`; scores as in kernels/cpu/calib_cpu.h.
void entropy_scores(std::span<const uint64_t> hist, uint64_t total, int quant_levels,
                    std::span<double> scores);
void mse_scores(std::span<const uint64_t> hist, uint64_t total, int quant_max,
                std::span<double> scores);

}  // namespace qforge::cuda
