// Weight-only INT8: each eligible weight W becomes W_quantized (i8), W_scale (f32) and
// W_zero_point (i8 zeros) feeding a DequantizeLinear whose output replaces W at its consumers.
//
// f16 / bf16 weights: DequantizeLinear outputs float32 up to opset 18 whatever the model's float
// type, so a Cast back to the weight's dtype follows it; the scale stays f32 (a finer step than
// f16 could hold) and the consumer sees the dtype it had before.
#include "quant/weights/weight_int8.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <string_view>
#include <unordered_set>

#include "ir/error.h"
#include "ir/json_number.h"
#include "kernels/quantize.h"
#include "quant/weights/channel_view.h"
#include "quant/weights/f32_values.h"
#include "quant/weights/float_weights.h"
#include "quant/weights/weight_group.h"
#include "quant/weights/weight_slots.h"
#include "quant/opset.h"
#include "quant/calib/quant_error.h"

namespace qforge {

namespace {

// DequantizeLinear exists from opset 10; its axis attribute and Cast to bf16 need 13.
constexpr int64_t kOpsetDequantize = 10;
constexpr int64_t kOpsetAxisOrBf16 = 13;

class WeightInt8Pass final : public Pass {
 public:
  explicit WeightInt8Pass(WeightInt8Options options) : options_(std::move(options)) {
    const std::span<const WeightSlot> slots = weight_slots();
    for (const std::string& op : options_.op_types) {
      if (std::none_of(slots.begin(), slots.end(), [&](const WeightSlot& s) {
            return s.op_type == op && s.channel_axis != nullptr;  // an output channel: INT8
          })) {
        fail_usage("weight-int8: op type '" + op +
                   "' has no weight rule; use Conv, ConvTranspose, Gemm or MatMul");
      }
    }
  }

  [[nodiscard]] std::string_view name() const override { return "weight-int8"; }

  void run(Graph& graph, PassReport& report) override {
    device_ = resolve_device(options_.device);
    report.stats["mode"] = options_.per_tensor ? "per-tensor" : "per-channel";
    report.stats["device"] = std::string(device_name(device_));
    if (!options_.exclude_pattern.empty()) report.stats["exclude"] = options_.exclude_pattern;
    for (const char* key : {"quantized", "skipped", "excluded", "not_constant"})
      report.stats[key] = 0;
    report.stats["bytes_before"] = 0;
    report.stats["bytes_after"] = 0;
    report.stats["tensors"] = nlohmann::ordered_json::array();

    const std::vector<WeightGroup> groups = plan(graph, report);
    const size_t original_nodes = graph.nodes.size();
    std::vector<std::pair<size_t, size_t>> chains;  // (first consumer, index of first new node)
    int64_t needed_opset = groups.empty() ? 0 : kOpsetDequantize;
    KernelWorkspace workspace;  // device buffers kept from one weight to the next
    names_.emplace(graph);
    for (size_t i = 0; i < groups.size(); ++i) {
      chains.emplace_back(groups[i].uses.front().first, graph.nodes.size());
      quantize_group(graph, groups[i], i, groups.size(), workspace, report);
    }
    names_.reset();
    for (const WeightGroup& g : groups) {
      if (g.axis) needed_opset = kOpsetAxisOrBf16;
    }
    const bool any_bf16 =
        std::any_of(report.stats["tensors"].begin(), report.stats["tensors"].end(),
                    [](const auto& row) { return row["dtype"] == "bf16"; });
    if (any_bf16) needed_opset = kOpsetAxisOrBf16;
    std::vector<std::string> weights;
    for (const WeightGroup& g : groups) weights.push_back(g.weight);
    drop_unused_float_weights(graph, weights, "int8", report);
    move_chains_before_consumers(graph, original_nodes, chains);
    const std::string why = needed_opset < kOpsetAxisOrBf16 ? "DequantizeLinear"
                            : any_bf16 ? "DequantizeLinear's axis or Cast to bf16"
                                       : "DequantizeLinear's axis";
    if (auto warning = raise_default_opset(graph, needed_opset, why)) {
      report.stats["opset"] = needed_opset;
      report.warn(std::move(*warning));
    }
    graph.check();
  }

