// Turns a pickled tensor record (storage, offset, size, stride, dtype) into an IR Tensor.
#include <cstring>

#include "importers/torch/byte_io.h"
#include "importers/torch/torch_archive.h"
#include "importers/torch/torch_types.h"
#include "ir/error.h"

namespace qforge::torch_detail {

namespace {

// torch's rule: row-major strides, where dimensions of size 1 may have any stride.
bool is_contiguous(const Shape& size, const std::vector<int64_t>& stride) {
  int64_t expected = 1;
  for (size_t i = size.size(); i-- > 0;) {
    if (size[i] != 1 && stride[i] != expected) return false;
    expected *= size[i];
  }
  return true;
}

// Copies a strided view into a new contiguous tensor. The caller has checked that every
// element index lies inside `storage`.
Tensor gather(std::span<const std::byte> storage, size_t itemsize, DType dtype,
              const PickleTensor& t) {
  Tensor out(dtype, t.size);
  std::byte* dst = out.mutable_bytes().data();
  const size_t rank = t.size.size();
  if (rank == 0) {
    std::memcpy(dst, storage.data() + t.storage_offset * itemsize, itemsize);
    return out;
  }
  const auto inner = static_cast<uint64_t>(t.size[rank - 1]);
  const auto inner_stride = static_cast<uint64_t>(t.stride[rank - 1]);
  std::vector<int64_t> index(rank - 1, 0);
  uint64_t base = t.storage_offset;
  for (uint64_t row = 0, rows = out.numel() / inner; row < rows; ++row) {
    for (uint64_t j = 0; j < inner; ++j) {
      std::memcpy(dst, storage.data() + (base + j * inner_stride) * itemsize, itemsize);
      dst += itemsize;
    }
    for (size_t d = rank - 1; d-- > 0;) {  // odometer over the outer dimensions
      base += static_cast<uint64_t>(t.stride[d]);
      if (++index[d] < t.size[d]) break;
      base -= static_cast<uint64_t>(t.stride[d]) * static_cast<uint64_t>(t.size[d]);
      index[d] = 0;
    }
  }
  return out;
}

}  // namespace

Tensor make_torch_tensor(const ZipReader& zip, const std::string& prefix,
                         const PickleTensor& record, const std::string& name) {
  const std::string where = "tensor '" + printable(name) + "' in " + quote(zip.path().string());
  const auto& storage = *record.storage->as<PickleStorage>();
  const TorchDType* torch_dtype = torch_dtype_by_name(record.dtype_name);
  if (torch_dtype == nullptr || !torch_dtype->dtype) {
    fail_unsupported(where + " has dtype torch." + printable(record.dtype_name) +
                     ", which qforge does not support; convert it (for example with "
                     ".float()) before saving");
  }
  const DType dtype = *torch_dtype->dtype;
  const uint64_t itemsize = torch_dtype->itemsize;

  const std::string entry_name = prefix + "/data/" + storage.key;
  if (zip.find(entry_name) == nullptr) {
    fail_invalid(where + " refers to storage " + quote(entry_name) +
                 ", which the archive lacks; the file is incomplete");
  }
  const auto data = zip.entry(entry_name);
  uint64_t storage_bytes = storage.numel;
  if (storage.typed && mul_overflows(storage.numel, itemsize, storage_bytes)) storage_bytes = ~0ull;
  if (storage_bytes > data.size()) {
    fail_invalid(where + ": its storage " + quote(entry_name) + " holds " +
                 std::to_string(data.size()) + " bytes but the pickle declares " +
                 std::to_string(storage_bytes) + "; the file is truncated or corrupt");
  }
  const uint64_t storage_elems = storage_bytes / itemsize;

  const uint64_t numel = shape_numel(record.size);
  if (numel == 0) return {dtype, record.size};
  // Largest element index the view touches, overflow-checked.
  uint64_t last = record.storage_offset;
  bool overflow = false;
  for (size_t i = 0; i < record.size.size(); ++i) {
    uint64_t step = 0;
    overflow |= mul_overflows(static_cast<uint64_t>(record.size[i] - 1),
                              static_cast<uint64_t>(record.stride[i]), step);
    overflow |= add_overflows(last, step, last);
  }
  if (overflow || last >= storage_elems) {
    fail_invalid(where + ": its view (offset " + std::to_string(record.storage_offset) + ", size " +
                 shape_to_string(record.size) + ", stride " + shape_to_string(record.stride) +
                 ") reaches past the " + std::to_string(storage_elems) + "-element storage " +
                 quote(entry_name) + "; the file is corrupt");
  }
  const uint64_t byte_offset = record.storage_offset * itemsize;
  const auto address = reinterpret_cast<uintptr_t>(data.data()) + byte_offset;
  // torch aligns storages to 64 bytes; a hand-made archive may not, and a misaligned window
  // would make typed access undefined, so such a tensor is copied.
  if (is_contiguous(record.size, record.stride) && address % itemsize == 0) {
    return zip.tensor_window(entry_name, byte_offset, dtype, record.size);
  }
  return gather(data, itemsize, dtype, record);
}

}  // namespace qforge::torch_detail
