#pragma once
// Whole-array readers for NumPy's .npy arrays and .npz archives (np.savez), for tools and tests
// that want every array in memory (data sets stream instead: importers/dataset/dataset.h). The
// .npy header is parsed by importers/dataset/npy_header.h, the one .npy parser of qforge. Hardened like the other readers: header parsed strictly and capped, every
// size and offset checked against the file before use, CRC-32 of each archive entry verified.
//
// Accepted: .npy format 1.0/2.0/3.0, C order, little-endian dtypes <f4 <f8 <f2 <i8 <i4 <i2
// |i1 |u1 |b1 (and '=' or '<' for the one-byte ones). .npz: zip archives of NAME.npy entries
// stored uncompressed (np.savez), ZIP64 included. Compressed archives (np.savez_compressed),
// Fortran order, big-endian and object arrays are Error(Unsupported) saying what to do.
#include <cstddef>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ir/tensor.h"

namespace qforge {

// One .npy file. Throws Error(IO) when unreadable, InvalidInput when malformed.
Tensor read_npy(const std::filesystem::path& path);
// The same from bytes; `source` names them in messages. The data is copied.
Tensor parse_npy(std::span<const std::byte> bytes, std::string_view source);

// Every array of an .npz archive, in archive order, named as np.savez named them ("x" for
// entry "x.npy").
std::vector<std::pair<std::string, Tensor>> read_npz(const std::filesystem::path& path);
std::vector<std::pair<std::string, Tensor>> parse_npz(std::span<const std::byte> bytes,
                                                      std::string_view source);

}  // namespace qforge
