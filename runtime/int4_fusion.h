#pragma once
// A planning step of the Executor (runtime/executor.cpp): W4A16 weights stay packed.
//
// - DequantizeLinear(int4 constant [K, N], blocked along axis 0, constant scales [and int4 zero
//   points]) [-> Cast to f32 or f16] feeding only MatMul B inputs: each MatMul becomes a
//   qforge.internal Int4MatMul reading the int4 initializer directly (runtime/ops/
//   matmul_nbits.h); the DequantizeLinear (and Cast) are dropped, so the f32 weight is never
//   materialised. An fp16 DequantizeLinear output (or a Cast to f16) sets round_f16, so the
//   product sees the same weight values as the unfused graph; results differ from it only by
//   the order of the f32 sums.
// - com.microsoft MatMulNBits with constant B, scales and zero points: its weights are repacked
//   once, here, instead of on every run.
// Anything else (a dequantized weight that is also a graph output or read by another op, a
// non-constant weight, a Cast to bf16) is left as it is.
#include "ir/graph.h"

namespace qforge {

// Rewrites `graph` in place; returns how many products now run as Int4MatMul.
int fuse_int4_matmuls(Graph& graph);

}  // namespace qforge
