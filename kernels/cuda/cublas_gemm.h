#pragma once
// Row-major GEMMs through cuBLAS (kernels/cuda/cublas_loader.h), compiled with
// QFORGE_HAVE_CUBLAS. Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, so
// each call swaps the operands. f32 GEMMs run with pedantic math (no TF32).
// The backend of kernels/gemm.h: call that dispatch, not these.
#include "kernels/gemm.h"

namespace qforge::cuda {

// Device pointers on `stream` (a cudaStream_t; null: the default stream).
void sgemm_device(const GemmShape& g, const float* a, const float* b, float* c, void* stream);
// fp16 A, B and C (bits), f32 accumulation: cublasGemmEx, for the benchmarks.
void hgemm_device(const GemmShape& g, const void* a, const void* b, void* c, void* stream);
// Host buffers in and out (copies, one product, copies back). C is read when beta != 0.
void sgemm_host(const GemmShape& g, const float* a, const float* b, float* c);

}  // namespace qforge::cuda
