#pragma once
// CUDA backend of kernels/int4.h (host buffers in and out), compiled only when
// QFORGE_HAVE_CUDA. Arguments are already validated by the dispatch in kernels/int4.cpp.
#include <cstdint>
#include <span>

#include "kernels/workspace.h"

namespace qforge::cuda {

// Device buffers come from `workspace` (kernels/workspace.h).
void quantize_int4_blocked(std::span<const float> w, int64_t rows, int64_t cols, int64_t block_size,
                           std::span<uint16_t> scales_f16, std::span<uint8_t> packed,
                           bool search_scale, KernelWorkspace& workspace);
void int4_round_trip(std::span<const float> w, int64_t rows, int64_t cols, int64_t block_size,
                     std::span<uint16_t> scales_f16, std::span<uint8_t> packed,
                     std::span<float> out, bool search_scale, KernelWorkspace& workspace);
void dequantize_int4_blocked(std::span<const uint8_t> packed, std::span<const uint16_t> scales_f16,
                             int64_t rows, int64_t cols, int64_t block_size, std::span<float> out,
                             KernelWorkspace& workspace);

}  // namespace qforge::cuda
