#pragma once
// Matrix products, one family for every layer: the runtime's MatMul/Gemm/Conv, the LoRA merge's
// deltas, AWQ's and GPTQ's products. CPU through OpenBLAS, CUDA through cuBLAS
// (kernels/cuda/cublas_gemm.h, loaded at first use), behind one dispatch. A constant weight the
// runtime packed once goes through kernels/packed_gemm.h instead.
//
// The CPU f32 product splits C into output tiles whose size depends only on the problem's
// shape; each tile is one single-threaded cblas_sgemm call and tiles never overlap, so the bits
// of C do not depend on how many threads share the tiles. The f64 product is one
// single-threaded cblas_dgemm call.
#include <cstdint>
#include <span>

#include "kernels/device.h"

namespace qforge {

struct GemmShape {
  bool trans_a = false;  // op(A) = A^T: A is stored [k, m]
  bool trans_b = false;  // op(B) = B^T: B is stored [n, k]
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;  // row-major leading dimensions (elements)
  float alpha = 1.0f;
  float beta = 0.0f;  // 0: C is overwritten (its old contents are ignored, NaN included)
};

// C[i] = alpha * op(A[i]) @ op(B[i]) + beta * C[i] for every i, on the CPU with `threads`
// threads; the three spans have the same length. Matrices of different i may share A or B but
// never C.
void gemm_f32_batched(int threads, const GemmShape& shape, std::span<const float* const> a,
                      std::span<const float* const> b, std::span<float* const> c);

inline void gemm_f32(int threads, const GemmShape& shape, const float* a, const float* b,
                     float* c) {
  gemm_f32_batched(threads, shape, {&a, 1}, {&b, 1}, {&c, 1});
}

// C = alpha * op(A) @ op(B) + beta * C in f64 on the CPU, one single-threaded BLAS call.
void gemm_f64(const GemmShape& shape, const double* a, const double* b, double* c);

// Host buffers, run on `device`: Cuda (or Auto with a device answering) in a build with cuBLAS
// copies to the device, runs one cuBLAS product and copies C back; otherwise gemm_f32 with
// cpu_threads(). Cuda where no device answers is Error(Unsupported). cuBLAS and OpenBLAS round differently: callers that must give the same bits
// on every machine pass Device::Cpu.
void gemm_f32_host(Device device, const GemmShape& shape, const float* a, const float* b,
                   float* c);

// True when this binary was built with cuBLAS (CUDA MatMul/Gemm, LoRA products on the GPU).
bool gemm_cuda_built();

// Device pointers on `stream` (a cudaStream_t; null: the default stream); cuBLAS, f32 with
// pedantic math (no TF32). Error(Unsupported) in a build without cuBLAS.
void gemm_f32_device(const GemmShape& shape, const float* a, const float* b, float* c,
                     void* stream);
// fp16 A, B and C (bits), f32 accumulation (cublasGemmEx), for the benchmarks.
void gemm_f16_device(const GemmShape& shape, const void* a, const void* b, void* c, void* stream);

}  // namespace qforge
