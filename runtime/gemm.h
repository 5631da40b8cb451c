#pragma once
// f32 matrix products through OpenBLAS, split into output tiles whose size depends only on the
// problem's shape. Each tile is one single-threaded cblas_sgemm call and tiles never overlap,
// so the bits of C do not depend on how many threads share the tiles.
#include <cstdint>
#include <span>

namespace qforge::ops {

struct GemmShape {
  bool trans_a = false;  // op(A) = A^T: A is stored [k, m]
  bool trans_b = false;  // op(B) = B^T: B is stored [n, k]
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;  // row-major leading dimensions (elements)
  float alpha = 1.0f;
  float beta = 0.0f;  // 0: C is overwritten (its old contents are ignored, NaN included)
};

// C[i] = alpha * op(A[i]) @ op(B[i]) + beta * C[i] for every i; the three spans have the same
// length. Matrices of different i may share A or B but never C.
void gemm_f32_batched(int threads, const GemmShape& shape, std::span<const float* const> a,
                      std::span<const float* const> b, std::span<float* const> c);

inline void gemm_f32(int threads, const GemmShape& shape, const float* a, const float* b,
                     float* c) {
  gemm_f32_batched(threads, shape, {&a, 1}, {&b, 1}, {&c, 1});
}

}  // namespace qforge::ops
