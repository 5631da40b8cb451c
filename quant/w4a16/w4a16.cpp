// W4A16: see quant/w4a16.h. Each eligible weight W [R, C] with reduction axis a becomes
// W_int4 (i4, same shape) and W_scale (f16, the weight's shape with dim a = ceil(dim / block))
// feeding DequantizeLinear(axis = a, block_size), or, for MatMul in the MatMulNBits format,
// W_nbits (u8) and W_nbits_scale consumed by com.microsoft MatMulNBits.
#include "quant/w4a16/w4a16.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "ir/error.h"
#include "ir/half.h"
#include "ir/json_number.h"
#include "kernels/int4.h"
#include "kernels/quantize.h"
#include "quant/w4a16/awq.h"
#include "quant/weights/f32_values.h"
#include "quant/weights/float_weights.h"
#include "quant/weights/transposed.h"
#include "quant/weights/weight_group.h"
#include "quant/weights/weight_slots.h"
#include "quant/w4a16/gptq.h"
#include "quant/opset.h"
#include "quant/calib/quant_error.h"
#include "quant/w4a16/w4a16_matmulnbits.h"

namespace qforge {

namespace {

constexpr int64_t kOpsetInt4Blocked = 21;  // int4 and DequantizeLinear's block_size
constexpr int kAllowedBlocks[] = {16, 32, 64, 128, 256};

// A weight quantized along its reduction axis, in the weight's own layout.
struct Quantized {
  std::vector<int8_t> q;         // [R, C], unpacked
  std::vector<uint16_t> scales;  // axis 0: [nb, C]; axis 1: [R, nb]
  QuantError error;
};

class W4A16Pass final : public Pass {
 public:
  explicit W4A16Pass(W4A16Options options) : options_(std::move(options)) {
    if (std::find(std::begin(kAllowedBlocks), std::end(kAllowedBlocks), options_.block_size) ==
        std::end(kAllowedBlocks)) {
      fail_usage("w4a16: block size " + std::to_string(options_.block_size) +
                 " is not supported; use 16, 32, 64, 128 or 256");
    }
    for (const std::string& p : options_.exclude_default) {
      try {
        default_excludes_.emplace_back(p);
      } catch (const std::regex_error& e) {
        fail_usage("w4a16: default exclusion '" + p + "' is not a valid regex: " + e.what());
      }
    }
  }

  [[nodiscard]] std::string_view name() const override { return "w4a16"; }

  void run(Graph& graph, PassReport& report) override {
    device_ = resolve_device(options_.device);
    report.stats["method"] = std::string(w4_method_name(options_.method));
    scale_ = options_.scale.value_or(default_int4_scale(options_.method));
    report.stats["scale"] = std::string(int4_scale_name(scale_));
    report.stats["block_size"] = options_.block_size;
    report.stats["format"] = std::string(int4_format_name(options_.format));
    report.stats["device"] = std::string(device_name(device_));
    for (const char* key : {"quantized", "skipped", "excluded", "not_constant"})
      report.stats[key] = 0;
    report.stats["bytes_before"] = 0;
    report.stats["bytes_after"] = 0;
    report.stats["tensors"] = nlohmann::ordered_json::array();

    if (options_.method == W4Method::Awq) {
      if (!options_.awq) {
        fail_usage("w4a16: method awq needs calibration activations (--calib DATA)");
      }
      PassReport scratch;
      const std::vector<W4A16Target> targets = targets_of(plan(graph, scratch));
      AwqOptions awq;
      awq.block_size = options_.block_size;
      awq.grid = options_.awq_grid;
      awq.device = device_;
      awq.scale = scale_;
      apply_awq(graph, targets, *options_.awq, awq, report);
    }
    gptq_.clear();
    if (options_.method == W4Method::Gptq) {
      if (!options_.gptq) {
        fail_usage("w4a16: method gptq needs calibration activations (--calib DATA)");
      }
      GptqOptions gptq;
      gptq.block_size = options_.block_size;
      gptq.scale = scale_;
      gptq_ = apply_gptq(graph, targets(graph), *options_.gptq, gptq, report);
    }
    const std::vector<WeightGroup> groups = plan(graph, report);
    std::vector<char> nbits;  // decided before any node is rewritten
    for (const WeightGroup& g : groups) nbits.push_back(rewrites_to_matmulnbits(graph, g));
    KernelWorkspace workspace;  // device buffers kept from one weight to the next
    names_.emplace(graph);
    for (size_t i = 0; i < groups.size(); ++i)
      quantize_group(graph, groups[i], nbits[i] != 0, i, groups.size(), workspace, report);
    names_.reset();
    std::vector<std::string> weights;
    for (const WeightGroup& g : groups) weights.push_back(g.weight);
    drop_unused_float_weights(graph, weights, "int4", report);
    if (!groups.empty()) {
      const bool any_dq = std::find(nbits.begin(), nbits.end(), 0) != nbits.end();
      if (any_dq) {
        if (auto warning =
                raise_default_opset(graph, kOpsetInt4Blocked, "int4 blocked DequantizeLinear")) {
          report.stats["opset"] = kOpsetInt4Blocked;
          report.warn(std::move(*warning));
        }
      }
      if (std::find(nbits.begin(), nbits.end(), 1) != nbits.end() &&
          graph.opset("com.microsoft") < 1) {
        graph.set_opset("com.microsoft", 1);
      }
    }
    graph.topological_sort();  // new DequantizeLinear/Cast nodes were appended
    graph.check();
  }

