#pragma once
// CPU backend of kernels/int4_matmul.h, on the task pool (kernels/cpu/task_pool.h). Arguments
// are validated by the dispatch in kernels/int4_matmul.cpp; see kernels/int4_matmul.h for the
// contract.
#include <cstdint>
#include <span>

#include "kernels/int4_matmul.h"

namespace qforge::cpu {

// x: [m, k] f32 (the dispatch widens fp16 activations first); y: [m, n]. Runs an AVX2 build of
// the kernel where the CPU has AVX2 and allow_avx2 is set (tests compare it with the baseline
// SSE2 build: the bytes are the same).
void int4_matmul(const float* x, int64_t m, const Int4Weight& w, float* y, int threads,
                 bool allow_avx2 = true);

// Whether this CPU runs the AVX2 build.
bool int4_matmul_has_avx2();

}  // namespace qforge::cpu
