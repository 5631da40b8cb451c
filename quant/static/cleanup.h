#pragma once
// Inference clean-ups before static quantization: Identity and Dropout (inference) nodes are
// removed and their consumers rewired, so Q/DQ placement sees the ops that really compute.
// Graph output names never change: when a removed node produces a graph output, its
// producer's output takes that name instead.
#include <memory>
#include <span>
#include <string>
#include <unordered_set>

#include "ir/pass.h"

namespace qforge {

std::unique_ptr<Pass> make_cleanup_pass();

// Every value name a subgraph (If/Loop/Scan body) mentions, at any depth: a superset of what
// the subgraphs read from outside, which is what a rewrite must not rename or remove.
std::unordered_set<std::string> subgraph_value_names(const Graph& graph);

// Removes each named initializer that nothing reads any more (no node input, graph output,
// graph input or subgraph name); returns how many went.
int64_t drop_unused_initializers(Graph& graph, std::span<const std::string> candidates);

}  // namespace qforge