  static std::vector<W4A16Target> targets_of(const std::vector<WeightGroup>& groups) {
    std::vector<W4A16Target> out;
    for (const WeightGroup& g : groups)
      for (const auto& [node, input] : g.uses) out.push_back({node, input, g.weight, *g.axis});
    std::sort(out.begin(), out.end(), [](const W4A16Target& a, const W4A16Target& b) {
      return std::tie(a.node, a.input) < std::tie(b.node, b.input);
    });
    return out;
  }

  std::vector<W4A16Target> targets(const Graph& graph) const {
    PassReport scratch;
    return targets_of(plan(graph, scratch));
  }

 private:
  bool excluded(const Node& node, const std::string& weight,
                const std::unordered_set<std::string>& outputs,
                const std::unordered_map<std::string, std::vector<size_t>>& consumers,
                const Graph& graph, std::string& why) const {
    if (options_.exclude && std::regex_search(node.name, *options_.exclude)) {
      why = "matches --exclude";
      return true;
    }
    for (size_t i = 0; i < default_excludes_.size(); ++i) {
      if (std::regex_search(node.name, default_excludes_[i]) ||
          std::regex_search(weight, default_excludes_[i])) {
        why = "matches default exclusion '" + options_.exclude_default[i] + "'";
        return true;
      }
    }
    if (options_.exclude_output_projection && node.op_type != "Gather" && !node.outputs.empty()) {
      const std::string& out = node.outputs[0];
      bool is_output = outputs.count(out) > 0;
      const auto c = consumers.find(out);
      if (!is_output && c != consumers.end() && c->second.size() == 1) {
        const Node& next = graph.nodes[c->second[0]];
        is_output =
            next.op_type == "Add" && !next.outputs.empty() && outputs.count(next.outputs[0]);
      }
      if (is_output) {
        why = "is the output projection (its result is a graph output)";
        return true;
      }
    }
    return false;
  }

  // A group becomes MatMulNBits when that format was asked for and every reader is a MatMul.
  bool rewrites_to_matmulnbits(const Graph& graph, const WeightGroup& group) const {
    return options_.format == Int4Format::MatMulNBits &&
           std::all_of(group.uses.begin(), group.uses.end(), [&](const auto& use) {
             return graph.nodes[use.first].op_type == "MatMul";
           });
  }

