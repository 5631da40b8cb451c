#include "ir/page_release.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>

namespace qforge {

void release_tensor_pages(const Tensor& tensor) {
  if (!tensor.is_mapped() || tensor.nbytes() == 0) return;
  release_mapped_pages(tensor.bytes());
}

void release_mapped_pages(std::span<const std::byte> bytes) {
  if (bytes.empty()) return;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto first = reinterpret_cast<uintptr_t>(bytes.data()) / page * page;
  const auto last = reinterpret_cast<uintptr_t>(bytes.data()) + bytes.size();
  const auto end = (last + page - 1) / page * page;
  // Within the file's own mapping: the map covers whole pages from its start.
  ::madvise(reinterpret_cast<void*>(first), end - first, MADV_DONTNEED);
}

}  // namespace qforge
