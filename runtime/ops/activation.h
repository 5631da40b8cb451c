#pragma once
// Internal activation ops that runtime/op_fusion.h makes (the kernels are in activation.cpp).
#include "ir/tensor.h"
#include "runtime/op_context.h"

namespace qforge::ops {

// What qforge.internal AddRelu(a, b) computes: Relu(Add(a, b)), the sum stored in the inputs'
// type first, broadcasting as Add does; for an op that fuses Add -> Relu after its own result.
Tensor add_relu(const OpContext& ctx, const Tensor& a, const Tensor& b);

// qforge.internal GeluChain(x), f32: the five-op GELU as an exporter wrote it, each step rounded
// to f32 as its own op rounds it, in its order: s = x / scale (attribute divide = 1) or
// x * scale, e = erf(s), p = 1 + e, then (x * 0.5) * p (half_first = 1) or (x * p) * 0.5. The
// bits of the five ops, in one pass. A second output, when the node has one, receives e.
constexpr const char* kGeluChainOp = "GeluChain";

// qforge.internal ScaleAddSoftmax(x, c, b): Softmax over the last axis of
// Add(Mul(x, c) or Div(x, c) (attribute divide = 1), b), c and b optional (empty names), each
// step rounded as its op rounds it: the three ops' bits, a row at a time.
constexpr const char* kScaleAddSoftmaxOp = "ScaleAddSoftmax";

}  // namespace qforge::ops
