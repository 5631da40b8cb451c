#pragma once
// AWQ's two searches (quant/w4a16/awq.h) on one activation, as functions of the data they need
// and nothing of a graph: the whole-graph pass (apply_awq) and the layer-wise quantizer
// (quant/layerwise/) share them.
//  - awq_search_scales: alpha on the grid, s = mean|x|^alpha normalised, minimising the summed
//    output error of every member weight on the activation's row sample;
//  - awq_search_clip: per block of the scaled weight and output column, the clip ratio (1, 0.95,
//    ..., 0.55) that minimises the block's share of the output error (with
//    AwqOptions::clip_scales, the block scale among those ratios of amax / 7 and signed amax / 8).
// Both give the same bits for any thread count (see awq.h).
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/device.h"
#include "kernels/workspace.h"
#include "quant/w4a16/awq.h"

namespace qforge {

// One weight reading the activation, in the kernels' layout: w [K, N] f32.
struct AwqMember {
  std::vector<float> w;
  int64_t n = 0;
};

struct AwqScaleSearch {
  int best = 0;  // point index; 0 is round-to-nearest (alpha 0 of the mean|x|^alpha family)
  double alpha = 0.0;
  bool duo = false;  // the point is of the mean|x|^alpha / mean|w|^(1 - alpha) family
  double error_rtn = 0.0;
  double error_best = 0.0;
  std::vector<float> s;  // [K], the chosen scales
};

// `workspace` keeps the device buffers of the grid's quantize/dequantize round trips (on CUDA
// the points run one at a time); null on the CPU, where points run in parallel.
AwqScaleSearch awq_search_scales(const AwqActivation& act, std::span<const AwqMember> members,
                                 const AwqOptions& options, Device device,
                                 KernelWorkspace* workspace);

struct AwqClip {
  std::vector<float> limit;  // [blocks, N]; infinity where the block column is not clipped
  // AwqOptions::clip_scales: [blocks, N] fp16 bits, the block scale chosen (it may be negative);
  // the weight is to be rounded with it as is, not clamped to `limit` first. Empty otherwise.
  std::vector<uint16_t> scale;
  double before = 0.0, after = 0.0;
  int64_t clipped = 0;
};

// The clip limits of member `m` scaled by `s` (w[k, :] * s[k]); values beyond a limit are to be
// clamped into the float weight before rounding (with AwqOptions::clip_scales: rounded with the
// chosen scales instead).
AwqClip awq_search_clip(const AwqActivation& act, std::span<const float> s, const AwqMember& m,
                        const AwqOptions& options);

}  // namespace qforge
