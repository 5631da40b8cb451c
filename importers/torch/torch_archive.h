#pragma once
// Internals shared by the torch reader's files: reading one torch.save archive into named
// tensors, and turning one pickled tensor record into an IR Tensor.
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "importers/torch/pickle_value.h"
#include "importers/torch/zip_reader.h"
#include "ir/tensor.h"

namespace qforge::torch_detail {

// Every tensor of the archive, flattened to dotted names, in the pickle's order.
std::vector<std::pair<std::string, Tensor>> read_torch_archive(const std::filesystem::path& path);

// The tensor `record` describes, whose storage is the entry `<prefix>/data/<key>` of `zip`.
// Contiguous, aligned views are zero-copy windows of the mapped file; other views are copied
// into a new contiguous buffer. `name` is the tensor's name, for messages.
Tensor make_torch_tensor(const ZipReader& zip, const std::string& prefix,
                         const PickleTensor& record, const std::string& name);

}  // namespace qforge::torch_detail
