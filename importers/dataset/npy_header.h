#pragma once
// The header of a NumPy .npy array, parsed strictly from the first bytes of a file or archive
// entry, so that data sets can be read as windows of a mapped file or as an inflated stream
// without loading the array. Accepted: format 1.0 to 3.0, C order, little-endian
// <f4 <f8 <f2 <i8 <i4 <i2 and one-byte |i1 |u1 |b1.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "ir/tensor.h"

namespace qforge {

struct NpyHeader {
  std::string descr;  // as written, e.g. "<f4"
  DType dtype = DType::F32;
  Shape shape;
  uint64_t data_offset = 0;  // bytes of magic, version and header before the data
  uint64_t data_bytes = 0;   // what the shape and dtype need
};

// Bytes to read first: enough to learn the header's length.
inline constexpr size_t kNpyPreamble = 12;
// The header's total size (data_offset) from its first min(kNpyPreamble, size) bytes.
// `source` names the array in messages ("'calib.npz' entry 'input.npy'").
uint64_t npy_header_size(std::span<const std::byte> preamble, std::string_view source);
// Parses a whole header (npy_header_size bytes, or more). Throws Error(InvalidInput) for a
// malformed one and Error(Unsupported), saying how to re-save, for Fortran order, big-endian,
// object or unknown dtypes.
NpyHeader parse_npy_header(std::span<const std::byte> bytes, std::string_view source);

}  // namespace qforge
