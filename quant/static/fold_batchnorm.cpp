#include "quant/static/fold_batchnorm.h"

#include <cmath>
#include <unordered_map>
#include <unordered_set>

#include "ir/error.h"
#include "quant/static/cleanup.h"

namespace qforge {

namespace {

bool default_domain(const Node& node) { return node.domain.empty() || node.domain == "ai.onnx"; }

bool is_float(DType d) { return d == DType::F32 || d == DType::F16 || d == DType::BF16; }

// Output channel of each weight element, for W viewed as [outer, channels, inner]: Conv's W is
// [C_out, C_in/g, k...]; ConvTranspose's is [C_in, C_out/g, k...], whose output channel is
// (input channel's group) * C_out/g + j.
struct ChannelMap {
  int64_t dim0 = 0, dim1 = 0, inner = 1, group = 1;
  bool transpose = false;
  [[nodiscard]] int64_t out_channels() const { return transpose ? dim1 * group : dim0; }
  [[nodiscard]] int64_t channel(int64_t element) const {
    const int64_t j = (element / inner) % dim1;
    const int64_t i = element / (inner * dim1);
    return transpose ? (i / (dim0 / group)) * dim1 + j : i;
  }
};

class FoldBatchNormPass final : public Pass {
 public:
  [[nodiscard]] std::string_view name() const override { return "fold-batchnorm"; }

  void run(Graph& graph, PassReport& report) override {
    report.stats["folded"] = 0;
    report.stats["skipped"] = 0;
    const auto producers = graph.producers();
    const auto readers = graph.consumers();
    const std::unordered_set<std::string> subgraph_names = subgraph_value_names(graph);
    std::unordered_set<std::string> graph_io;
    for (const ValueInfo& v : graph.inputs) graph_io.insert(v.name);
    for (const ValueInfo& v : graph.outputs) graph_io.insert(v.name);

    std::vector<bool> removed(graph.nodes.size(), false);
    std::vector<std::string> old_params;
    for (size_t b = 0; b < graph.nodes.size(); ++b) {
      const Node& bn = graph.nodes[b];
      if (bn.op_type != "BatchNormalization" || !default_domain(bn) || bn.inputs.size() < 5) {
        continue;
      }
      const auto p = producers.find(bn.inputs[0]);
      if (p == producers.end()) continue;
      Node& conv = graph.nodes[p->second];
      if ((conv.op_type != "Conv" && conv.op_type != "ConvTranspose") || !default_domain(conv)) {
        continue;
      }
      const std::string why = blocker(graph, conv, bn, readers, subgraph_names, graph_io);
      if (!why.empty()) {
        report.count("skipped");
        report.warn(bn.label() + " not folded into " + conv.label() + ": " + why);
        continue;
      }
      for (size_t k = 1; k < conv.inputs.size(); ++k) old_params.push_back(conv.inputs[k]);
      for (size_t k = 1; k < 5; ++k) old_params.push_back(bn.inputs[k]);
      fold(graph, conv, bn);
      std::erase_if(graph.value_info, [&](const ValueInfo& v) { return v.name == bn.inputs[0]; });
      conv.outputs[0] = bn.outputs[0];
      removed[b] = true;
      report.count("folded");
    }
    std::vector<Node> kept;
    kept.reserve(graph.nodes.size());
    for (size_t i = 0; i < graph.nodes.size(); ++i) {
      if (!removed[i]) kept.push_back(std::move(graph.nodes[i]));
    }
    graph.nodes = std::move(kept);
    report.stats["initializers_dropped"] = drop_unused_initializers(graph, old_params);
    graph.check();
  }

