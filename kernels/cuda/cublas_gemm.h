#pragma once
// Row-major GEMMs through cuBLAS (kernels/cuda/cublas_loader.h), compiled with
// QFORGE_HAVE_CUBLAS. Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, so
// each call swaps the operands. f32 GEMMs run with pedantic math (no TF32).
#include <cstdint>

namespace qforge::cuda {

struct RowMajorGemm {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;  // row-major leading dimensions (elements)
  float alpha = 1.0f, beta = 0.0f;
};

// Device pointers on `stream` (a cudaStream_t; null: the default stream).
void sgemm_device(const RowMajorGemm& g, const float* a, const float* b, float* c, void* stream);
// fp16 A, B and C (bits), f32 accumulation: cublasGemmEx, for the benchmarks.
void hgemm_device(const RowMajorGemm& g, const void* a, const void* b, void* c, void* stream);
// Host buffers in and out (copies, one product, copies back). C is read when beta != 0.
void sgemm_host(const RowMajorGemm& g, const float* a, const float* b, float* c);

}  // namespace qforge::cuda
