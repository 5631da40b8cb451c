#pragma once
// Tied weights that a checkpoint stores once: with Hugging Face's tie_word_embeddings the output
// projection (lm_head.weight) is the input embedding and save_pretrained leaves it out of the
// file. The importer that knows of a tie records it in the graph's metadata, so that a pass
// changing one name changes the tensor every alias stands for.
#include <string>
#include <vector>

#include "ir/graph.h"

namespace qforge {

struct TiedWeight {
  std::string alias;   // "lm_head.weight"
  std::string source;  // "model.embed_tokens.weight", an initializer of the graph
};

// The ties recorded in `graph` (metadata "tied_weights": "alias=source;alias=source").
std::vector<TiedWeight> tied_weights(const Graph& graph);
void set_tied_weights(Graph& graph, const std::vector<TiedWeight>& ties);

}  // namespace qforge