 private:
  // Which weights to quantize along which axis, and who reads them; warns about the rest.
  std::vector<WeightGroup> plan(const Graph& graph, PassReport& report) const {
    std::unordered_set<std::string> graph_inputs;
    for (const ValueInfo& v : graph.inputs) graph_inputs.insert(v.name);
    WeightGroups groups;
    SkippedWeights skipped(report);
    for (size_t i = 0; i < graph.nodes.size(); ++i) {
      const Node& node = graph.nodes[i];
      const WeightSlot* rule = find_weight_slot(node);
      if (rule == nullptr || rule->channel_axis == nullptr) continue;
      if (!options_.op_types.empty() &&
          std::find(options_.op_types.begin(), options_.op_types.end(), node.op_type) ==
              options_.op_types.end()) {
        continue;
      }
      if (options_.exclude && std::regex_search(node.name, *options_.exclude)) {
        report.count("excluded");
        continue;
      }
      const size_t slot = rule->weight_input;
      if (node.inputs.size() <= slot || node.inputs[slot].empty()) continue;
      const std::string& weight = node.inputs[slot];
      const Tensor* t = graph.find_initializer(weight);
      if (t == nullptr) {  // an activation (e.g. attention's MatMul): nothing constant to quantize
        report.count("not_constant");
        continue;
      }
      const auto rank = static_cast<int64_t>(t->rank());
      if (graph_inputs.count(weight)) {
        skipped.skip(weight, node, "is also a graph input (it can be replaced at run time)");
      } else if (t->dtype() != DType::F32 && t->dtype() != DType::F16 &&
                 t->dtype() != DType::BF16) {
        skipped.skip(weight, node,
                     "is " + std::string(dtype_name(t->dtype())) + ", not f32, f16 or bf16");
      } else if (rank < 2) {
        skipped.skip(weight, node,
                     "has " + std::to_string(rank) +
                         " dim(s); only weights of 2 or more dims are quantized");
      } else if (node.op_type == "Gemm" && rank != 2) {
        skipped.skip(weight, node, "has " + std::to_string(rank) + " dims where Gemm's B has 2");
      } else if (t->numel() == 0) {
        skipped.skip(weight, node, "is empty");
      } else {
        std::optional<int64_t> axis;
        if (!options_.per_tensor) axis = rule->channel_axis(node, rank);
        groups.add_use(weight, axis, i, slot);
      }
    }
    return groups.take();
  }

