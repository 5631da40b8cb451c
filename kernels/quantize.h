#pragma once
// Symmetric INT8 quantization kernels: the contract every backend keeps. A tensor is viewed as
// [outer, channels, inner] (row-major), so a per-channel axis anywhere is
//   outer = prod(shape[:axis]), channels = shape[axis], inner = prod(shape[axis+1:])
// and per-tensor is outer = 1, channels = 1, inner = numel.
//
// Each function picks its backend at run time: Cpu runs the CPU kernels (on the task pool), Cuda
// the CUDA twin (Error(Unsupported) when no device answers), Auto CUDA when available, else CPU
// (silently: callers log their choice once through resolve_device). Buffers are host memory in
// and out.
// Results are bit-identical across backends and thread counts. Sizes that disagree with the
// view throw Error(Internal): they are bugs in the caller, not bad input. `workspace`, when
// given, holds the CUDA backend's device buffers from one call to the next (kernels/workspace.h).
#include <cstdint>
#include <span>

#include "kernels/device.h"
#include "kernels/workspace.h"

namespace qforge {

// Largest magnitude in the order finite < +Inf < NaN, so a non-finite input shows up in the
// result (std::isfinite(amax) is the check for NaN/Inf). 0 for an empty span.
float amax(std::span<const float> x, Device device, KernelWorkspace* workspace = nullptr);

// out[c] = amax over x[o, c, i] for all o, i; out.size() == channels. Same ordering as amax().
void amax_per_channel(std::span<const float> x, int64_t outer, int64_t channels, int64_t inner,
                      std::span<float> out, Device device, KernelWorkspace* workspace = nullptr);

// The scale that maps [-amax, amax] onto [-127, 127]: amax / 127. An all-zero channel
// (amax == 0) gets 1.0, a valid ONNX scale (> 0) that dequantizes to exact zeros; an amax so
// small that amax / 127 underflows to 0 gets the smallest positive float. Throws Internal on a
// non-finite or negative amax: callers check amax first and report the tensor.
float int8_symmetric_scale(float amax);

// q[o, c, i] = clamp(round_half_to_even(x[o, c, i] / scales[c]), -127, 127).
// Rounding is half to even, as ONNX QuantizeLinear specifies (std::nearbyint under the default
// rounding mode on CPU, rintf on CUDA); division is IEEE x / scale, not x * (1 / scale), so the
// result matches QuantizeLinear exactly. -128 is never produced (symmetric range). NaN maps to 0.
// scales.size() == channels, every scale finite and > 0.
void quantize_int8(std::span<const float> x, int64_t outer, int64_t channels, int64_t inner,
                   std::span<const float> scales, std::span<int8_t> out, Device device,
                   KernelWorkspace* workspace = nullptr);

// out[o, c, i] = q[o, c, i] * scales[c]: DequantizeLinear with zero point 0.
void dequantize_int8(std::span<const int8_t> q, int64_t outer, int64_t channels, int64_t inner,
                     std::span<const float> scales, std::span<float> out, Device device,
                     KernelWorkspace* workspace = nullptr);

}  // namespace qforge
