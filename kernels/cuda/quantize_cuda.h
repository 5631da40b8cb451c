#pragma once
// CUDA backend of kernels/quantize.h (host buffers in and out), compiled only when
// QFORGE_HAVE_CUDA. Arguments are already validated by the dispatch in kernels/quantize.cpp.
// Plain C++ so that the dispatch can include it without nvcc.
#include <cstdint>
#include <span>

#include "kernels/workspace.h"

namespace qforge::cuda {

// Device buffers come from `workspace` (kernels/workspace.h).
float amax(std::span<const float> x, KernelWorkspace& workspace);
void amax_per_channel(std::span<const float> x, int64_t outer, int64_t channels, int64_t inner,
                      std::span<float> out, KernelWorkspace& workspace);
void quantize_int8(std::span<const float> x, int64_t channels, int64_t inner,
                   std::span<const float> scales, std::span<int8_t> out,
                   KernelWorkspace& workspace);
void dequantize_int8(std::span<const int8_t> q, int64_t channels, int64_t inner,
                     std::span<const float> scales, std::span<float> out,
                     KernelWorkspace& workspace);

}  // namespace qforge::cuda
