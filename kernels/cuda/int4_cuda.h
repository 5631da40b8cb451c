#pragma once
// CUDA backend of kernels/int4.h (host buffers in and out), compiled only when
// QFORGE_HAVE_CUDA. Arguments are already validated by the dispatch in kernels/int4.cpp.
#include <cstdint>
#include <span>

namespace qforge::cuda {

void quantize_int4_blocked(std::span<const float> w, int64_t rows, int64_t cols, int64_t block_size,
                           std::span<uint16_t> scales_f16, std::span<uint8_t> packed,
                           bool search_scale);
void dequantize_int4_blocked(std::span<const uint8_t> packed, std::span<const uint16_t> scales_f16,
                             int64_t rows, int64_t cols, int64_t block_size, std::span<float> out);

}  // namespace qforge::cuda
