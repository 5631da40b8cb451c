#pragma once
// CPU (OpenMP) backend of kernels/int4_matmul.h. Arguments are validated by the dispatch in
// kernels/int4_matmul.cpp; see kernels/int4_matmul.h for the contract.
#include <cstdint>
#include <span>

#include "kernels/int4_matmul.h"

namespace qforge::cpu {

// x: [m, k] f32 (the dispatch widens fp16 activations first); y: [m, n].
void int4_matmul(const float* x, int64_t m, const Int4Weight& w, float* y, int threads);

}  // namespace qforge::cpu
