#pragma once
// CPU backend of kernels/quantize.h, on the task pool (kernels/cpu/task_pool.h). Arguments are
// already validated by the dispatch in kernels/quantize.cpp; see there and quantize.h for the
// contract.
#include <cstdint>
#include <span>

namespace qforge::cpu {

float amax(std::span<const float> x);
void amax_per_channel(std::span<const float> x, int64_t outer, int64_t channels, int64_t inner,
                      std::span<float> out);
void quantize_int8(std::span<const float> x, int64_t channels, int64_t inner,
                   std::span<const float> scales, std::span<int8_t> out);
void dequantize_int8(std::span<const int8_t> q, int64_t channels, int64_t inner,
                     std::span<const float> scales, std::span<float> out);

}  // namespace qforge::cpu
