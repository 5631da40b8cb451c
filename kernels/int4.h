#pragma once
// Block-wise symmetric INT4 weight quantization (W4A16): the contract every backend keeps.
//
// A weight is a row-major [rows, cols] matrix blocked along axis 0, the reduction axis K of a
// MatMul's B[K, N]: block b of column c holds rows [b * block_size, min(rows, (b + 1) *
// block_size)). rows need not be a multiple of block_size: the last block is then partial, as
// ONNX's blocked DequantizeLinear allows (scale shape [ceil(rows / block_size), cols]).
//
// Per (block, column), Int4Scale::Amax: scale = fp16(amax / 7) (an all-zero block gets 1.0; a
// scale that would round to 0 gets the smallest fp16 subnormal, one that would overflow fp16 its
// largest finite value). Int4Scale::Mse chooses the scale by the block's weight error
// sum (w - s * q)^2 instead, data-free, evaluated with the fp16-rounded scale that is written:
//  1. candidates, in order: +m for each magnitude m in fp16(amax * c / 7), c in {1.00, 0.98, ...,
//     0.80}, and fp16(amax / 8); then -m for each but amax / 7 (a negative scale gives the
//     extreme's side the 8th level: q in [-8, 7] spans [-7|s|, 8|s|], as ONNX Runtime's RTN and
//     llama.cpp's Q4_0 use it; -amax / 7 would only mirror +amax / 7). The least error wins;
//     ties go to the earlier candidate (so amax / 7 unless another is strictly better).
//  2. up to two least-squares refinements: for the winner's codes q, s' = fp16(sum(w q) /
//     sum(q^2)) (edge cases as above, sign kept) replaces it when strictly better, codes
//     recomputed from s'.
// A scale may thus be negative; ONNX's DequantizeLinear and com.microsoft MatMulNBits take it as
// is (ONNX Runtime's own quantizer writes negative scales).
// Either way q = clamp(round_half_even(w / float(scale)), -8, 7) computed from the fp16-rounded
// scale, so DequantizeLinear(q, scale) reproduces exactly what dequantize_int4_blocked() gives.
//
// Packing is ONNX's for an int4 tensor of shape [rows, cols]: element i (row-major) lives in
// byte i / 2, low nibble for even i, two's complement. An odd element count leaves the high
// nibble of the last byte zero.
//
// Backends: Cpu runs on the task pool, Cuda the CUDA twin (Error(Unsupported) without a
// device), Auto CUDA when available. Results are bit-identical across backends and thread
// counts. Sizes that disagree with the view throw Error(Internal). Weights must be finite
// (callers check with amax() from kernels/quantize.h and report the tensor); NaN quantizes to 0.
#include <cstdint>
#include <span>
#include <string_view>

#include "kernels/device.h"
#include "kernels/workspace.h"

namespace qforge {

enum class Int4Scale { Amax, Mse };  // scale = amax / 7; least-error search (above)

// ceil(rows / block_size): the number of blocks along the reduction axis.
int64_t int4_block_count(int64_t rows, int64_t block_size);

// Packed bytes for `count` int4 values: ceil(count / 2).
int64_t int4_packed_bytes(int64_t count);

// The fp16 scale (as bits) for a block whose largest magnitude is `amax` (finite, >= 0).
uint16_t int4_symmetric_scale_f16(float amax);

// scales_f16: [int4_block_count(rows, block_size), cols] fp16 bits; packed: int4_packed_bytes(
// rows * cols) bytes. block_size >= 1. `workspace`, here and below, keeps the CUDA backend's
// device buffers from one call to the next (kernels/workspace.h).
void quantize_int4_blocked(std::span<const float> w, int64_t rows, int64_t cols, int64_t block_size,
                           std::span<uint16_t> scales_f16, std::span<uint8_t> packed, Device device,
                           Int4Scale scale = Int4Scale::Amax, KernelWorkspace* workspace = nullptr);

// quantize_int4_blocked, then dequantize_int4_blocked of what it wrote into `out` ([rows, cols]
// f32): the weight as the quantized model holds it. Same bytes as the two calls; on CUDA the
// packed weight stays on the device between them (one upload, for searches that quantize the
// same shape many times).
void int4_round_trip(std::span<const float> w, int64_t rows, int64_t cols, int64_t block_size,
                     std::span<uint16_t> scales_f16, std::span<uint8_t> packed,
                     std::span<float> out, Device device, Int4Scale scale = Int4Scale::Amax,
                     KernelWorkspace* workspace = nullptr);

std::string_view int4_scale_name(Int4Scale scale);  // "amax", "mse"

// out[r, c] = q[r, c] * float(scale[r / block_size, c]), in f32 (exact: |q| <= 8 and an fp16
// scale has 11 significant bits).
void dequantize_int4_blocked(std::span<const uint8_t> packed, std::span<const uint16_t> scales_f16,
                             int64_t rows, int64_t cols, int64_t block_size, std::span<float> out,
                             Device device, KernelWorkspace* workspace = nullptr);

// Two's complement int4 values in [-8, 7] to and from the packing above (CPU, sequential:
// small helpers for the passes). pack_int4 throws Internal on a value out of range.
void pack_int4(std::span<const int8_t> q, std::span<uint8_t> packed);
void unpack_int4(std::span<const uint8_t> packed, std::span<int8_t> q);

}  // namespace qforge
