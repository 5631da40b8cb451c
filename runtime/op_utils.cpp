#include "runtime/op_utils.h"

#include <cstdlib>
#include <new>
#include <set>

#include "ir/error.h"
#include "ir/half.h"

namespace qforge::ops {

namespace {

// A 64-byte aligned buffer left as malloc returns it (OwnedStorage zero-fills).
class UnsetStorage final : public Storage {
 public:
  explicit UnsetStorage(size_t size) : size_(size) {
    constexpr size_t kAlign = 64;
    const size_t rounded = std::max<size_t>(kAlign, (size + kAlign - 1) / kAlign * kAlign);
    data_ = static_cast<std::byte*>(std::aligned_alloc(kAlign, rounded));
    if (data_ == nullptr) throw std::bad_alloc();
  }
  ~UnsetStorage() override { std::free(data_); }
  UnsetStorage(const UnsetStorage&) = delete;
  UnsetStorage& operator=(const UnsetStorage&) = delete;
  std::span<const std::byte> bytes() const override { return {data_, size_}; }
  std::byte* data() { return data_; }

 private:
  std::byte* data_;
  size_t size_;
};

}  // namespace

Tensor unset_tensor(DType dtype, Shape shape, std::byte** data) {
  const auto bytes = dtype_storage_bytes(dtype, shape_numel(shape));
  if (!bytes) fail_invalid("tensor of shape " + shape_to_string(shape) + " is too large");
  auto storage = std::make_shared<UnsetStorage>(*bytes);
  *data = storage->data();
  return {dtype, std::move(shape), std::move(storage), 0};
}

std::byte* sole_writable_bytes(Tensor& t) {
  const auto* storage = dynamic_cast<const UnsetStorage*>(t.storage().get());
  if (storage == nullptr || t.storage().use_count() != 1) return nullptr;
  // The storage was made mutable (unset_tensor); only this tensor refers to it.
  return const_cast<UnsetStorage*>(storage)->data() + t.offset();
}

int64_t normalize_axis(const OpContext& ctx, int64_t axis, int64_t rank, std::string_view what) {
  if (axis < -rank || axis >= rank) {
    ctx.fail_invalid(std::string(what) + " " + std::to_string(axis) + " is out of range for rank " +
                     std::to_string(rank));
  }
  return axis < 0 ? axis + rank : axis;
}

std::vector<int64_t> normalize_axes(const OpContext& ctx, std::span<const int64_t> axes,
                                    int64_t rank, std::string_view what) {
  std::vector<int64_t> out;
  std::set<int64_t> seen;
  for (int64_t a : axes) {
    const int64_t n = normalize_axis(ctx, a, rank, what);
    if (!seen.insert(n).second) {
      ctx.fail_invalid(std::string(what) + " lists axis " + std::to_string(n) + " twice");
    }
    out.push_back(n);
  }
  return out;
}

int64_t dims_product(std::span<const int64_t> shape, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end && i < shape.size(); ++i) p *= shape[i];
  return p;
}

std::vector<int64_t> contiguous_strides(std::span<const int64_t> shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) s[i - 1] = s[i] * shape[i];
  return s;
}

std::vector<int64_t> read_int_values(const OpContext& ctx, const Tensor& t, std::string_view what) {
  std::vector<int64_t> out;
  out.reserve(t.numel());
  if (t.dtype() == DType::I64) {
    const auto d = t.data<int64_t>();
    out.assign(d.begin(), d.end());
  } else if (t.dtype() == DType::I32) {
    for (int32_t v : t.data<int32_t>()) out.push_back(v);
  } else {
    ctx.fail_dtype_of(std::string(what), t.dtype());
  }
  return out;
}

float read_float_scalar(const OpContext& ctx, const Tensor& t, std::string_view what) {
  if (t.numel() != 1) {
    ctx.fail_invalid(std::string(what) + " must hold one value, not shape " +
                     shape_to_string(t.shape()));
  }
  if (!dtype_is_float(t.dtype())) ctx.fail_dtype_of(std::string(what), t.dtype());
  return t.to_f32()[0];
}

Shape broadcast_shapes(const OpContext& ctx, const std::vector<const Shape*>& shapes) {
  size_t rank = 0;
  for (const Shape* s : shapes) rank = std::max(rank, s->size());
  Shape out(rank, 1);
  for (const Shape* s : shapes) {
    const size_t lead = rank - s->size();
    for (size_t i = 0; i < s->size(); ++i) {
      const int64_t d = (*s)[i];
      int64_t& o = out[lead + i];
      if (d == o || d == 1) continue;
      if (o == 1) {
        o = d;
        continue;
      }
      std::string all;
      for (const Shape* t : shapes) all += (all.empty() ? "" : " and ") + shape_to_string(*t);
      ctx.fail_invalid("shapes " + all + " do not broadcast");
    }
  }
  return out;
}

