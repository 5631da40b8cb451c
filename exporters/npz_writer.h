#pragma once
// Writes named tensors as a NumPy .npz archive, the way np.savez does: a zip archive with one
// uncompressed (stored) entry NAME.npy per tensor, each a .npy format 1.0 file (C order,
// little-endian; header padded to a multiple of 64 bytes). Output is deterministic (fixed
// timestamps, entries in the order given) and written atomically (AtomicFile): a failed write
// leaves nothing behind. np.load and importers/dataset/npy.h's read_npz read it.
#include <filesystem>
#include <span>
#include <string>
#include <utility>

#include "ir/tensor.h"

namespace qforge {

using NamedTensor = std::pair<std::string, Tensor>;

// Dtypes: f32 f16 f64 i64 i32 i16 i8 u8 bool. Throws Error(Unsupported) for another dtype
// (bf16, i4, u4) or an entry over 4 GiB (no ZIP64), Error(InvalidInput) for an empty or
// duplicate name, a name holding '/' or a NUL, or a tensor without data, Error(IO) when the
// file cannot be written.
void write_npz(std::span<const NamedTensor> tensors, const std::filesystem::path& path);

// The .npy (format 1.0) bytes of one tensor; same dtype rules.
std::string npy_bytes(const Tensor& tensor, std::string_view name = "tensor");

}  // namespace qforge
