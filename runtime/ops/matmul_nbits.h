#pragma once
// W4A16 products in the runtime (runtime/ops/matmul_nbits.cpp):
// - com.microsoft MatMulNBits (bits 4): B uint8 [N, n_blocks, block_size / 2] holding unsigned
//   nibbles u (low first) for K rows of column n's block, scales [N * n_blocks] in A's dtype,
//   optional uint8 zero points packed two per byte per column ([N, ceil(n_blocks / 2)]; absent:
//   8), optional bias [N]; Y = A . ((u - zp) * scale). g_idx and float zero points are
//   Unsupported.
// - qforge.internal Int4MatMul: what the executor's planning step (runtime/int4_fusion.h) puts
//   in place of DequantizeLinear(int4 constant, blocked) [-> Cast] -> MatMul and of a
//   MatMulNBits with constant weights: inputs A, W (int4 [K, N] in kernels/int4.h's packing),
//   scales ([n_blocks, N], f16 or f32), zero points (int8 [n_blocks, N] in [-8, 7], optional),
//   bias ([N], optional); attributes block_size and round_f16 (the DequantizeLinear output was
//   fp16). Runs kernels/int4_matmul.h without materialising the f32 weight.
#include <cstdint>
#include <string>

#include "ir/tensor.h"
#include "runtime/op_registry.h"

namespace qforge::ops {

constexpr const char* kInt4MatMulOp = "Int4MatMul";

// MatMulNBits' weights in Int4MatMul's layout.
struct RepackedNBits {
  Tensor packed;  // I4 [K, N]
  Tensor scales;  // F32 [n_blocks, N]
  Tensor zeros;   // I8 [n_blocks, N]; empty when every zero point is the default 8
};
// `what` names the node for errors (InvalidInput on sizes that disagree with K, N, block_size).
RepackedNBits repack_matmulnbits(const std::string& what, const Tensor& b, const Tensor& scales,
                                 const Tensor* zero_points, int64_t k, int64_t n,
                                 int64_t block_size);

// Listed in matmul.cpp's slice of the op table.
void run_matmul_nbits(OpContext& ctx);
void run_int4_matmul(OpContext& ctx);

}  // namespace qforge::ops