  // Quantizes one group, adds its initializers and nodes, rewires its consumers.
  void quantize_group(Graph& graph, const WeightGroup& group, size_t number, size_t total,
                      KernelWorkspace& workspace, PassReport& report) {
    const Tensor weight = *graph.find_initializer(group.weight);  // a handle: shares storage
    const F32Values f32(weight);
    const std::span<const float> values = f32.span();
    const ChannelView v = channel_view(weight.shape(), group.axis);
    std::vector<float> amaxes(static_cast<size_t>(v.channels));
    amax_per_channel(values, v.outer, v.channels, v.inner, amaxes, device_, &workspace);
    for (size_t c = 0; c < amaxes.size(); ++c) {
      if (!std::isfinite(amaxes[c])) {
        fail_invalid("weight-int8: weight '" + group.weight + "' (" +
                     graph.nodes[group.uses.front().first].label() + ") holds NaN or Inf" +
                     (group.axis ? " in channel " + std::to_string(c) + " of axis " +
                                       std::to_string(*group.axis)
                                 : std::string()) +
                     ": fix the model, or leave the node float with --exclude");
      }
    }
    std::vector<float> scales(amaxes.size());
    std::transform(amaxes.begin(), amaxes.end(), scales.begin(), int8_symmetric_scale);

    Tensor quantized(DType::I8, weight.shape());
    quantize_int8(values, v.outer, v.channels, v.inner, scales, quantized.mutable_data<int8_t>(),
                  device_, &workspace);
    std::vector<float> dequantized(values.size());
    dequantize_int8(quantized.data<int8_t>(), v.outer, v.channels, v.inner, scales, dequantized,
                    device_, &workspace);
    const QuantError error = measure_quant_error(values, dequantized);

    const Shape scale_shape = group.axis ? Shape{v.channels} : Shape{};
    const std::string q_name = names_->take(group.weight + "_quantized");
    graph.set_initializer(q_name, quantized);
    const std::string scale_name = names_->take(group.weight + "_scale");
    graph.set_initializer(scale_name, Tensor::from_f32(scales, scale_shape));
    const std::string zp_name = names_->take(group.weight + "_zero_point");
    graph.set_initializer(zp_name, Tensor(DType::I8, scale_shape));  // zero-filled: symmetric
    const auto bytes_after =
        static_cast<int64_t>(quantized.nbytes() + graph.find_initializer(scale_name)->nbytes() +
                             graph.find_initializer(zp_name)->nbytes());

    Node dq;
    dq.op_type = "DequantizeLinear";
    dq.name = names_->take(group.weight + "_DequantizeLinear");
    dq.inputs = {q_name, scale_name, zp_name};
    dq.outputs = {names_->take(group.weight + "_dequantized")};
    if (group.axis) dq.set_attr(Attribute::make_int("axis", *group.axis));
    std::string result = dq.outputs[0];
    graph.add_quant_record({.kind = QuantKind::Weight,
                            .name = q_name,
                            .source = group.weight,
                            .dtype = DType::I8,
                            .bits = 8,
                            .axis = group.axis,
                            .scale = scale_name,
                            .zero_point = zp_name,
                            .reader = result});
    graph.nodes.push_back(std::move(dq));  // reordered at the end
    if (weight.dtype() != DType::F32) {
      Node cast;
      cast.op_type = "Cast";
      cast.name = names_->take(group.weight + "_Cast");
      cast.inputs = {result};
      cast.outputs = {names_->take(group.weight + "_dequantized_" +
                                        std::string(dtype_name(weight.dtype())))};
      cast.set_attr(Attribute::make_int("to", dtype_to_onnx(weight.dtype())));
      result = cast.outputs[0];
      graph.nodes.push_back(std::move(cast));
    }
    for (const auto& [node, input] : group.uses) graph.nodes[node].inputs[input] = result;

    nlohmann::ordered_json row;
    row["name"] = group.weight;
    row["shape"] = weight.shape();
    row["dtype"] = std::string(dtype_name(weight.dtype()));
    row["axis"] =
        group.axis ? nlohmann::ordered_json(*group.axis) : nlohmann::ordered_json("per-tensor");
    row["quantized"] = q_name;
    row["bytes_before"] = static_cast<int64_t>(weight.nbytes());
    row["bytes_after"] = bytes_after;  // int8 values + f32 scales + int8 zero points
    row["max_abs_error"] = error.max_abs;
    row["sqnr_db"] = json_number<nlohmann::ordered_json>(error.sqnr_db);  // "inf" when exact
    report.stats["tensors"].push_back(std::move(row));
    report.count("quantized");
    spdlog::info("[{}/{}] {} {} {} -> i8 {}  {:.2f} MiB -> {:.2f} MiB  SQNR {}", number + 1, total,
                 group.weight, shape_to_string(weight.shape()), dtype_name(weight.dtype()),
                 group.axis ? "axis " + std::to_string(*group.axis) : std::string("per-tensor"),
                 static_cast<double>(weight.nbytes()) / (1 << 20),
                 static_cast<double>(bytes_after) / (1 << 20),
                 sqnr_text(error.sqnr_db));
  }

  // New nodes were appended; each chain (DQ, maybe Cast) moves just before its first consumer,
  // which keeps the order topological and each dequantized weight's lifetime short.
  static void move_chains_before_consumers(Graph& graph, size_t original_nodes,
                                           const std::vector<std::pair<size_t, size_t>>& chains) {
    std::vector<Node> old = std::move(graph.nodes);
    std::vector<std::vector<size_t>> before(original_nodes);
    for (size_t c = 0; c < chains.size(); ++c) {
      const size_t end = c + 1 < chains.size() ? chains[c + 1].second : old.size();
      for (size_t k = chains[c].second; k < end; ++k) before[chains[c].first].push_back(k);
    }
    graph.nodes.clear();
    graph.nodes.reserve(old.size());
    for (size_t i = 0; i < original_nodes; ++i) {
      for (size_t k : before[i]) graph.nodes.push_back(std::move(old[k]));
      graph.nodes.push_back(std::move(old[i]));
    }
  }

  WeightInt8Options options_;
  std::optional<UniqueNames> names_;  // the graph's, while quantize_group adds to it
  Device device_ = Device::Cpu;
};

}  // namespace

std::unique_ptr<Pass> make_weight_int8_pass(WeightInt8Options options) {
  return std::make_unique<WeightInt8Pass>(std::move(options));
}

}  // namespace qforge
