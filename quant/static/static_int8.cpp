// Static INT8: plan (static_int8_plan.cpp), then rewrite. New nodes are appended as they are
// made and each chain (Q -> DQ of an activation, DQ of a weight or bias) is moved just before
// the first node that reads it, which keeps the order topological.
#include "quant/static/static_int8.h"

#include <spdlog/spdlog.h>

#include <cmath>
#include <map>
#include <optional>
#include <tuple>

#include "ir/error.h"
#include "ir/json_number.h"
#include "kernels/quantize.h"
#include "quant/static/cleanup.h"
#include "quant/opset.h"
#include "quant/static/static_int8_plan.h"
#include "quant/static/static_int8_tensors.h"

namespace qforge {

namespace {

constexpr int64_t kOpsetPerAxis = 13;  // DequantizeLinear's axis attribute

using Json = nlohmann::ordered_json;

struct WeightDq {
  std::string dequantized;
  std::vector<float> scales;
};

class StaticInt8Pass final : public Pass {
 public:
  explicit StaticInt8Pass(StaticInt8Options options) : options_(std::move(options)) {}

  [[nodiscard]] std::string_view name() const override { return "static-int8"; }

  void run(Graph& graph, PassReport& report) override {
    device_ = resolve_device(options_.device);
    report.stats["device"] = std::string(device_name(device_));
    report.stats["bias"] = options_.int32_bias ? "int32" : "float";
    if (!options_.exclude_pattern.empty()) report.stats["exclude"] = options_.exclude_pattern;
    for (const char* key : {"nodes_quantized", "activations", "weights", "excluded", "skipped"}) {
      report.stats[key] = 0;
    }
    if (options_.int32_bias) report.stats["biases_int32"] = 0;
    report.stats["tensors"] = Json::array();
    report.stats["activation_ranges"] = Json::array();

    const std::vector<NodePlan> plans = plan_static_int8(graph, options_, report);
    names_.emplace(graph);
    const size_t original_nodes = graph.nodes.size();
    std::vector<std::string> replaced;  // float weights and biases that may now be unused
    for (const NodePlan& plan : plans) {
      const size_t first_new = graph.nodes.size();
      rewrite_node(graph, plan, report, replaced);
      if (graph.nodes.size() > first_new) chains_.emplace_back(plan.node, first_new);
    }
    names_.reset();
    report.stats["initializers_dropped"] = drop_unused_initializers(graph, replaced);
    move_chains_before_consumers(graph, original_nodes);
    if (!plans.empty()) {
      if (auto warning = raise_default_opset(graph, kOpsetPerAxis, "DequantizeLinear's axis")) {
        report.stats["opset"] = kOpsetPerAxis;
        report.warn(std::move(*warning));
      }
    }
    graph.check();
  }

 private:
  void rewrite_node(Graph& graph, const NodePlan& plan, PassReport& report,
                    std::vector<std::string>& replaced) {
    float input_scale = 0.0f;
    for (const PlannedActivation& a : plan.activations) {
      auto it = activations_.find(a.name);
      if (it == activations_.end()) {
        const float scale = int8_symmetric_scale(a.amax);
        it = activations_.emplace(a.name, add_quantize_dequantize(graph, *names_, a.name, scale))
                 .first;
        scales_[a.name] = scale;
        report.stats["activation_ranges"].push_back(
            {{"name", a.name},
             {"amax", a.amax},
             {"scale", scale},
             {"override", options_.overrides.count(a.name) != 0}});
        report.count("activations");
      }
      graph.nodes[plan.node].inputs[a.slot] = it->second;
      if (a.slot == 0) input_scale = scales_[a.name];
    }
    if (!plan.weight_slot) return;
    std::string& weight_input = graph.nodes[plan.node].inputs[*plan.weight_slot];
    const std::string weight = weight_input;
    const auto key = std::make_tuple(weight, plan.axis, plan.weight_amax);
    auto w = weights_.find(key);
    if (w == weights_.end()) w = weights_.emplace(key, quantize(graph, plan, report)).first;
    weight_input = w->second.dequantized;
    replaced.push_back(weight);
    if (!plan.bias_slot) return;
    std::string& bias_input = graph.nodes[plan.node].inputs[*plan.bias_slot];
    const std::string bias = bias_input;
    const std::vector<float> values = graph.find_initializer(bias)->to_f32();
    double max_ratio = 0.0;
    auto q = quantize_bias_int32(values, input_scale, w->second.scales, max_ratio);
    if (!q) {
      report.count("biases_float_overflow");
      report.warn("bias '" + bias + "' of " + graph.nodes[plan.node].label() +
                  " kept float: |bias / (s_input * s_weight)| reaches " +
                  std::to_string(max_ratio) + ", beyond int32");
      return;
    }
    const std::string q_name = names_->take(bias + "_quantized");
    graph.set_initializer(q_name, std::move(q->values));
    bias_input = add_dequantize(graph, *names_, bias, q_name, q->scales, DType::I32, int64_t{0});
    replaced.push_back(bias);
    report.count("biases_int32");
  }

