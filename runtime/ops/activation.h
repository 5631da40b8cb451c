#pragma once
// Internal activation ops that runtime/op_fusion.h makes (the kernels are in activation.cpp).

namespace qforge::ops {

// qforge.internal GeluChain(x), f32: the five-op GELU as an exporter wrote it, each step rounded
// to f32 as its own op rounds it, in its order: s = x / scale (attribute divide = 1) or
// x * scale, e = erf(s), p = 1 + e, then (x * 0.5) * p (half_first = 1) or (x * p) * 0.5. The
// bits of the five ops, in one pass.
constexpr const char* kGeluChainOp = "GeluChain";

}  // namespace qforge::ops
