#pragma once
// Helpers shared by the op families: axis normalization, numpy broadcasting, dtype dispatch,
// f16/bf16 <-> f32 conversion, reading shape-like inputs, and deterministic parallel loops.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>
#include <vector>

#include "kernels/cpu/task_pool.h"
#include "runtime/op_context.h"

namespace qforge::ops {

// ---- new outputs -------------------------------------------------------------------------------

// A new tensor whose elements are not set: no zero fill, which for an op that writes every
// element itself is one more pass over memory (and page clearing) per op. `*data` receives the
// elements; the op writes every one of them before the tensor is read, and none after (the
// tensor's storage is read-only from then on, as a shared storage is, unless its last reader
// holds it alone: sole_writable_bytes).
Tensor unset_tensor(DType dtype, Shape shape, std::byte** data);
template <typename T>
Tensor unset_tensor(DType dtype, Shape shape, T** data) {
  std::byte* bytes = nullptr;
  Tensor t = unset_tensor(dtype, std::move(shape), &bytes);
  *data = reinterpret_cast<T*>(bytes);
  return t;
}

// The elements of `t` for an op to overwrite: where `t` is an op's output (unset_tensor's
// storage) that no other tensor shares. Null otherwise (a view, a constant, a feed, a mapped
// file, a value an observer kept). Only for an input the op is the last reader of
// (OpContext::consumed_input).
std::byte* sole_writable_bytes(Tensor& t);

// ---- axes and shapes --------------------------------------------------------------------------

// Maps `axis` in [-rank, rank) to [0, rank); anything else is InvalidInput naming `what`.
int64_t normalize_axis(const OpContext& ctx, int64_t axis, int64_t rank, std::string_view what);
// Same for a list; duplicates are InvalidInput.
std::vector<int64_t> normalize_axes(const OpContext& ctx, std::span<const int64_t> axes,
                                    int64_t rank, std::string_view what);
// Product of dims [begin, end).
int64_t dims_product(std::span<const int64_t> shape, size_t begin, size_t end);
// Row-major element strides.
std::vector<int64_t> contiguous_strides(std::span<const int64_t> shape);

// The values of an integer tensor (i64 or i32) as i64, e.g. a shape or axes input.
std::vector<int64_t> read_int_values(const OpContext& ctx, const Tensor& t, std::string_view what);
// A float tensor's single value (f32/f16/bf16/f64), e.g. Clip's min.
float read_float_scalar(const OpContext& ctx, const Tensor& t, std::string_view what);

// ---- broadcasting -----------------------------------------------------------------------------

// numpy broadcast of several shapes; mismatches are InvalidInput naming the shapes.
Shape broadcast_shapes(const OpContext& ctx, const std::vector<const Shape*>& shapes);

// Walks an output of shape `out` row by row for inputs broadcast to it. Dims are coalesced so
// rows are as long as possible; within a row input k advances by inner_stride(k) (0 or 1).
class Broadcaster {
 public:
  Broadcaster(const Shape& out, const std::vector<const Shape*>& inputs);
  int64_t rows() const { return rows_; }
  int64_t row_length() const { return row_len_; }
  int64_t inner_stride(size_t k) const { return inner_[k]; }
  // Element offset of input k at the start of row `row`.
  int64_t offset(size_t k, int64_t row) const;

  // Calls fn(out_offset, length, in_offsets) for the contiguous pieces of output elements
  // [begin, end); in_offsets[k] is input k's element offset at out_offset (advance it by
  // inner_stride(k) per element).
  template <size_t N, typename F>
  void for_each_span(int64_t begin, int64_t end, F&& fn) const {
    std::array<int64_t, N> offs{};
    int64_t pos = begin;
    while (pos < end) {
      const int64_t row = pos / row_len_;
      const int64_t col = pos % row_len_;
      const int64_t len = std::min(row_len_ - col, end - pos);
      for (size_t k = 0; k < N; ++k) offs[k] = offset(k, row) + col * inner_[k];
      fn(pos, len, offs);
      pos += len;
    }
  }