  WeightDq quantize(Graph& graph, const NodePlan& plan, PassReport& report) {
    const std::string weight = graph.nodes[plan.node].inputs[*plan.weight_slot];
    const Tensor t = *graph.find_initializer(weight);  // a handle: shares storage
    QuantizedWeight q =
        quantize_weight(t, weight, plan.axis, plan.weight_amax, device_, workspace_);
    const std::string q_name = names_->take(weight + "_quantized");
    const size_t q_bytes = q.values.nbytes();
    graph.set_initializer(q_name, std::move(q.values));
    WeightDq out;
    out.dequantized = add_dequantize(graph, *names_, weight, q_name, q.scales, DType::I8, q.axis);
    out.scales = q.scales;
    const auto bytes_after = static_cast<int64_t>(q_bytes + q.scales.size() * 5);
    Json row;
    row["name"] = weight;
    row["shape"] = t.shape();
    row["dtype"] = std::string(dtype_name(t.dtype()));
    row["axis"] = q.axis ? Json(*q.axis) : Json("per-tensor");
    row["quantized"] = q_name;
    row["bytes_before"] = static_cast<int64_t>(t.nbytes());
    row["bytes_after"] = bytes_after;  // int8 values + f32 scales + int8 zero points
    row["max_abs_error"] = q.error.max_abs;
    row["sqnr_db"] = json_number<Json>(q.error.sqnr_db);  // "inf" when exact
    report.stats["tensors"].push_back(std::move(row));
    report.count("weights");
    spdlog::debug("static-int8: {} {} -> i8 {}", weight, shape_to_string(t.shape()),
                  q.axis ? "axis " + std::to_string(*q.axis) : std::string("per-tensor"));
    return out;
  }

  void move_chains_before_consumers(Graph& graph, size_t original_nodes) const {
    std::vector<Node> old = std::move(graph.nodes);
    std::vector<std::vector<size_t>> before(original_nodes);
    for (size_t c = 0; c < chains_.size(); ++c) {
      const size_t end = c + 1 < chains_.size() ? chains_[c + 1].second : old.size();
      for (size_t k = chains_[c].second; k < end; ++k) before[chains_[c].first].push_back(k);
    }
    graph.nodes.clear();
    graph.nodes.reserve(old.size());
    for (size_t i = 0; i < original_nodes; ++i) {
      for (size_t k : before[i]) graph.nodes.push_back(std::move(old[k]));
      graph.nodes.push_back(std::move(old[i]));
    }
  }

  StaticInt8Options options_;
  Device device_ = Device::Cpu;
  KernelWorkspace workspace_;  // device buffers kept from one weight to the next
  std::map<std::string, std::string> activations_;  // activation -> its dequantized value
  std::map<std::string, float> scales_;
  std::map<std::tuple<std::string, std::optional<int64_t>, std::optional<float>>, WeightDq>
      weights_;
  std::vector<std::pair<size_t, size_t>> chains_;  // (reading node, index of first new node)
  std::optional<UniqueNames> names_;  // the graph's, while the pass adds to it
};

}  // namespace

std::unique_ptr<Pass> make_static_int8_pass(StaticInt8Options options) {
  return std::make_unique<StaticInt8Pass>(std::move(options));
}

}  // namespace qforge
