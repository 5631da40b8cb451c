#pragma once
// The sliding-window geometry shared by Conv, ConvTranspose and the pools: kernel, strides,
// dilations, pads (auto_pad resolved) and output size per spatial dim.
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "runtime/op_context.h"

namespace qforge::ops {

struct Window {
  std::vector<int64_t> kernel, strides, dilations, pad_begin, pad_end, in, out;
  size_t rank() const { return kernel.size(); }
  int64_t kernel_size() const;  // product of kernel dims
  int64_t in_size() const;      // product of input spatial dims
  int64_t out_size() const;     // product of output spatial dims
  int64_t extent(size_t i) const { return (kernel[i] - 1) * dilations[i] + 1; }
};

// Reads strides, dilations, pads and auto_pad for a forward window (Conv, pools) over spatial
// dims `in` with kernel `kernel`; `ceil_mode` rounds the output size up as pools may.
Window forward_window(const OpContext& ctx, std::span<const int64_t> in,
                      std::span<const int64_t> kernel, bool ceil_mode);

// The kernel_shape attribute (required for pools), checked against the spatial rank.
std::vector<int64_t> kernel_shape_attr(const OpContext& ctx, size_t spatial_rank);

// Fills the column matrix of x [images, channels, in...]: row (channel, tap) of image i,
// out_size floats (zeros where the window reads padding), starts at
// col + i * image_stride + (channel * kernel_size + tap) * row_stride. Image after image:
// image_stride = channels * kernel_size * out_size, row_stride = out_size; images side by side
// in one wide matrix: image_stride = out_size, row_stride = images * out_size.
void im2col(const OpContext& ctx, const Window& w, const float* x, int64_t images, int64_t channels,
            float* col, int64_t image_stride, int64_t row_stride);

// The column rows of one channel plane at a time, for callers that lay the rows out
// themselves (a convolution writing them into packed panels). One per thread: it keeps scratch.
class PlaneColumns {
 public:
  explicit PlaneColumns(const Window& w);  // `w` must outlive this
  ~PlaneColumns();
  PlaneColumns(const PlaneColumns&) = delete;
  PlaneColumns& operator=(const PlaneColumns&) = delete;

  // The plane's kernel_size() rows of out_size() floats, tap t's row at dst + t * row_stride:
  // the bytes im2col writes for that plane.
  void fill(const float* plane, float* dst, int64_t row_stride);

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace qforge::ops
