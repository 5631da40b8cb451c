#include "ir/tensor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>

#include "ir/error.h"
#include "ir/half.h"

namespace qforge {

namespace {
constexpr size_t kAlign = 64;
}

OwnedStorage::OwnedStorage(size_t size) : size_(size) {
  const size_t rounded = (size + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, rounded == 0 ? kAlign : rounded);
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, rounded == 0 ? kAlign : rounded);
  data_.reset(static_cast<std::byte*>(p));
}

OwnedStorage::OwnedStorage(std::span<const std::byte> bytes) : size_(bytes.size()) {
  const size_t rounded = std::max((size_ + kAlign - 1) / kAlign * kAlign, kAlign);
  void* p = std::aligned_alloc(kAlign, rounded);
  if (p == nullptr) throw std::bad_alloc();
  if (size_ != 0) std::memcpy(p, bytes.data(), size_);
  std::memset(static_cast<std::byte*>(p) + size_, 0, rounded - size_);  // the padding
  data_.reset(static_cast<std::byte*>(p));
}

void OwnedStorage::AlignedDelete::operator()(std::byte* p) const { std::free(p); }

uint64_t shape_numel(std::span<const int64_t> shape) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) fail_invalid("negative dimension in shape " + shape_to_string(shape));
    if (d != 0 && n > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(d)) {
      fail_invalid("shape " + shape_to_string(shape) + " has too many elements");
    }
    n *= static_cast<uint64_t>(d);
  }
  return n;
}

std::string shape_to_string(std::span<const int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

static size_t checked_bytes(DType dtype, uint64_t numel, const Shape& shape) {
  const auto bytes = dtype_storage_bytes(dtype, numel);
  if (!bytes) fail_invalid("tensor of shape " + shape_to_string(shape) + " is too large");
  return *bytes;
}

Tensor::Tensor(DType dtype, Shape shape)
    : dtype_(dtype), shape_(std::move(shape)), numel_(shape_numel(shape_)) {
  nbytes_ = checked_bytes(dtype_, numel_, shape_);
  owned_ = std::make_shared<OwnedStorage>(nbytes_);
  storage_ = owned_;
}

Tensor::Tensor(DType dtype, Shape shape, std::shared_ptr<const Storage> storage, size_t offset)
    : dtype_(dtype),
      shape_(std::move(shape)),
      numel_(shape_numel(shape_)),
      storage_(std::move(storage)),
      offset_(offset) {
  nbytes_ = checked_bytes(dtype_, numel_, shape_);
  const size_t available = storage_ ? storage_->bytes().size() : 0;
  if (offset_ > available || nbytes_ > available - offset_) {
    fail_invalid("tensor of " + std::to_string(nbytes_) + " bytes at offset " +
                 std::to_string(offset_) + " does not fit in its " + std::to_string(available) +
                 "-byte storage");
  }
}

std::span<const std::byte> Tensor::bytes() const {
  if (!storage_) return {};
  return storage_->bytes().subspan(offset_, nbytes_);
}

std::span<std::byte> Tensor::mutable_bytes() {
  if (!owned_) fail_internal("write to a tensor whose storage is shared or mapped");
  return owned_->mutable_bytes().subspan(offset_, nbytes_);
}

bool Tensor::is_mapped() const {
  return dynamic_cast<const MappedStorage*>(storage_.get()) != nullptr;
}

bool Tensor::equals(const Tensor& other) const {
  if (dtype_ != other.dtype_ || shape_ != other.shape_) return false;
  const auto a = bytes();
  const auto b = other.bytes();
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size()) == 0);
}

namespace {
template <typename T>
void widen(std::span<const std::byte> b, std::vector<float>& out) {
  for (size_t i = 0; i < out.size(); ++i) {
    T v;
    std::memcpy(&v, b.data() + i * sizeof(T), sizeof(T));
    out[i] = static_cast<float>(v);
  }
}
}  // namespace

std::vector<float> Tensor::to_f32() const {
  std::vector<float> out(numel_);
  const auto b = bytes();
  switch (dtype_) {
    case DType::F32: widen<float>(b, out); break;
    case DType::F64: widen<double>(b, out); break;
    case DType::I64: widen<int64_t>(b, out); break;
    case DType::I32: widen<int32_t>(b, out); break;
    case DType::I16: widen<int16_t>(b, out); break;
    case DType::I8: widen<int8_t>(b, out); break;
    case DType::U8: widen<uint8_t>(b, out); break;
    case DType::Bool: widen<uint8_t>(b, out); break;
    case DType::F16:
    case DType::BF16:
      for (size_t i = 0; i < out.size(); ++i) {
        uint16_t h;
        std::memcpy(&h, b.data() + 2 * i, 2);
        out[i] = dtype_ == DType::F16 ? f16_to_f32(h) : bf16_to_f32(h);
      }
      break;
    case DType::I4:
    case DType::U4:
      for (size_t i = 0; i < out.size(); ++i) {
        const auto byte = static_cast<uint8_t>(b[i / 2]);
        int v = (i % 2 == 0) ? (byte & 0x0f) : (byte >> 4);
        if (dtype_ == DType::I4 && v >= 8) v -= 16;
        out[i] = static_cast<float>(v);
      }
      break;
  }
  return out;
}

Tensor Tensor::copy_of(DType dtype, Shape shape, std::span<const std::byte> bytes) {
  const size_t nbytes = checked_bytes(dtype, shape_numel(shape), shape);
  if (bytes.size() != nbytes) {
    fail_internal("Tensor::copy_of: " + std::to_string(bytes.size()) + " bytes for " +
                  std::string(dtype_name(dtype)) + " " + shape_to_string(shape) + ", which needs " +
                  std::to_string(nbytes));
  }
  auto storage = std::make_shared<OwnedStorage>(bytes);
  Tensor t(dtype, std::move(shape), storage, 0);
  t.owned_ = std::move(storage);
  return t;
}

Tensor Tensor::from_f32(std::span<const float> values, Shape shape, DType dtype) {
  Tensor t(dtype, std::move(shape));
  if (t.numel() != values.size()) {
    fail_internal("from_f32: " + std::to_string(values.size()) + " values for shape " +
                  shape_to_string(t.shape()));
  }
  auto out = t.mutable_bytes();
  switch (dtype) {
    case DType::F32: std::memcpy(out.data(), values.data(), values.size() * 4); break;
    case DType::F16:
    case DType::BF16:
      for (size_t i = 0; i < values.size(); ++i) {
        const uint16_t h = dtype == DType::F16 ? f32_to_f16(values[i]) : f32_to_bf16(values[i]);
        std::memcpy(out.data() + 2 * i, &h, 2);
      }
      break;
    default: fail_internal("from_f32: unsupported dtype " + std::string(dtype_name(dtype)));
  }
  return t;
}

}  // namespace qforge