Broadcaster::Broadcaster(const Shape& out, const std::vector<const Shape*>& inputs) {
  const size_t rank = out.size();
  const size_t n = inputs.size();
  // Full-rank strides, 0 where an input is broadcast.
  std::vector<std::vector<int64_t>> full(n, std::vector<int64_t>(rank, 0));
  for (size_t k = 0; k < n; ++k) {
    const Shape& s = *inputs[k];
    const size_t lead = rank - s.size();
    int64_t stride = 1;
    for (size_t i = s.size(); i-- > 0;) {
      full[k][lead + i] = s[i] == 1 ? 0 : stride;
      stride *= s[i];
    }
  }
  // Drop size-1 dims, then merge neighbours that every input walks the same way.
  std::vector<int64_t> dims;
  std::vector<std::vector<int64_t>> strides(n);
  for (size_t i = 0; i < rank; ++i) {
    if (out[i] == 1) continue;
    bool merge = !dims.empty();
    for (size_t k = 0; k < n && merge; ++k) merge = strides[k].back() == full[k][i] * out[i];
    if (merge) {
      dims.back() *= out[i];
      for (size_t k = 0; k < n; ++k) strides[k].back() = full[k][i];
    } else {
      dims.push_back(out[i]);
      for (size_t k = 0; k < n; ++k) strides[k].push_back(full[k][i]);
    }
  }
  inner_.assign(n, 0);
  if (dims.empty()) {  // a scalar-like output
    row_len_ = 1;
    rows_ = 1;
  } else {
    row_len_ = dims.back();
    for (size_t k = 0; k < n; ++k) inner_[k] = strides[k].back();
    dims.pop_back();
    for (auto& s : strides) s.pop_back();
    rows_ = 1;
    for (int64_t d : dims) rows_ *= d;
  }
  for (int64_t d : out) {
    if (d == 0) rows_ = 0;
  }
  outer_dims_ = std::move(dims);
  strides_ = std::move(strides);
}

int64_t Broadcaster::offset(size_t k, int64_t row) const {
  int64_t off = 0;
  const auto& st = strides_[k];
  for (size_t i = outer_dims_.size(); i-- > 0;) {
    const int64_t d = outer_dims_[i];
    off += (row % d) * st[i];
    row /= d;
  }
  return off;
}

namespace {

// Every fp16 bit pattern's f32 value: widening is a lookup (256 KiB, built once, read-only).
const std::vector<float>& f16_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(1u << 16);
    for (uint32_t h = 0; h < t.size(); ++h) t[h] = f16_to_f32(static_cast<uint16_t>(h));
    return t;
  }();
  return table;
}

}  // namespace

Tensor to_f32(const Tensor& t) {
  if (t.dtype() == DType::F32) return t;
  if (!is_half(t.dtype())) {
    fail_internal("to_f32 on a tensor of dtype " + std::string(dtype_name(t.dtype())));
  }
  float* pdst = nullptr;
  Tensor out = unset_tensor(DType::F32, t.shape(), &pdst);
  const std::span<float> dst(pdst, out.numel());
  const auto src = t.data<uint16_t>();
  if (t.dtype() == DType::F16) {
    const float* table = f16_table().data();
    for (size_t i = 0; i < dst.size(); ++i) dst[i] = table[src[i]];
  } else {
    for (size_t i = 0; i < dst.size(); ++i) dst[i] = bf16_to_f32(src[i]);
  }
  return out;
}

Tensor from_f32(const Tensor& t, DType dtype) {
  if (dtype == DType::F32) return t;
  if (!is_half(dtype)) fail_internal("from_f32 to dtype " + std::string(dtype_name(dtype)));
  uint16_t* pdst = nullptr;
  Tensor out = unset_tensor(dtype, t.shape(), &pdst);
  const std::span<uint16_t> dst(pdst, out.numel());
  const auto src = t.data<float>();
  if (dtype == DType::F16) {
    for (size_t i = 0; i < dst.size(); ++i) dst[i] = f32_to_f16(src[i]);
  } else {
    for (size_t i = 0; i < dst.size(); ++i) dst[i] = f32_to_bf16(src[i]);
  }
  return out;
}

DType float_dtype(const OpContext& ctx, size_t i) {
  const DType d = ctx.input(i).dtype();
  if (d != DType::F32 && !is_half(d)) ctx.fail_dtype(i);
  return d;
}

Tensor f32_input(const OpContext& ctx, size_t i) {
  float_dtype(ctx, i);
  return to_f32(ctx.input(i));
}

size_t element_size(const OpContext& ctx, DType dtype, std::string_view what) {
  const int bits = dtype_bits(dtype);
  if (bits % 8 != 0) ctx.fail_dtype_of(std::string(what), dtype);
  return static_cast<size_t>(bits / 8);
}

Tensor view_as(const Tensor& t, Shape shape) {
  if (t.empty()) return {t.dtype(), std::move(shape)};
  return {t.dtype(), std::move(shape), t.storage(), t.offset()};
}

}  // namespace qforge::ops
