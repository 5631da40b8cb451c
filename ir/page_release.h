#pragma once
// Memory-mapped tensors count toward a process's resident memory once read: a pass or writer
// that streams through a large checkpoint tells the kernel when it is done with a tensor, so
// that resident memory stays bounded by what is in use rather than by the checkpoint's size.
#include <cstddef>
#include <span>

#include "ir/tensor.h"

namespace qforge {

// Drops the resident pages of `tensor` when it is a window of a memory-mapped file (a no-op
// otherwise). A hint with no effect on values: the file is mapped read-only, and a later read
// faults the pages back in from the file. Pages shared with a neighbouring tensor are dropped too.
void release_tensor_pages(const Tensor& tensor);

// The same for `bytes`, a window of a read-only memory-mapped file (MappedFile): the pages it
// touches are dropped, a neighbour's share of its first and last page too, and a later read
// faults them back in from the file. Never for other memory: there it would zero the pages.
void release_mapped_pages(std::span<const std::byte> bytes);

}  // namespace qforge
