#pragma once
// Writes a Graph's initializers as safetensors, the way Hugging Face tools do, so that the
// output of `safetensors.torch.save_file(tensors, path, metadata={"format": "pt"})` for the
// same tensors is byte-identical:
// - `__metadata__` = {"format": options.format} plus, with keep_metadata, the graph's
//   `safetensors.<key>` metadata (what import_safetensors read), keys sorted (save_file writes
//   several keys in a random order, a Rust HashMap's, so only one-key metadata can match);
// - tensors ordered as the Rust library orders them: by dtype alignment, largest first
//   (I64, F64, F32, I32, BF16, F16, I16, I8, U8, BOOL), then by name; data contiguous;
// - the JSON header padded with spaces to a multiple of 8 bytes, so every tensor's data is
//   8-byte aligned in the file.
// 4-bit tensors (I4, U4) have no safetensors dtype: they are written as U8 of the packed bytes
// with `qforge.dtype.<tensor>` = "i4"/"u4" and `qforge.shape.<tensor>` = "[d0,d1,...]" in
// `__metadata__`; import_safetensors restores them. Other readers see the U8 bytes.
// Every file goes to a temporary name beside the target and is renamed into place only once
// complete (exporters/atomic_file.h).
#include <cstdint>
#include <filesystem>
#include <string>

#include "ir/graph.h"

namespace qforge {

struct SafetensorsWriteOptions {
  // `__metadata__["format"]`; transformers expects "pt". Empty: no format entry.
  std::string format = "pt";
  // Bytes of tensor data per shard; 0 writes one file. When the tensors need more than one
  // shard, `out` = "DIR/model.safetensors" gives "DIR/model-00001-of-0000N.safetensors", ...
  // filled with tensors in graph order (a tensor larger than the limit gets a shard of its own),
  // and "DIR/model.safetensors.index.json" as transformers' save_pretrained writes it
  // ({"metadata": {"total_size": N}, "weight_map": {...}}, sorted keys, indent 2). When they fit
  // in one shard, `out` itself is written and no index, as save_pretrained does.
  uint64_t max_shard_size = 0;
  // Write the graph's `safetensors.*` metadata back into `__metadata__`.
  bool keep_metadata = true;
};

// Throws Error(InvalidInput) for a tensor that cannot be written (named "__metadata__", no data,
// a name or metadata that is not UTF-8) and Error(IO) when a file cannot be written.
void export_safetensors(const Graph& weights, const std::filesystem::path& out,
                        const SafetensorsWriteOptions& options = {});

}  // namespace qforge
