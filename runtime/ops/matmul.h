#pragma once
// MatMul and Gemm (runtime/ops/matmul.cpp): their constant weights packed once, when the
// executor is built, for kernels/packed_gemm.h.
#include <cstdint>
#include <memory>
#include <vector>

#include "ir/tensor.h"
#include "kernels/packed_gemm.h"
#include "runtime/op_context.h"

namespace qforge::ops {

// qforge.internal MatMulBias(A, B, bias): A @ B + bias, B a 2-D matrix [K, N] and bias f32 [N];
// what runtime/op_fusion.h makes of MatMul -> Add. With B packed, the sums start at the bias,
// unless the int attribute kBiasAfterSumsAttr is 1 (the exact fusion's): then the bias is added
// to the finished sums, as the Add does, whether B is packed or not.
constexpr const char* kMatMulBiasOp = "MatMulBias";
constexpr const char* kBiasAfterSumsAttr = "bias_after_sums";

// qforge.internal Attention(Q, K, c, b, V[, z]) (runtime/op_fusion.h): attention's MatMul ->
// ScaleAddSoftmax -> MatMul, MatMul(ScaleAddSoftmax(MatMul(Q, K'), c, b), V), where K' is
// input 1 as it is [..., k, n] or, where the node has the Transpose's `perm` (the fusion took
// a Transpose that swaps the last two dims), input 1 [..., n, k] transposed by it; `divide` as
// ScaleAddSoftmax has it, c and b optional. With input 5 z (an f32 scalar), the probabilities
// go through an exporter's NaN guard first, Where(IsNaN(p), z, p). The unfused ops' bits: each
// product element one
// FMA chain, each row of scores ScaleAddSoftmax's, computed a block of query rows at a time so
// that the scores stay in the core's cache instead of being written out and read back twice.
constexpr const char* kAttentionOp = "Attention";
// Whether a Transpose's perm swaps the last two of its dims and keeps the others (the keys'
// Transpose the Attention op takes).
bool swaps_last_two(const std::vector<int64_t>& perm);

// The node's input 1 `weight`, a constant, packed for the product the op will run: a MatMul
// or MatMulBias whose B is one matrix [K, N], or a Gemm with transA = 0 and alpha = 1 (B or
// B^T by transB).
// Null where the node computes another product, where the weight is not a 2-D float tensor, or
// where this CPU lacks the packed kernel; the op then runs gemm_f32 as before.
std::shared_ptr<const PackedMatrix> pack_constant_weight(const OpContext& ctx,
                                                         const Tensor& weight);

}  // namespace qforge::ops
