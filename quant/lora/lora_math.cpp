#include "quant/lora/lora_math.h"

#include <cblas.h>

#include <cmath>
#include <vector>

#include "ir/error.h"
#include "qforge/cublas_config.h"
#if QFORGE_HAVE_CUBLAS
#include "kernels/cuda/cublas_gemm.h"
#endif

namespace qforge {

namespace {

void check_size(std::span<const float> s, int64_t n, const char* what) {
  if (s.size() != static_cast<size_t>(n)) {
    fail_internal(std::string("lora math: ") + what + " has " + std::to_string(s.size()) +
                  " elements, expected " + std::to_string(n));
  }
}

}  // namespace

void lora_delta(std::span<const float> a, std::span<const float> b, int64_t out, int64_t in,
                int64_t r, float scale, bool transposed, std::span<float> delta,
                Device device) {
  check_size(a, r * in, "lora_A");
  check_size(b, out * r, "lora_B");
  check_size(delta, out * in, "delta");
  const bool cuda = device == Device::Cuda ? resolve_device(Device::Cuda) == Device::Cuda
                                           : device == Device::Auto && cuda_available();
#if QFORGE_HAVE_CUBLAS
  if (cuda) {
    cuda::RowMajorGemm g;
    g.alpha = scale;
    if (!transposed) {  // [out, in] = B @ A
      g.m = out, g.n = in, g.k = r, g.lda = r, g.ldb = in, g.ldc = in;
      cuda::sgemm_host(g, b.data(), a.data(), delta.data());
    } else {  // [in, out] = A^T @ B^T
      g.trans_a = g.trans_b = true;
      g.m = in, g.n = out, g.k = r, g.lda = in, g.ldb = r, g.ldc = out;
      cuda::sgemm_host(g, a.data(), b.data(), delta.data());
    }
    return;
  }
#else
  (void)cuda;
#endif
  const auto M = static_cast<blasint>(out);
  const auto N = static_cast<blasint>(in);
  const auto K = static_cast<blasint>(r);
  if (!transposed) {  // [out, in] = B @ A
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, scale, b.data(), K, a.data(), N,
                0.0f, delta.data(), N);
  } else {  // [in, out] = A^T @ B^T
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasTrans, N, M, K, scale, a.data(), N, b.data(), K,
                0.0f, delta.data(), M);
  }
}

void add_scaled(std::span<float> w, std::span<const float> v, float scale) {
  check_size(v, static_cast<int64_t>(w.size()), "addend");
  const auto n = static_cast<int64_t>(w.size());
  if (scale == 1.0f) {
    for (int64_t i = 0; i < n; ++i) w[i] += v[i];
  } else {
    for (int64_t i = 0; i < n; ++i) w[i] += v[i] * scale;
  }
}

void dora_merge(std::span<const float> base, std::span<float> w, std::span<const float> delta,
                std::span<const float> magnitude, int64_t out, int64_t in, bool transposed) {
  check_size(base, out * in, "base weight");
  check_size(w, out * in, "weight");
  check_size(delta, out * in, "delta");
  check_size(magnitude, out, "magnitude");
  // Sum of squares per output row, accumulated in double; the norm is then a float as in
  // torch.linalg.norm(...).to(weight.dtype).
  std::vector<double> sumsq(static_cast<size_t>(out), 0.0);
  if (!transposed) {
    for (int64_t o = 0; o < out; ++o) {
      double s = 0.0;
      for (int64_t i = 0; i < in; ++i) {
        const float v = base[o * in + i] + delta[o * in + i];
        s += static_cast<double>(v) * v;
      }
      sumsq[o] = s;
    }
  } else {
    for (int64_t i = 0; i < in; ++i) {
      for (int64_t o = 0; o < out; ++o) {
        const float v = base[i * out + o] + delta[i * out + o];
        sumsq[o] += static_cast<double>(v) * v;
      }
    }
  }
  std::vector<float> factor(static_cast<size_t>(out));
  for (int64_t o = 0; o < out; ++o) {
    factor[o] = magnitude[o] / static_cast<float>(std::sqrt(sumsq[o]));
  }
  const int64_t rows = transposed ? in : out;
  const int64_t cols = transposed ? out : in;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      const float f = factor[transposed ? j : i];
      w[i * cols + j] = f * (w[i * cols + j] + delta[i * cols + j]);
    }
  }
}

std::vector<float> transpose_2d(std::span<const float> v, int64_t rows, int64_t cols) {
  check_size(v, rows * cols, "matrix");
  std::vector<float> out(v.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = v[r * cols + c];
  }
  return out;
}

}  // namespace qforge
