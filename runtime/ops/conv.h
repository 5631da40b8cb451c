#pragma once
// Conv (runtime/ops/conv.cpp): its constant weights packed once, when the executor is built,
// for kernels/packed_gemm.h.
#include <memory>

#include "ir/tensor.h"
#include "kernels/packed_gemm.h"
#include "runtime/op_context.h"

namespace qforge::ops {

// qforge.internal ConvRelu(X, W[, B]) with Conv's attributes: Relu(Conv(X, W, B)), what
// runtime/op_fusion.h makes of Conv -> Relu. With W packed, the kernel stores the finished sums
// through the Relu; otherwise one pass over the output follows.
constexpr const char* kConvReluOp = "ConvRelu";

// qforge.internal ConvAddRelu(X, W, B, Z) with Conv's attributes (B may be absent, named ""):
// Relu(Conv(X, W, B) + Z), what runtime/op_fusion.h makes of Conv -> AddRelu (a residual
// connection). With W packed and Z f32 of the output's shape, the kernel adds Z to the
// finished sums and stores them through the Relu; otherwise AddRelu runs after the
// convolution. The same bits as the unfused ops either way.
constexpr const char* kConvAddReluOp = "ConvAddRelu";

// The node's input 1 `weight`, a constant, packed as the product's left-hand side
// [out channels, in channels x taps]: an ONNX Conv (or ConvRelu, ConvAddRelu) with group 1 and a float
// weight of rank 3 or more. Null otherwise, or where this CPU lacks the packed kernel; the op
// then runs im2col and gemm_f32 as before.
std::shared_ptr<const PackedRows> pack_conv_weight(const OpContext& ctx, const Tensor& weight);

}  // namespace qforge::ops
