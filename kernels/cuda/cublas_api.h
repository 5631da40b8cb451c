#pragma once
// The cuBLAS entry points behind kernels/cuda/cublas_loader.h, with cuBLAS' own types. Only the
// kernels/cuda/cublas_*.cpp files include it (CMake gives them the cuBLAS include folder).
#include <cublas_v2.h>

#include <string>

namespace qforge::cuda {

// The few entry points qforge uses.
struct CublasApi {
  cublasStatus_t (*create)(cublasHandle_t*) = nullptr;
  cublasStatus_t (*destroy)(cublasHandle_t) = nullptr;
  cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t) = nullptr;
  cublasStatus_t (*set_math_mode)(cublasHandle_t, cublasMath_t) = nullptr;
  cublasStatus_t (*sgemm)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                          const float*, const float*, int, const float*, int, const float*,
                          float*, int) = nullptr;
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                            const void*, const void*, cudaDataType, int, const void*,
                            cudaDataType, int, const void*, void*, cudaDataType, int,
                            cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
  const char* (*status_string)(cublasStatus_t) = nullptr;
  std::string path;  // what was loaded
};

// Loads the library on the first call (thread-safe), then returns the same table. Throws
// Error(Unsupported) when it cannot be loaded or lacks a symbol.
const CublasApi& cublas();


// The process's handle (created on first use with pedantic math: no TF32, so f32 products stay
// f32), on the default stream. Callers serialise through the CUDA stream.
cublasHandle_t cublas_handle();

// Error(Internal) naming the call on a status other than success.
void check_cublas(cublasStatus_t status, const char* what);

}  // namespace qforge::cuda