 private:
  // Why this pair cannot be folded, or "" when it can.
  static std::string blocker(const Graph& graph, const Node& conv, const Node& bn,
                             const std::unordered_map<std::string, std::vector<size_t>>& readers,
                             const std::unordered_set<std::string>& subgraph_names,
                             const std::unordered_set<std::string>& graph_io) {
    const std::string& mid = bn.inputs[0];
    if (readers.at(mid).size() != 1 || graph_io.count(mid) || subgraph_names.count(mid)) {
      return "the conv output '" + mid + "' has other readers";
    }
    for (size_t k = 1; k < bn.outputs.size(); ++k) {
      if (!bn.outputs[k].empty()) return "it has training-mode outputs";
    }
    if (bn.attr_int("training_mode", 0) != 0) return "training_mode is 1";
    if (conv.inputs.size() < 2) return "the conv has no weight input";
    std::vector<std::string> params(conv.inputs.begin() + 1, conv.inputs.end());
    params.insert(params.end(), bn.inputs.begin() + 1, bn.inputs.begin() + 5);
    for (const std::string& name : params) {
      if (name.empty()) continue;
      const Tensor* t = graph.find_initializer(name);
      if (t == nullptr) return "'" + name + "' is not a constant initializer";
      if (graph_io.count(name)) return "'" + name + "' is also a graph input";
      if (!is_float(t->dtype())) return "'" + name + "' is not f32, f16 or bf16";
    }
    const Tensor& w = *graph.find_initializer(conv.inputs[1]);
    const int64_t group = conv.attr_int("group", 1);
    if (w.rank() < 3 || group < 1 || (conv.op_type == "ConvTranspose" && w.shape()[0] % group)) {
      return "the conv weight " + shape_to_string(w.shape()) + " does not fit group " +
             std::to_string(group);
    }
    const int64_t channels = conv.op_type == "Conv" ? w.shape()[0] : w.shape()[1] * group;
    for (const std::string& name : params) {
      if (name.empty() || name == conv.inputs[1]) continue;
      if (static_cast<int64_t>(graph.find_initializer(name)->numel()) != channels) {
        return "'" + name + "' has " + std::to_string(graph.find_initializer(name)->numel()) +
               " values for " + std::to_string(channels) + " output channels";
      }
    }
    return "";
  }

  // Writes the folded weight and bias as new initializers and points the conv at them.
  static void fold(Graph& graph, Node& conv, const Node& bn) {
    const Tensor& w = *graph.find_initializer(conv.inputs[1]);
    ChannelMap map;
    map.transpose = conv.op_type == "ConvTranspose";
    map.group = conv.attr_int("group", 1);
    map.dim0 = w.shape()[0];
    map.dim1 = w.shape()[1];
    for (size_t d = 2; d < w.rank(); ++d) map.inner *= w.shape()[d];
    const auto channels = static_cast<size_t>(map.out_channels());
    auto values = [&](const std::string& name) { return graph.find_initializer(name)->to_f32(); };
    const std::vector<float> gamma = values(bn.inputs[1]);
    const std::vector<float> beta = values(bn.inputs[2]);
    const std::vector<float> mean = values(bn.inputs[3]);
    const std::vector<float> var = values(bn.inputs[4]);
    const double eps = bn.attr_float("epsilon", 1e-5f);
    const bool has_bias = conv.inputs.size() > 2 && !conv.inputs[2].empty();
    const std::vector<float> bias =
        has_bias ? values(conv.inputs[2]) : std::vector<float>(channels);

    std::vector<double> k(channels);
    std::vector<float> new_bias(channels);
    for (size_t c = 0; c < channels; ++c) {
      k[c] = gamma[c] / std::sqrt(static_cast<double>(var[c]) + eps);
      new_bias[c] = static_cast<float>((bias[c] - static_cast<double>(mean[c])) * k[c] + beta[c]);
    }
    std::vector<float> new_w = w.to_f32();
    for (size_t e = 0; e < new_w.size(); ++e) {
      new_w[e] = static_cast<float>(new_w[e] *
                                    k[static_cast<size_t>(map.channel(static_cast<int64_t>(e)))]);
    }
    const DType dtype = w.dtype();
    const Shape w_shape = w.shape();
    const std::string w_name = graph.unique_name(conv.inputs[1] + "_folded");
    graph.set_initializer(w_name, Tensor::from_f32(new_w, w_shape, dtype));
    const std::string b_hint = has_bias ? conv.inputs[2] : conv.inputs[1] + "_bias";
    const std::string b_name = graph.unique_name(b_hint + "_folded");
    graph.set_initializer(b_name,
                          Tensor::from_f32(new_bias, {static_cast<int64_t>(channels)}, dtype));
    conv.inputs[1] = w_name;
    conv.inputs.resize(3);
    conv.inputs[2] = b_name;
  }
};

}  // namespace

std::unique_ptr<Pass> make_fold_batchnorm_pass() { return std::make_unique<FoldBatchNormPass>(); }

}  // namespace qforge
