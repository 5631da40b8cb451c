#pragma once
// The fp32 arithmetic of a LoRA merge, in the order PEFT does it. Shapes use PEFT's canonical
// view of a weight: [out, in] rows by output feature (a conv's kernel flattened into `in`; an
// embedding seen as [embedding_dim, num_embeddings]). `transposed` means the stored tensor is
// that view transposed, [in, out] (GPT-2 Conv1D, embeddings, ONNX MatMul weights).
// The products go through cblas_sgemm (threaded by OpenBLAS) or cuBLAS; the element-wise loops are
// memory-bound and stay single-threaded (OpenMP teams spinning beside BLAS threads cost more).
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/device.h"

namespace qforge {

// delta = scale * B[out, r] @ A[r, in], written in the stored orientation. On Device::Cuda (or
// Auto with a device) the product is one fp32 cuBLAS GEMM (pedantic math, no TF32): the same
// single rounding per element as the CPU path, though the sum order differs. Cuda without a
// device is Error(Unsupported); a build without cuBLAS headers runs the CPU path.
void lora_delta(std::span<const float> a, std::span<const float> b, int64_t out, int64_t in,
                int64_t r, float scale, bool transposed, std::span<float> delta,
                Device device = Device::Cpu);

// w += v * scale, element by element (scale 1: a plain add).
void add_scaled(std::span<float> w, std::span<const float> v, float scale = 1.0f);

// PEFT's DoRA merge: per canonical row o, norm_o = ||base[o, :] + delta[o, :]||_2 (the norm is
// taken on the weight without earlier adapters, as PEFT's _unmerged_base_weight gives it), then
// w[o, :] = (magnitude[o] / norm_o) * (w[o, :] + delta[o, :]).
void dora_merge(std::span<const float> base, std::span<float> w, std::span<const float> delta,
                std::span<const float> magnitude, int64_t out, int64_t in, bool transposed);

// A row-major [rows, cols] matrix transposed to [cols, rows].
std::vector<float> transpose_2d(std::span<const float> v, int64_t rows, int64_t cols);

}  // namespace qforge
