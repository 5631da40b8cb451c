#pragma once
// Internal activation ops that runtime/op_fusion.h makes (the kernels are in activation.cpp).
#include <cstdint>
#include <vector>

#include "ir/tensor.h"
#include "runtime/op_context.h"

namespace qforge::ops {

class Broadcaster;

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
void run_scale_add_softmax(OpContext& ctx);

// ScaleAddSoftmax's rows on f32 scores [count, n]: the scalar scale (null: none; `divide`: x / c,
// else x * c) and the bias (null: none), which `bc` (a Broadcaster over the scores' shape and
// {the scores' shape, the bias's}) places against the scores.
struct SoftmaxRows {
  int64_t n = 0;
  const float* scale = nullptr;
  bool divide = false;
  const float* bias = nullptr;
  const Broadcaster* bc = nullptr;
};
// Rows [begin, end) of the scores: x and y point at row `begin` (y may be x, read before it is
// written), u is scratch (grown as needed). Each row's bits are ScaleAddSoftmax's, whatever the
// rows taken together.
void scale_add_softmax_rows(const SoftmaxRows& rows, int64_t begin, int64_t end, const float* x,
                            float* y, std::vector<float>& u);

}  // namespace qforge::ops
