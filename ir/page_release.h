#pragma once
// Memory-mapped tensors count toward a process's resident memory once read: a pass or writer
// that streams through a large checkpoint tells the kernel when it is done with a tensor, so
// that resident memory stays bounded by what is in use rather than by the checkpoint's size.
#include "ir/tensor.h"

namespace qforge {

// Drops the resident pages of `tensor` when it is a window of a memory-mapped file (a no-op
// otherwise). A hint with no effect on values: the file is mapped read-only, and a later read
// faults the pages back in from the file. Pages shared with a neighbouring tensor are dropped too.
void release_tensor_pages(const Tensor& tensor);

}  // namespace qforge
