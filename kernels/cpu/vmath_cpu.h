#pragma once
// Elementwise math over f32 arrays without branches, in vector lanes (GCC/Clang vector
// extensions, kernels/cpu/lanes.h): four lanes on the SSE2 baseline, eight where the CPU has
// AVX2, 16 where it has AVX-512F (chosen at run time). erf (the runtime's Erf and exact Gelu),
// exp(x - shift) (Softmax) and the logistic sigmoid (Sigmoid, SiLU's). Glibc's erff branches on
// the argument's range, and on activations those branches mispredict about every other element
// (about 20 ns each here; this kernel about 6 ns with four lanes).
//
// erf's accuracy: at most 2.5 ulp from the exact erf over a sweep of every float
// (tests/unit/kernels/test_vmath_cpu.cpp, a stride of 61); erf(-x) = -erf(x) exactly; NaN gives
// NaN, +-inf gives +-1, -0 gives -0. Every element is computed the same way whatever its
// position or the array's length (a tail goes through the same lanes), so the bits do not
// depend on how the caller splits the array among threads.
#include <cstdint>

namespace qforge {

// Auto: 16 lanes where the CPU has AVX-512F, else eight where it has AVX2, else four. Four:
// always four; Eight: eight where the CPU has AVX2 (the tests compare them; all give the same
// bits).
enum class VmathLanes { Auto, Four, Eight };

// y[i] = erf(x[i]) for i < n; x and y may be the same array.
void erf_f32(const float* x, float* y, int64_t n, VmathLanes lanes = VmathLanes::Auto);

// One value, the same bits as the array form.
float erf_f32(float x);

// y[i] = 0.5 * x[i] * (1 + erf(x[i] / sqrt(2))): ONNX Gelu with approximate = "none".
void gelu_erf_f32(const float* x, float* y, int64_t n, VmathLanes lanes = VmathLanes::Auto);

// y[i] = exp(x[i] - shift) (the subtraction in f32, as Softmax's x - max), within 2 ulp of the
// exact exp of the difference where the result is normal; results below 2^-126 are
// gradual (subnormal) and 0 below about 2^-150; overflow gives +inf, -inf gives 0, NaN gives
// NaN. The same bits for an element wherever it sits in the array, like the erf above.
void exp_shifted_f32(const float* x, float* y, int64_t n, float shift,
                     VmathLanes lanes = VmathLanes::Auto);

// y[i] = 1 / (1 + exp(-x[i])), from e = exp(-|x|) (never overflows): 1 / (1 + e) for x >= 0,
// e / (1 + e) below; within 4 ulp; +-inf give 1 and 0, NaN gives NaN.
void sigmoid_f32(const float* x, float* y, int64_t n, VmathLanes lanes = VmathLanes::Auto);

}  // namespace qforge
