#pragma once
// Reads the `config.json` a Hugging Face checkpoint keeps beside its safetensors files for one
// fact the tensors do not carry: tie_word_embeddings. A tied model's output projection
// (lm_head.weight) is its input embedding, so save_pretrained stores the embedding once; the
// tie is recorded in the graph (ir/tied_weights.h) for passes that change either name.
#include <filesystem>

#include "ir/graph.h"

namespace qforge {

// `checkpoint` is the safetensors file or index that `graph` was read from. Records
// "lm_head.weight" as an alias of the graph's one input embedding when config.json beside it
// has tie_word_embeddings true (or leaves it out, whose transformers default is true, and the
// checkpoint has no lm_head.weight). A config.json that is not a JSON object is skipped with a
// warning: it may belong to something else.
void record_tied_embeddings(const std::filesystem::path& checkpoint, Graph& graph);

}  // namespace qforge
