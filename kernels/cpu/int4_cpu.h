#pragma once
// CPU backend of kernels/int4.h, on the task pool (kernels/cpu/task_pool.h). Arguments are
// already validated by the dispatch in kernels/int4.cpp; see kernels/int4.h for the contract.
#include <cstdint>
#include <span>

namespace qforge::cpu {

void quantize_int4_blocked(std::span<const float> w, int64_t rows, int64_t cols, int64_t block_size,
                           std::span<uint16_t> scales_f16, std::span<uint8_t> packed,
                           bool search_scale);
void dequantize_int4_blocked(std::span<const uint8_t> packed, std::span<const uint16_t> scales_f16,
                             int64_t rows, int64_t cols, int64_t block_size, std::span<float> out);

}  // namespace qforge::cpu
