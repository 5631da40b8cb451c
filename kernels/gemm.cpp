#include "kernels/gemm.h"

#include "ir/error.h"
#include "qforge/cublas_config.h"
#if QFORGE_HAVE_CUBLAS
#include "kernels/cuda/cublas_gemm.h"
#endif

namespace qforge {

bool gemm_cuda_built() { return QFORGE_HAVE_CUBLAS != 0; }

void gemm_f32_host(Device device, const GemmShape& shape, const float* a, const float* b,
                   float* c) {
#if QFORGE_HAVE_CUBLAS
  if (kernel_uses_cuda(device)) {
    cuda::sgemm_host(shape, a, b, c);
    return;
  }
#else
  // Without cuBLAS the product runs on the CPU; asking for CUDA where no device answers is
  // still an error, as for every kernel.
  if (device == Device::Cuda) resolve_device(Device::Cuda);
#endif
  gemm_f32(cpu_threads(), shape, a, b, c);
}

void gemm_f32_device(const GemmShape& shape, const float* a, const float* b, float* c,
                     void* stream) {
#if QFORGE_HAVE_CUBLAS
  cuda::sgemm_device(shape, a, b, c, stream);
#else
  (void)shape, (void)a, (void)b, (void)c, (void)stream;
  fail_unsupported("matrix products on CUDA need a build with cuBLAS");
#endif
}

void gemm_f16_device(const GemmShape& shape, const void* a, const void* b, void* c, void* stream) {
#if QFORGE_HAVE_CUBLAS
  cuda::hgemm_device(shape, a, b, c, stream);
#else
  (void)shape, (void)a, (void)b, (void)c, (void)stream;
  fail_unsupported("matrix products on CUDA need a build with cuBLAS");
#endif
}

}  // namespace qforge
