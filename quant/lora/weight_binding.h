#pragma once
// Finds the initializer of a graph that holds a given PyTorch parameter ("encoder.layer.0.
// attention.self.query.weight"). In order:
//  1. exact name;
//  2. suffix-insensitive name: one name is the other behind extra leading components ("bert.",
//     "model."), never dropping a numeric component (a layer index), unique or nothing;
//  3. node scope (ONNX): the old torch exporter names a Linear's MatMul node
//     "/encoder/layer.0/attention/self/query/MatMul" and feeds it an anonymous, transposed
//     copy of the weight ("onnx::MatMul_123"); Gemm's transB says whether it is transposed;
//  4. content, when a reference state dict is given: the initializer equals the PyTorch tensor,
//     or its transpose, value for value (exact), and no other initializer does.
// A name the checkpoint stores only as a tie (ir/tied_weights.h: lm_head.weight of a model with
// tied embeddings) binds, when no initializer has it, to the tensor it is tied to.
// Kohya adapters name modules with '_' for '.'; bind_flat matches those against the graph's
// "<module>.weight" initializers the same way.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "ir/graph.h"
#include "ir/pass.h"

namespace qforge {

enum class BindKind { Exact, Suffix, NodeScope, Content, TransposedContent, FlatName, Tied };
std::string_view bind_kind_name(BindKind kind);  // "name", "suffix", "node-scope", "content", ...

struct WeightBinding {
  std::string initializer;
  bool transposed = false;  // the initializer holds the 2-D PyTorch tensor transposed
  BindKind kind = BindKind::Exact;
};

struct BindOptions {
  // The PyTorch tensors the graph was exported from, keyed by PyTorch name, for content
  // matching. Not owned; must outlive the binder.
  const Graph* reference = nullptr;
  bool allow_unmatched = false;  // unmatched tensors become warnings instead of an error
};

// The outcome of one lookup: a binding, or why there is none.
struct BindResult {
  std::optional<WeightBinding> binding;
  std::string why_not;  // "no initializer named ...", "ambiguous: a, b"
};

class WeightBinder {
 public:
  // Indexes `target` once; `target` must outlive the binder and keep its initializers.
  WeightBinder(const Graph& target, BindOptions options);
  ~WeightBinder();
  WeightBinder(const WeightBinder&) = delete;
  WeightBinder& operator=(const WeightBinder&) = delete;

  // `torch_shape`, when known, must fit the initializer (transposed for transposed matches).
  BindResult bind(const std::string& torch_name,
                  std::optional<std::span<const int64_t>> torch_shape = std::nullopt) const;
  // A Kohya flat module name ("lora_unet_down_blocks_0_proj_in") to "<module>.weight".
  BindResult bind_flat(const std::string& flat_module) const;

 private:
  class Index;
  BindResult by_content(const std::string& torch_name,
                        std::optional<std::span<const int64_t>> torch_shape) const;
  const Graph& target_;
  BindOptions options_;
  std::unique_ptr<Index> names_;
  std::unique_ptr<Index> scopes_;
  std::unique_ptr<Index> flat_;
  std::unique_ptr<Index> reference_names_;
  std::vector<WeightBinding> scope_bindings_;
  std::unordered_map<std::string, std::string> tied_;  // alias -> initializer
  mutable std::unordered_multimap<uint64_t, size_t> content_;  // hash -> initializer position
  mutable bool content_indexed_ = false;
};

// Replaces the initializers of `onnx_graph` with the tensors of `state_dict` they bind to,
// transposing for transposed matches and keeping each initializer's dtype (rounded once).
// Content matching uses options.reference, or the state dict itself when none is given. Every
// state dict tensor must bind (else Error(InvalidInput) listing them, or warnings with
// allow_unmatched). Reports a row per tensor: name, initializer, match kind.
void bind_weights(Graph& onnx_graph, const Graph& state_dict, const BindOptions& options,
                  PassReport& report);

// Formats up to `limit` names as "a, b, c (and 7 more)".
std::string list_names(const std::vector<std::string>& names, size_t limit = 8);

}  // namespace qforge