  std::vector<WeightGroup> plan(const Graph& graph, PassReport& report) const {
    std::unordered_set<std::string> graph_inputs, graph_outputs;
    for (const ValueInfo& v : graph.inputs) graph_inputs.insert(v.name);
    for (const ValueInfo& v : graph.outputs) graph_outputs.insert(v.name);
    const auto consumers = graph.consumers();
    WeightGroups groups;
    SkippedWeights skipped(report);
    for (size_t i = 0; i < graph.nodes.size(); ++i) {
      const Node& node = graph.nodes[i];
      const WeightSlot* slot = find_weight_slot(node);
      if (slot == nullptr || slot->reduction_axis == nullptr) continue;
      if (slot->op_type == "Gather" && !options_.include_gather) continue;
      if (node.inputs.size() <= slot->weight_input || node.inputs[slot->weight_input].empty())
        continue;
      const std::string& weight = node.inputs[slot->weight_input];
      const Tensor* t = graph.find_initializer(weight);
      if (t == nullptr) {
        report.count("not_constant");
        continue;
      }
      std::string why;
      if (excluded(node, weight, graph_outputs, consumers, graph, why)) {
        report.count("excluded");
        spdlog::info("w4a16: {} left float: {}", node.label(), why);
        continue;
      }
      if (graph_inputs.count(weight)) {
        skipped.skip(weight, node, "is also a graph input (it can be replaced at run time)");
      } else if (t->dtype() != DType::F32 && t->dtype() != DType::F16) {
        skipped.skip(weight, node,
                     "is " + std::string(dtype_name(t->dtype())) + ", not f32 or f16");
      } else if (t->rank() != 2) {
        skipped.skip(weight, node,
                     "has " + std::to_string(t->rank()) + " dims; only 2-D weights are quantized");
      } else if (t->numel() == 0) {
        skipped.skip(weight, node, "is empty");
      } else {
        groups.add_use(weight, slot->reduction_axis(node), i, slot->weight_input);
      }
    }
    return groups.take();
  }

  Quantized quantize_values(const Graph& graph, const WeightGroup& group,
                            std::span<const float> values, int64_t rows, int64_t cols,
                            KernelWorkspace& workspace) const {
    if (!std::isfinite(amax(values, device_, &workspace))) {
      fail_invalid("w4a16: weight '" + group.weight + "' (" +
                   graph.nodes[group.uses.front().first].label() +
                   ") holds NaN or Inf: fix the model, or leave the node float with --exclude");
    }
    // The kernels block along rows; a weight reduced along axis 1 is quantized transposed.
    std::vector<float> t;
    std::span<const float> src = values;
    int64_t kr = rows, kc = cols;
    if (group.axis == 1) {
      t = transposed(values, rows, cols);
      src = t;
      std::swap(kr, kc);
    }
    const int64_t bs = options_.block_size;
    std::vector<uint16_t> scales(static_cast<size_t>(int4_block_count(kr, bs) * kc));
    std::vector<float> deq(src.size());
    Quantized out;
    const auto gptq = gptq_.find(group.weight);
    if (gptq != gptq_.end() && gptq->second.axis == *group.axis) {  // quantized by apply_gptq
      out.q = gptq->second.q;
      scales = gptq->second.scales;
      for (size_t i = 0; i < deq.size(); ++i)
        deq[i] = static_cast<float>(out.q[i]) *
                 f16_to_f32(scales[(i / static_cast<size_t>(kc)) / static_cast<size_t>(bs) *
                                       static_cast<size_t>(kc) +
                                   i % static_cast<size_t>(kc)]);
    } else {
      std::vector<uint8_t> packed(static_cast<size_t>(int4_packed_bytes(kr * kc)));
      int4_round_trip(src, kr, kc, bs, scales, packed, deq, device_, scale_, &workspace);
      out.q.resize(src.size());
      unpack_int4(packed, out.q);
    }
    out.error = measure_quant_error(src, deq);
    if (group.axis == 1) {
      out.q = transposed(std::span<const int8_t>(out.q), kr, kc);
      scales = transposed(std::span<const uint16_t>(scales), int4_block_count(kr, bs), kc);
    }
    out.scales = std::move(scales);
    return out;
  }

