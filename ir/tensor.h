#pragma once
// A Tensor is a shape, a dtype and a window into shared storage. Storage is either an owned,
// 64-byte aligned buffer or a memory-mapped file; tensors sharing a storage (tied weights,
// views) keep sharing it. A pass that changes a tensor writes a new buffer.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ir/dtype.h"
#include "ir/mapped_file.h"

namespace qforge {

class Storage {
 public:
  virtual ~Storage() = default;
  virtual std::span<const std::byte> bytes() const = 0;
};

class OwnedStorage final : public Storage {
 public:
  explicit OwnedStorage(size_t size);  // zero-filled
  explicit OwnedStorage(std::span<const std::byte> bytes);  // a copy of them, not zeroed first
  std::span<const std::byte> bytes() const override { return {data_.get(), size_}; }
  std::span<std::byte> mutable_bytes() { return {data_.get(), size_}; }

 private:
  struct AlignedDelete {
    void operator()(std::byte* p) const;
  };
  std::unique_ptr<std::byte[], AlignedDelete> data_;
  size_t size_;
};

class MappedStorage final : public Storage {
 public:
  explicit MappedStorage(std::shared_ptr<const MappedFile> file) : file_(std::move(file)) {}
  std::span<const std::byte> bytes() const override { return file_->bytes(); }
  const MappedFile& file() const { return *file_; }

 private:
  std::shared_ptr<const MappedFile> file_;
};

using Shape = std::vector<int64_t>;

// Number of elements; throws InvalidInput on negative dims or overflow.
uint64_t shape_numel(std::span<const int64_t> shape);
std::string shape_to_string(std::span<const int64_t> shape);

class Tensor {
 public:
  Tensor() = default;
  // A new zero-filled tensor with its own storage.
  Tensor(DType dtype, Shape shape);
  // A window of `storage` at byte `offset`; checks that the window fits.
  Tensor(DType dtype, Shape shape, std::shared_ptr<const Storage> storage, size_t offset);

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  size_t rank() const { return shape_.size(); }
  uint64_t numel() const { return numel_; }
  size_t nbytes() const { return nbytes_; }
  bool empty() const { return storage_ == nullptr; }

  std::span<const std::byte> bytes() const;
  // Writable bytes; only for tensors whose storage this tensor created (owned, unshared).
  std::span<std::byte> mutable_bytes();

  template <typename T>
  std::span<const T> data() const {
    const auto b = bytes();
    return {reinterpret_cast<const T*>(b.data()), b.size() / sizeof(T)};
  }
  template <typename T>
  std::span<T> mutable_data() {
    const auto b = mutable_bytes();
    return {reinterpret_cast<T*>(b.data()), b.size() / sizeof(T)};
  }

  const std::shared_ptr<const Storage>& storage() const { return storage_; }
  size_t offset() const { return offset_; }
  bool is_mapped() const;

  // Same dtype, shape and bytes.
  bool equals(const Tensor& other) const;
  // Element values as float (any float or integer dtype; 4-bit unpacked).
  std::vector<float> to_f32() const;
  static Tensor from_f32(std::span<const float> values, Shape shape, DType dtype = DType::F32);
  // A new tensor with its own storage holding a copy of `bytes`, exactly its size
  // (Error(Internal) otherwise). Importers use it: no zero fill before the copy.
  static Tensor copy_of(DType dtype, Shape shape, std::span<const std::byte> bytes);

 private:
  DType dtype_ = DType::F32;
  Shape shape_;
  uint64_t numel_ = 0;
  size_t nbytes_ = 0;
  std::shared_ptr<const Storage> storage_;
  std::shared_ptr<OwnedStorage> owned_;  // set when this tensor may write its storage
  size_t offset_ = 0;
};

}  // namespace qforge
