#include "kernels/cuda/cublas_gemm.h"

#include <cuda_runtime.h>

#include <climits>
#include <string>

#include "ir/error.h"
#include "kernels/cuda/cublas_api.h"

namespace qforge::cuda {

namespace {

int to_int(int64_t v, const char* what) {
  if (v < 0 || v > INT_MAX) {
    fail_unsupported(std::string("cuBLAS GEMM: ") + what + " = " + std::to_string(v) +
                     " does not fit cuBLAS' int");
  }
  return static_cast<int>(v);
}

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    fail_internal(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(status));
  }
}

cublasHandle_t handle_on(void* stream) {
  cublasHandle_t h = cublas_handle();
  check_cublas(cublas().set_stream(h, static_cast<cudaStream_t>(stream)), "cublasSetStream");
  return h;
}

cublasOperation_t op(bool t) { return t ? CUBLAS_OP_T : CUBLAS_OP_N; }

// Bytes a stored row-major matrix spans: rows - 1 full leading dimensions, then one row.
size_t span_bytes(int64_t rows, int64_t cols, int64_t ld) {
  return rows == 0 ? 0 : static_cast<size_t>((rows - 1) * ld + cols) * sizeof(float);
}

}  // namespace

void sgemm_device(const RowMajorGemm& g, const float* a, const float* b, float* c, void* stream) {
  if (g.m == 0 || g.n == 0) return;
  const cublasHandle_t h = handle_on(stream);
  check_cublas(cublas().sgemm(h, op(g.trans_b), op(g.trans_a), to_int(g.n, "N"), to_int(g.m, "M"),
                              to_int(g.k, "K"), &g.alpha, b, to_int(g.ldb, "ldb"), a,
                              to_int(g.lda, "lda"), &g.beta, c, to_int(g.ldc, "ldc")),
               "cublasSgemm");
}

void hgemm_device(const RowMajorGemm& g, const void* a, const void* b, void* c, void* stream) {
  if (g.m == 0 || g.n == 0) return;
  const cublasHandle_t h = handle_on(stream);
  check_cublas(cublas().gemm_ex(h, op(g.trans_b), op(g.trans_a), to_int(g.n, "N"),
                                to_int(g.m, "M"), to_int(g.k, "K"), &g.alpha, b, CUDA_R_16F,
                                to_int(g.ldb, "ldb"), a, CUDA_R_16F, to_int(g.lda, "lda"),
                                &g.beta, c, CUDA_R_16F, to_int(g.ldc, "ldc"),
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
}

void sgemm_host(const RowMajorGemm& g, const float* a, const float* b, float* c) {
  const size_t sa = g.trans_a ? span_bytes(g.k, g.m, g.lda) : span_bytes(g.m, g.k, g.lda);
  const size_t sb = g.trans_b ? span_bytes(g.n, g.k, g.ldb) : span_bytes(g.k, g.n, g.ldb);
  const size_t sc = span_bytes(g.m, g.n, g.ldc);
  float *da = nullptr, *db = nullptr, *dc = nullptr;
  const auto release = [&] {
    cudaFree(da);
    cudaFree(db);
    cudaFree(dc);
  };
  try {
    check_cuda(cudaMalloc(reinterpret_cast<void**>(&da), sa), "cudaMalloc");
    check_cuda(cudaMalloc(reinterpret_cast<void**>(&db), sb), "cudaMalloc");
    check_cuda(cudaMalloc(reinterpret_cast<void**>(&dc), sc), "cudaMalloc");
    check_cuda(cudaMemcpy(da, a, sa, cudaMemcpyHostToDevice), "cudaMemcpy");
    check_cuda(cudaMemcpy(db, b, sb, cudaMemcpyHostToDevice), "cudaMemcpy");
    if (g.beta != 0.0f) check_cuda(cudaMemcpy(dc, c, sc, cudaMemcpyHostToDevice), "cudaMemcpy");
    sgemm_device(g, da, db, dc, nullptr);
    check_cuda(cudaMemcpy(c, dc, sc, cudaMemcpyDeviceToHost), "cudaMemcpy");
  } catch (...) {
    release();
    throw;
  }
  release();
}

}  // namespace qforge::cuda
