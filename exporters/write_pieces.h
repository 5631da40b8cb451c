#pragma once
// Large writes go to the kernel in pieces of at most kWritePiece bytes. One write() of tens of
// megabytes into the page cache ran 2x slower in about two runs of three on the development
// machine (Linux 6.18, ext4: the time is in the kernel's copy into the page cache), where the
// same bytes in 1 MiB writes never did (bench/RESULTS.md, "Writes in 1 MiB pieces").
#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <ostream>

namespace qforge {

inline constexpr size_t kWritePiece = size_t{1} << 20;

// std::fwrite of `size` bytes in pieces; true when every byte was written.
inline bool fwrite_pieces(std::FILE* file, const void* data, size_t size) {
  const auto* p = static_cast<const char*>(data);
  for (size_t at = 0; at < size; at += kWritePiece) {
    const size_t n = std::min(kWritePiece, size - at);
    if (std::fwrite(p + at, 1, n, file) != n) return false;
  }
  return true;
}

// out.write of `size` bytes in pieces; stops at the first failure (out's state tells).
inline void ostream_write_pieces(std::ostream& out, const void* data, size_t size) {
  const auto* p = static_cast<const char*>(data);
  for (size_t at = 0; at < size && out; at += kWritePiece) {
    out.write(p + at, static_cast<std::streamsize>(std::min(kWritePiece, size - at)));
  }
}

}  // namespace qforge
