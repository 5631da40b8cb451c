#pragma once
// W4A16 matrix product: Y[M, N] = X[M, K] . dequant(W[K, N]), W block-quantized int4 as
// kernels/int4.h packs it (row-major [K, N], element i in byte i / 2, low nibble first, two's
// complement), one scale per (block of `block_size` rows along K, column), the last block
// possibly partial. An optional zero point per (block, column), a signed value in [-8, 7],
// makes the weight (q - z) * scale (com.microsoft.MatMulNBits' asymmetric form, shifted by 8).
//
// The weight is never materialised: each backend dequantizes a block of K into a small tile
// (CPU) or registers (CUDA) and accumulates in f32. Every output element is one f32 sum over k
// in ascending order, computed by one thread, so the bytes of Y do not depend on the thread
// count. CPU and CUDA agree to float rounding (CUDA splits K across warps and adds the partial
// sums in a fixed order); each is deterministic.
//
// Backends: Cpu (the task pool over tiles of N), Cuda (host buffers in and out; Error(Unsupported)
// without a device), Auto CUDA when available. Sizes that disagree with the view throw
// Error(Internal).
#include <cstdint>
#include <span>

#include "kernels/device.h"

namespace qforge {

struct Int4Weight {
  std::span<const uint8_t> packed;        // int4_packed_bytes(k * n) bytes
  std::span<const uint16_t> scales_f16;   // [blocks, n] fp16 bits, or empty when scales_f32 is set
  std::span<const float> scales_f32;      // [blocks, n], or empty when scales_f16 is set
  std::span<const int8_t> zero_points;    // [blocks, n] in [-8, 7], or empty (symmetric)
  int64_t k = 0;
  int64_t n = 0;
  int64_t block_size = 0;
  // Round each dequantized value to fp16 before the product, as an fp16 DequantizeLinear output
  // holds it ((q - z) * s needs up to 15 significant bits; fp16 keeps 11).
  bool round_to_f16 = false;
};

// X in f32: y = x . dequant(w), all f32. x: [m, k]; y: [m, n]. `threads` > 0 caps the CPU
// backend's threads (the runtime passes its own); 0 uses cpu_threads().
void int4_matmul(std::span<const float> x, int64_t m, const Int4Weight& w, std::span<float> y,
                 Device device, int threads = 0);
// X as fp16 bits, accumulation and Y in f32.
void int4_matmul_f16(std::span<const uint16_t> x, int64_t m, const Int4Weight& w,
                     std::span<float> y, Device device, int threads = 0);

// The reference the kernels are tested against: the f32 weight [k, n] as the product sees it.
void int4_dequantize_weight(const Int4Weight& w, std::span<float> out);

}  // namespace qforge
