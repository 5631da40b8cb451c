#pragma once
// Reads safetensors checkpoints into a weights-only Graph: initializers, no nodes.
//
// - Tensors are windows into a memory map of the file: nothing is copied.
// - Initializers are in data order: sorted by data_offsets (then name), which is what the file
//   holds on disk whatever order its JSON header lists them in.
// - Graph metadata: source_format = "safetensors", source_path = the file, and every
//   `__metadata__` entry as `safetensors.<key>` with its value unchanged, so
//   export_safetensors writes it back.
// - 4-bit tensors, which safetensors cannot name, are stored by export_safetensors as U8 of the
//   packed bytes with `__metadata__` entries `qforge.dtype.<tensor>` ("i4" or "u4") and
//   `qforge.shape.<tensor>` (the logical shape as a JSON array, "[3,5]"); the reader turns
//   them back into I4/U4 tensors and does not copy those two entries into the metadata.
// - Data lies where the file puts it: files from writers that do not pad the header to 8 bytes
//   give unaligned tensors (bytes() is always safe; data<T>() assumes alignment).
// Every malformed file is rejected with Error(InvalidInput) (Unsupported for dtypes qforge
// does not read: U16, U32, U64, F8_*, F4, complex, ...) and a one-line message naming the
// file, the tensor and the byte offset.
#include <filesystem>
#include <memory>
#include <span>
#include <string_view>

#include "ir/graph.h"

namespace qforge {

// One `.safetensors` file, memory-mapped.
Graph import_safetensors(const std::filesystem::path& path);

// The same from bytes already in memory (copied into an owned buffer); `name` is used in
// messages and as source_path.
Graph import_safetensors_bytes(std::span<const std::byte> bytes, std::string_view name);

// A whole safetensors file held in `storage` (tensors become windows of it).
Graph import_safetensors_storage(const std::shared_ptr<const Storage>& storage,
                                 std::string_view name);

// A sharded checkpoint through its `*.safetensors.index.json`: every shard named in
// `weight_map` must be a file inside the index's folder (no absolute paths, no `..`, no links
// leading out), every listed tensor must be in its shard and no tensor may appear twice.
// `metadata.total_size`, when present, is compared with the tensors' bytes (a warning if
// they differ). Initializers come shard by shard (shard file names sorted), each in data
// order; each shard's `__metadata__` keys are kept as `safetensors.<key>`, the first shard
// holding a key giving its value. source_path is the index.
Graph import_safetensors_index(const std::filesystem::path& index_path);

// import_safetensors_index for a path ending in ".safetensors.index.json", else
// import_safetensors.
Graph import_safetensors_any(const std::filesystem::path& path);

}  // namespace qforge
