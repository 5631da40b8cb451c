#pragma once
// The tensors a conversion read, kept to check that what it writes lost none of them. A tensor
// reaches the output by its own name, by a name a pass derived from it ("<name>_quantized",
// "<name>_int4", "<name>_folded", ...), or through a node that a pass folded away together with
// it (a BatchNormalization's statistics). A weights-only graph (a state dict) has no nodes to
// fold: there every tensor must keep its name and shape, and its dtype unless it became a
// quantized Linear (ir/quantized_linear.h: a weight record naming it and its scale, both there).
#include <string>
#include <unordered_map>
#include <vector>

#include "ir/graph.h"

namespace qforge {

struct WeightInventory {
  bool weights_only = false;
  std::vector<std::pair<std::string, Shape>> tensors;  // initializers, in order
  std::unordered_map<std::string, DType> dtypes;        // of each initializer
  // initializer -> names of the nodes that read it (an unnamed reader is recorded as "")
  std::unordered_map<std::string, std::vector<std::string>> readers;
};

WeightInventory take_weight_inventory(const Graph& graph);

struct WeightAccount {
  std::vector<std::string> lost;     // tensors the output holds in no form
  std::vector<std::string> unread;   // dropped, but no node of the input read them
};

// What became of each inventory tensor in `after`.
WeightAccount account_weights(const WeightInventory& before, const Graph& after);

// The invariant behind every output: throws Error(Internal) naming the tensors `after` lost
// (`what` says which conversion, for the message); returns the unread ones it dropped.
std::vector<std::string> check_nothing_lost(const WeightInventory& before, const Graph& after,
                                            const std::string& what);

}  // namespace qforge