  void quantize_group(Graph& graph, const WeightGroup& group, bool nbits, size_t number,
                      size_t total, KernelWorkspace& workspace, PassReport& report) {
    const Tensor weight = *graph.find_initializer(group.weight);
    const int64_t rows = weight.shape()[0], cols = weight.shape()[1];
    const F32Values f32(weight);
    const Quantized qz = quantize_values(graph, group, f32.span(), rows, cols, workspace);
    const int64_t bs = options_.block_size;
    const int64_t blocks = int4_block_count(group.axis == 0 ? rows : cols, bs);
    int64_t bytes_after = 0;
    std::string form;
    if (nbits) {
      bytes_after = emit_matmulnbits(graph, group, weight.dtype(), qz, rows, cols);
      form = "MatMulNBits";
    } else {
      bytes_after = emit_dequantize(graph, group, weight.dtype(), qz, rows, cols, blocks);
      form = "DequantizeLinear";
    }

    nlohmann::ordered_json row;
    row["name"] = group.weight;
    row["shape"] = weight.shape();
    row["dtype"] = std::string(dtype_name(weight.dtype()));
    row["axis"] = *group.axis;
    row["block_size"] = bs;
    row["blocks"] = blocks;
    row["form"] = form;
    row["bytes_before"] = static_cast<int64_t>(weight.nbytes());
    row["bytes_after"] = bytes_after;
    row["max_abs_error"] = qz.error.max_abs;
    row["sqnr_db"] = json_number<nlohmann::ordered_json>(qz.error.sqnr_db);  // "inf" when exact
    report.stats["tensors"].push_back(std::move(row));
    report.count("quantized");
    spdlog::info(
        "[{}/{}] {} {} {} -> i4 axis {} block {} ({})  {:.2f} MiB -> {:.2f} MiB  SQNR {}",
        number + 1, total, group.weight, shape_to_string(weight.shape()),
        dtype_name(weight.dtype()), *group.axis, bs, form,
        static_cast<double>(weight.nbytes()) / (1 << 20),
        static_cast<double>(bytes_after) / (1 << 20),
        sqnr_text(qz.error.sqnr_db));
  }

  // int4 [R, C] + f16 scales -> DequantizeLinear (-> Cast to f32) -> the consumers.
  int64_t emit_dequantize(Graph& graph, const WeightGroup& group, DType dtype, const Quantized& qz,
                          int64_t rows, int64_t cols, int64_t blocks) {
    Tensor q(DType::I4, {rows, cols});
    pack_int4(qz.q, q.mutable_data<uint8_t>());
    const Shape scale_shape = group.axis == 0 ? Shape{blocks, cols} : Shape{rows, blocks};
    Tensor scale(DType::F16, scale_shape);
    std::copy(qz.scales.begin(), qz.scales.end(), scale.mutable_data<uint16_t>().begin());
    const auto bytes = static_cast<int64_t>(q.nbytes() + scale.nbytes());
    const std::string q_name = names_->take(group.weight + "_int4");
    graph.set_initializer(q_name, std::move(q));
    const std::string scale_name = names_->take(group.weight + "_scale");
    graph.set_initializer(scale_name, std::move(scale));

    Node dq;
    dq.op_type = "DequantizeLinear";
    dq.name = names_->take(group.weight + "_DequantizeLinear");
    dq.inputs = {q_name, scale_name};
    dq.outputs = {names_->take(group.weight + "_dequantized")};
    dq.set_attr(Attribute::make_int("axis", *group.axis));
    dq.set_attr(Attribute::make_int("block_size", options_.block_size));
    std::string result = dq.outputs[0];
    graph.add_quant_record({.kind = QuantKind::Weight,
                            .name = q_name,
                            .source = group.weight,
                            .dtype = DType::I4,
                            .bits = 4,
                            .axis = group.axis,
                            .block_size = options_.block_size,
                            .scale = scale_name,
                            .reader = result});
    graph.nodes.push_back(std::move(dq));
    if (dtype != DType::F16) {  // DequantizeLinear with an fp16 scale yields fp16
      Node cast;
      cast.op_type = "Cast";
      cast.name = names_->take(group.weight + "_Cast");
      cast.inputs = {result};
      cast.outputs = {
          names_->take(group.weight + "_dequantized_" + std::string(dtype_name(dtype)))};
      cast.set_attr(Attribute::make_int("to", dtype_to_onnx(dtype)));
      result = cast.outputs[0];
      graph.nodes.push_back(std::move(cast));
    }
    for (const auto& [node, input] : group.uses) graph.nodes[node].inputs[input] = result;
    return bytes;
  }

