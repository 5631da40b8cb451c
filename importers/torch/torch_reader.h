#pragma once
// Reads PyTorch checkpoints written by torch.save (zip format, PyTorch >= 1.6) into a
// weights-only Graph: one initializer per tensor, named by its dotted path in the saved dict
// ("model.encoder.weight"), no nodes. Contiguous tensors are zero-copy windows of the mapped
// file; tensors sharing a storage keep sharing it. data.pkl is read by a restricted unpickler
// that never executes anything.
#include <filesystem>

#include "ir/graph.h"

namespace qforge {

// A torch.save file (any name; the archive prefix is found from its entries). Throws Error:
// IO (cannot open), InvalidInput (not a torch zip, a legacy pre-1.6 file, corrupt data, a
// global outside the allow-list), Unsupported (a dtype the IR lacks, compressed entries,
// TorchScript archives, big-endian files).
Graph import_torch(const std::filesystem::path& path);

// A sharded checkpoint: `index_path` is a pytorch_model.bin.index.json whose weight_map names
// a shard (inside the index's folder) for every tensor. Every listed tensor must be in its
// shard. Throws as import_torch, and InvalidInput for a bad index or a shard path that leaves
// the folder.
Graph import_torch_index(const std::filesystem::path& index_path);

}  // namespace qforge
