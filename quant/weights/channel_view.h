#pragma once
// A tensor seen as [outer, channels, inner] around its quantization axis, the view the
// per-channel kernels (kernels/quantize.h) take; no axis (per-tensor) is one channel.
#include <cstdint>
#include <optional>

#include "ir/tensor.h"

namespace qforge {

struct ChannelView {
  int64_t outer = 1, channels = 1, inner = 1;
};

inline ChannelView channel_view(const Shape& shape, std::optional<int64_t> axis) {
  ChannelView v;
  if (!axis) {
    v.inner = static_cast<int64_t>(shape_numel(shape));
    return v;
  }
  for (int64_t d = 0; d < *axis; ++d) v.outer *= shape[static_cast<size_t>(d)];
  v.channels = shape[static_cast<size_t>(*axis)];
  for (size_t d = static_cast<size_t>(*axis) + 1; d < shape.size(); ++d) v.inner *= shape[d];
  return v;
}

}  // namespace qforge