  int64_t emit_matmulnbits(Graph& graph, const WeightGroup& group, DType dtype, const Quantized& qz,
                           int64_t k, int64_t n) {
    const int64_t bs = options_.block_size;
    std::vector<float> scales(qz.scales.size());
    std::transform(qz.scales.begin(), qz.scales.end(), scales.begin(), f16_to_f32);
    const MatMulNBitsWeight packed = pack_matmulnbits(qz.q, scales, k, n, bs);
    const int64_t blocks = int4_block_count(k, bs);
    Tensor b(DType::U8, {n, blocks, bs / 2});
    std::copy(packed.b.begin(), packed.b.end(), b.mutable_data<uint8_t>().begin());
    // Scales in A's dtype (MatMulNBits' T1): exact, they came from fp16.
    Tensor s = Tensor::from_f32(packed.scales, {n * blocks}, dtype);
    const auto bytes = static_cast<int64_t>(b.nbytes() + s.nbytes());
    const std::string b_name = names_->take(group.weight + "_nbits");
    graph.set_initializer(b_name, std::move(b));
    const std::string s_name = names_->take(group.weight + "_nbits_scale");
    graph.set_initializer(s_name, std::move(s));
    for (const auto& [index, input] : group.uses) {
      Node& node = graph.nodes[index];
      node.op_type = "MatMulNBits";
      node.domain = "com.microsoft";
      node.inputs = {node.inputs[0], b_name, s_name};
      node.attributes.clear();
      node.set_attr(Attribute::make_int("K", k));
      node.set_attr(Attribute::make_int("N", n));
      node.set_attr(Attribute::make_int("bits", 4));
      node.set_attr(Attribute::make_int("block_size", bs));
    }
    // Blocks run along K, axis 0 of the logical B [K, N]; the values are stored as u4 (q + 8).
    graph.add_quant_record({.kind = QuantKind::Weight,
                            .name = b_name,
                            .source = group.weight,
                            .dtype = DType::U4,
                            .bits = 4,
                            .axis = 0,
                            .block_size = bs,
                            .scale = s_name,
                            .packing = QuantPacking::MatMulNBits,
                            .reader = graph.nodes[group.uses.front().first].outputs[0]});
    return bytes;
  }

  W4A16Options options_;
  std::optional<UniqueNames> names_;  // the graph's, while quantize_group adds to it
  std::vector<std::regex> default_excludes_;
  Device device_ = Device::Cpu;
  Int4Scale scale_ = Int4Scale::Mse;  // options_.scale resolved for the method, in run()
  std::map<std::string, GptqWeight> gptq_;  // method Gptq: the weights apply_gptq quantized
};

}  // namespace

std::string_view int4_format_name(Int4Format format) {
  return format == Int4Format::MatMulNBits ? "matmulnbits" : "onnx-blocked";
}

Int4Scale default_int4_scale(W4Method method) {
  return method == W4Method::Awq ? Int4Scale::Amax : Int4Scale::Mse;
}

std::string_view w4_method_name(W4Method method) {
  switch (method) {
    case W4Method::Awq:
      return "awq";
    case W4Method::Gptq:
      return "gptq";
    case W4Method::Rtn:
      break;
  }
  return "rtn";
}

std::unique_ptr<Pass> make_w4a16_pass(W4A16Options options) {
  return std::make_unique<W4A16Pass>(std::move(options));
}

std::vector<W4A16Target> plan_w4a16_targets(const Graph& graph, const W4A16Options& options) {
  W4A16Options copy = options;
  copy.method = W4Method::Rtn;
  copy.awq.reset();
  copy.gptq.reset();
  return W4A16Pass(std::move(copy)).targets(graph);
}

}  // namespace qforge