 private:
  std::vector<int64_t> outer_dims_;            // coalesced dims except the innermost
  std::vector<std::vector<int64_t>> strides_;  // per input, per outer dim
  std::vector<int64_t> inner_;
  int64_t rows_ = 1;
  int64_t row_len_ = 1;
};

// ---- parallel loops ---------------------------------------------------------------------------

// Runs fn(begin, end) over [0, n) in chunks of `grain` (the last may be shorter). Chunk
// boundaries depend only on n and grain, never on the thread count, and chunks never share an
// output, so results are bit-identical for any thread count.
template <typename F>
void parallel_chunks(int threads, int64_t n, int64_t grain, F&& fn) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  const int64_t chunks = (n + grain - 1) / grain;
  // Shared with the calling thread's pool (kernels/cpu/task_pool.h; inline for one thread or
  // one chunk): the caller does not wait for a worker that has not woken yet.
  run_tasks(threads, chunks,
            [&](int64_t c, int) { fn(c * grain, std::min(n, (c + 1) * grain)); });
}
// A grain that keeps about `work_per_chunk` units of work per chunk. The default, 128K units,
// keeps an op of less work than that on one thread: waking another (a futex call) costs more
// than it saves.
inline int64_t grain_for(int64_t work_per_item, int64_t work_per_chunk = 1 << 17) {
  return std::max<int64_t>(1, work_per_chunk / std::max<int64_t>(1, work_per_item));
}

// ---- dtype dispatch ---------------------------------------------------------------------------

template <typename T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>)
    return DType::F32;
  else if constexpr (std::is_same_v<T, double>)
    return DType::F64;
  else if constexpr (std::is_same_v<T, int64_t>)
    return DType::I64;
  else if constexpr (std::is_same_v<T, int32_t>)
    return DType::I32;
  else if constexpr (std::is_same_v<T, int16_t>)
    return DType::I16;
  else if constexpr (std::is_same_v<T, int8_t>)
    return DType::I8;
  else if constexpr (std::is_same_v<T, uint8_t>)
    return DType::U8;
  else
    static_assert(sizeof(T) == 0, "no IR dtype for this C++ type");
}

template <typename... Ts>
struct TypeList {};
using FloatTypes = TypeList<float, double>;
using IntTypes = TypeList<int64_t, int32_t, int16_t, int8_t, uint8_t>;
using NumericTypes = TypeList<float, double, int64_t, int32_t, int16_t, int8_t, uint8_t>;

// Calls fn(std::type_identity<T>{}) for the T of `dtype` in the list; returns false if none.
template <typename... Ts, typename F>
bool visit_dtype(TypeList<Ts...>, DType dtype, F&& fn) {
  return ((dtype == dtype_of<Ts>() ? (fn(std::type_identity<Ts>{}), true) : false) || ...);
}

// f16/bf16 are computed in f32: widen before, narrow after.
inline bool is_half(DType d) { return d == DType::F16 || d == DType::BF16; }
Tensor to_f32(const Tensor& t);                 // f16/bf16/f32 -> f32 (f32: shares storage)
Tensor from_f32(const Tensor& t, DType dtype);  // f32 -> f16/bf16/f32
// Input i as f32 for ops that compute only in f32 (sgemm): f32/f16/bf16 accepted, else
// fail_dtype.
Tensor f32_input(const OpContext& ctx, size_t i);
// Checks input i's dtype is f32/f16/bf16 (fail_dtype otherwise) and returns it.
DType float_dtype(const OpContext& ctx, size_t i);

// Runs fn(ctx) for an op whose f32 kernel composes several steps (Sum, Mean): when an input is
// f16/bf16, fn sees f32 copies of the inputs, and each float output is rounded once to that
// type afterwards, so no intermediate is rounded. Otherwise fn runs on ctx as is.
template <typename F>
void with_widened_halves(OpContext& ctx, F&& fn) {
  DType half = DType::F32;
  for (const Tensor* t : ctx.inputs)
    if (t != nullptr && is_half(t->dtype())) half = t->dtype();
  if (half == DType::F32) {
    fn(ctx);
    return;
  }
  std::vector<Tensor> wide(ctx.inputs.size());
  OpContext inner = ctx.derived();
  inner.inputs.assign(ctx.inputs.size(), nullptr);
  for (size_t i = 0; i < ctx.inputs.size(); ++i) {
    if (ctx.inputs[i] == nullptr) continue;
    wide[i] = is_half(ctx.inputs[i]->dtype()) ? to_f32(*ctx.inputs[i]) : *ctx.inputs[i];
    inner.inputs[i] = &wide[i];
  }
  inner.outputs.resize(ctx.outputs.size());
  fn(inner);
  for (size_t k = 0; k < inner.outputs.size(); ++k) {
    Tensor& out = inner.outputs[k];
    if (!out.empty() && out.dtype() == DType::F32) out = from_f32(out, half);
    ctx.outputs[k] = std::move(out);
  }
}

// Size in bytes of one element for byte-moving ops (gather, concat, transpose...); 4-bit
// dtypes are Unsupported for them.
size_t element_size(const OpContext& ctx, DType dtype, std::string_view what);

// A tensor that reuses `t`'s storage with a new shape (Reshape, Squeeze, Identity...).
Tensor view_as(const Tensor& t, Shape shape);

}  // namespace qforge::ops
