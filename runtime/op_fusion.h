#pragma once
// A planning step of the Executor (runtime/executor.cpp, ExecutorOptions::fuse_ops): float
// subgraphs that run faster as one op. Each rewrite keeps the graph's outputs and every value
// read outside the fused nodes; the values inside are no longer computed, so an observer does
// not see them (`compare`, which observes every value, builds its executor without it;
// calibration fuses exactly, around what it observes: FusionOptions below).
//
// - Constant nodes holding a tensor (not f16 or bf16, which HalfCompute::Ort plans per node)
//   become initializers: nothing runs for them.
// - MatMul(A, W) -> Add(., b), W a constant f32 matrix [K, N] and b a constant f32 [N], the
//   product read by that Add alone: one qforge.internal MatMulBias(A, W, b), whose sums start at
//   the bias (runtime/ops/matmul.cpp). The unfused graph adds the bias to the finished sum, so
//   the two differ by that rounding.
// - The exact GELU as exporters write it, x * 0.5 * (1 + erf(x / sqrt 2)) in five ops (Div by
//   sqrt 2 or Mul by 1 / sqrt 2, Erf, Add 1, and the two Muls by x and 0.5 in either order), on
//   f32 constants: one qforge.internal Gelu(x) (ONNX Gelu's exact form, one pass over x).
// - RMSNorm as exporters write it: x * x (or Pow(x, 2)) -> ReduceMean over the last axis (kept)
//   -> Add eps -> Sqrt -> Reciprocal (or Div 1 by it) -> Mul by x [-> Mul by a constant f32
//   weight [N]]: one qforge.internal RmsNorm(x[, w]) with the same f32 steps per row (the
//   squares' sum in double, in eight interleaved sums instead of one).
// - SiLU, Mul(x, Sigmoid(x)): one qforge.internal Silu(x), the same bits in one pass.
// - Conv -> BatchNormalization (inference form), its weights, bias and the normalization's four
//   parameters constant f32, the convolution read by the normalization alone: one Conv whose
//   weights and bias carry the normalization (W * s and (B - mean) * s + bias per output
//   channel, s = scale / sqrt(var + eps), in double rounded once), as ONNX Runtime folds it.
//   It differs from the two ops by that rounding.
// - Conv -> Relu, the convolution read by that Relu alone: one qforge.internal ConvRelu with
//   the Conv's inputs and attributes (runtime/ops/conv.h), the same bits (Relu after the
//   rounding to a 16-bit dtype equals the rounding after Relu).
// - Add -> Relu (a residual connection), the sum read by that Relu alone: one qforge.internal
//   AddRelu(a, b), the same bits in one pass (the sum stored in the inputs' type first).
// - Conv -> that AddRelu, the convolution read by it alone: one qforge.internal
//   ConvAddRelu(X, W, B, Z) (runtime/ops/conv.h), the packed kernel adding Z to its finished
//   sums before the Relu; the same bits.
// - Attention's MatMul(Q, K') -> that Softmax (fused or plain, over the last axis) ->
//   MatMul(., V), each result read by the next alone, K' and V computed values: one
//   qforge.internal Attention (runtime/ops/matmul.h), taking the keys' Transpose too where it
//   swaps K's last two dims and nothing else reads it. The same bits, a block of query rows at
//   a time, the scores never leaving the core's cache.
// Anything else (an intermediate that is a graph output or read twice, constants of other
// values or dtypes, a constant that is also a graph input) is left as it is.
//
// FusionOptions::exact keeps only the rewrites that give the unfused graph's bits (calibration,
// which must observe what the graph computes): constants, MatMul + bias (marked
// bias_after_sums: the bias is added to the finished sums as the Add does, packed or not),
// the five-op GELU as a qforge.internal GeluChain that repeats the exporter's five steps in
// their order per element (kGeluChainOp), SiLU, Conv + Relu, Add + Relu, Conv + AddRelu and a
// Softmax of scaled and biased scores (kScaleAddSoftmaxOp), attention.
// RMSNorm and Conv + BatchNormalization round otherwise and are left as they are.
// FusionOptions::keep names values an observer reads: no fusion takes them inside, but for the
// GELU's erf, which the exact GeluChain then gives as its second output.
#include <string>
#include <unordered_set>

#include "ir/graph.h"

namespace qforge {

struct FusionOptions {
  bool exact = false;
  const std::unordered_set<std::string>* keep = nullptr;  // may be null: none
  // Attention's products and softmax as one op (its kernel is the CPU's: an executor that runs
  // products on a GPU leaves them apart).
  bool attention = true;
};

struct FusedOps {
  int constants = 0;     // Constant nodes made initializers
  int matmul_bias = 0;   // MatMul + Add pairs
  int gelu = 0;          // five-op GELUs
  int rms_norm = 0;      // RMSNorm chains
  int silu = 0;          // Sigmoid-Mul pairs
  int conv_batch_norm = 0;  // BatchNormalizations folded into their Conv
  int conv_relu = 0;     // Conv-Relu pairs
  int add_relu = 0;      // Add-Relu pairs
  int conv_add_relu = 0;  // Conv-AddRelu pairs
  int softmax = 0;       // Softmaxes with their scale (Mul/Div) and bias (Add)
  int attention = 0;     // MatMul -> softmax -> MatMul
};

// Rewrites `graph` in place.
FusedOps fuse_float_ops(Graph& graph, const FusionOptions& options = {});

}  // namespace qforge
