// AWQ: see quant/awq.h. Three steps per activation: the observer keeps mean |x| per channel and
// a row sample; the search picks alpha; the rewrite scales the weights' rows and puts 1/s on the
// activation side (folded into its producer, or a Mul).
#include "quant/w4a16/awq.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "ir/error.h"
#include "ir/half.h"
#include "kernels/int4.h"
#include "kernels/quantize.h"
#include "quant/calib/calibration.h"
#include "quant/w4a16/awq_search.h"
#include "runtime/executor.h"
#include "kernels/gemm.h"

namespace qforge {

namespace {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

bool is_float(DType d) { return d == DType::F32 || d == DType::F16 || d == DType::BF16; }

bool default_domain(const Node& node) { return node.domain.empty() || node.domain == "ai.onnx"; }

// The activation a target weight multiplies (input 0 of MatMul, or of Gemm without transA).
std::optional<std::string> activation_of(const Graph& graph, const W4A16Target& t) {
  const Node& node = graph.nodes[t.node];
  if (!default_domain(node) || t.input != 1 || node.inputs.empty() || node.inputs[0].empty())
    return std::nullopt;
  if (node.op_type == "MatMul" && t.axis == 0) return node.inputs[0];
  if (node.op_type == "Gemm" && node.attr_int("transA", 0) == 0) return node.inputs[0];
  return std::nullopt;
}

// A weight as [K, N] f32, whatever its layout (axis 1: stored [N, K]).
std::vector<float> weight_kn(const Tensor& w, int64_t axis) {
  std::vector<float> v = w.to_f32();
  if (axis == 0) return v;
  const int64_t n = w.shape()[0], k = w.shape()[1];
  std::vector<float> t(v.size());
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c)
      t[static_cast<size_t>(c * n + r)] = v[static_cast<size_t>(r * k + c)];
  return t;
}

// Replaces the producer's constant input `slot` by `values` (shape `shape`, dtype `dtype`): in
// place when only this node reads it (names stay stable for later groups), else as a new
// initializer for this node alone.
void replace_constant(Graph& graph, size_t node, size_t slot, std::span<const float> values,
                      const Shape& shape, DType dtype) {
  const std::string old = graph.nodes[node].inputs[slot];
  bool shared = false;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const auto& in = graph.nodes[i].inputs;
    const auto uses = std::count(in.begin(), in.end(), old);
    shared = shared || (i == node ? uses > 1 : uses > 0);
  }
  for (const ValueInfo& v : graph.outputs) shared = shared || v.name == old;
  for (const ValueInfo& v : graph.inputs) shared = shared || v.name == old;
  if (!shared) {
    graph.set_initializer(old, Tensor::from_f32(values, shape, dtype));
    std::erase_if(graph.value_info, [&](const ValueInfo& v) { return v.name == old; });
    return;
  }
  const std::string name = graph.unique_name(old + "_awq");
  graph.set_initializer(name, Tensor::from_f32(values, shape, dtype));
  graph.nodes[node].inputs[slot] = name;
}

// A constant of K values along the last axis (shape [K], [1, K], ...) or a scalar.
bool per_channel_or_scalar(const Tensor& t, int64_t k) {
  if (!is_float(t.dtype())) return false;
  if (t.numel() == 1) return true;
  if (static_cast<int64_t>(t.numel()) != k || t.rank() == 0) return false;
  return t.shape().back() == k;
}

std::vector<float> times(const Tensor& t, std::span<const float> inv) {
  std::vector<float> v = t.to_f32();
  std::vector<float> out(inv.size());
  for (size_t k = 0; k < inv.size(); ++k) out[k] = v[v.size() == 1 ? 0 : k] * inv[k];
  return out;
}

Shape per_channel_shape(const Tensor& t, int64_t k) {
  return t.numel() == 1 ? Shape{k} : t.shape();
}

// Folds diag(inv) into the node producing the activation; the name of what it folded into, or
// nullopt when the producer is not one this knows to fold exactly.
std::optional<std::string> fold_into_producer(Graph& graph, size_t p, std::span<const float> inv) {
  const Node& node = graph.nodes[p];
  const auto k = static_cast<int64_t>(inv.size());
  if (!default_domain(node) || node.outputs.empty()) return std::nullopt;
  auto init = [&](size_t slot) -> const Tensor* {
    return slot < node.inputs.size() && !node.inputs[slot].empty()
               ? graph.find_initializer(node.inputs[slot])
               : nullptr;
  };
  if (node.op_type == "LayerNormalization" && node.attr_int("axis", -1) == -1) {
    const Tensor* scale = init(1);
    const bool has_bias = node.inputs.size() > 2 && !node.inputs[2].empty();
    const Tensor* bias = init(2);
    if (scale == nullptr || !per_channel_or_scalar(*scale, k) || scale->numel() != inv.size() ||
        (has_bias && (bias == nullptr || !per_channel_or_scalar(*bias, k))))
      return std::nullopt;
    const Tensor s = *scale;
    const std::optional<Tensor> b = has_bias ? std::optional<Tensor>(*bias) : std::nullopt;
    replace_constant(graph, p, 1, times(s, inv), s.shape(), s.dtype());
    if (b) replace_constant(graph, p, 2, times(*b, inv), per_channel_shape(*b, k), b->dtype());
    return graph.nodes[p].label();
  }
  if (node.op_type == "Mul" && node.inputs.size() == 2) {
    const Tensor* a = init(0);
    const Tensor* b = init(1);
    if ((a == nullptr) == (b == nullptr)) return std::nullopt;  // exactly one constant
    const size_t slot = a != nullptr ? 0 : 1;
    const Tensor c = *(a != nullptr ? a : b);
    if (!per_channel_or_scalar(c, k)) return std::nullopt;
    replace_constant(graph, p, slot, times(c, inv), per_channel_shape(c, k), c.dtype());
    return graph.nodes[p].label();
  }
  const bool gemm = node.op_type == "Gemm";
  if (node.op_type == "MatMul" || gemm) {
    const Tensor* w = init(1);
    if (w == nullptr || !is_float(w->dtype()) || w->rank() != 2 || init(0) != nullptr)
      return std::nullopt;
    const bool trans_b = gemm && node.attr_int("transB", 0) != 0;
    if ((trans_b ? w->shape()[0] : w->shape()[1]) != k) return std::nullopt;
    const bool has_bias = gemm && node.inputs.size() > 2 && !node.inputs[2].empty();
    const Tensor* bias = init(2);
    if (has_bias && (bias == nullptr || !per_channel_or_scalar(*bias, k))) return std::nullopt;
    const Tensor wt = *w;
    const std::optional<Tensor> b = has_bias ? std::optional<Tensor>(*bias) : std::nullopt;
    std::vector<float> v = wt.to_f32();
    const int64_t rows = wt.shape()[0], cols = wt.shape()[1];
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        v[static_cast<size_t>(r * cols + c)] *= inv[static_cast<size_t>(trans_b ? r : c)];
    replace_constant(graph, p, 1, v, wt.shape(), wt.dtype());
    if (b) replace_constant(graph, p, 2, times(*b, inv), per_channel_shape(*b, k), b->dtype());
    return graph.nodes[p].label();
  }
  return std::nullopt;
}

bool has_subgraphs(const Graph& graph) {
  for (const Node& n : graph.nodes)
    for (const Attribute& a : n.attributes)
      if (a.g || !a.graphs.empty()) return true;
  return false;
}

}  // namespace

std::vector<float> AwqActivation::mean_abs() const {
  std::vector<float> m(sum_abs.size(), 0.0f);
  if (rows == 0) return m;
  for (size_t k = 0; k < m.size(); ++k)
    m[k] = static_cast<float>(sum_abs[k] / static_cast<double>(rows));
  return m;
}

AwqObserver::AwqObserver(const std::map<std::string, int64_t>& channels, int64_t max_rows)
    : max_rows_(max_rows) {
  if (max_rows < 1) fail_usage("awq: keep at least one calibration row per activation");
  for (const auto& [name, k] : channels) {
    AwqActivation a;
    a.channels = k;
    a.sum_abs.assign(static_cast<size_t>(k), 0.0);
    acts_.emplace(name, std::move(a));
    rngs_.emplace(name, Reservoir{});
  }
}

void AwqObserver::observe(const std::string& name, const Tensor& value) {
  const auto it = acts_.find(name);
  if (it == acts_.end() || !is_float(value.dtype()) || value.rank() == 0) return;
  AwqActivation& a = it->second;
  const int64_t k = a.channels;
  if (value.shape().back() != k) return;
  a.dtype = value.dtype();
  const std::vector<float> v = value.to_f32();
  const auto rows = static_cast<int64_t>(v.size()) / k;
  uint64_t& state = rngs_[name].state;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = v.data() + r * k;
    for (int64_t c = 0; c < k; ++c) a.sum_abs[static_cast<size_t>(c)] += std::fabs(row[c]);
    // Reservoir sampling (Algorithm R) over the rows in data-set order.
    const uint64_t seen = a.rows++;
    if (static_cast<int64_t>(seen) < max_rows_) {
      a.sample.insert(a.sample.end(), row, row + k);
    } else {
      const uint64_t j = splitmix64(state) % (seen + 1);
      if (static_cast<int64_t>(j) < max_rows_)
        std::copy(row, row + k, a.sample.begin() + static_cast<int64_t>(j) * k);
    }
  }
}

std::map<std::string, int64_t> awq_activation_channels(const Graph& graph,
                                                       std::span<const W4A16Target> targets) {
  std::map<std::string, int64_t> out;
  std::set<std::string> conflicting;
  for (const W4A16Target& t : targets) {
    const auto a = activation_of(graph, t);
    const Tensor* w = graph.find_initializer(t.weight);
    if (!a || w == nullptr || w->rank() != 2) continue;
    const int64_t k = w->shape()[static_cast<size_t>(t.axis)];
    const auto [it, added] = out.emplace(*a, k);
    if (!added && it->second != k) conflicting.insert(*a);
  }
  for (const std::string& c : conflicting) out.erase(c);
  return out;
}

std::optional<std::string> awq_activation_of(const Graph& graph, const W4A16Target& target) {
  return activation_of(graph, target);
}

AwqCalibration collect_awq_calibration(const Graph& graph, BatchSource& data,
                                       std::span<const W4A16Target> targets,
                                       const AwqOptions& options, int threads,
                                       const std::string& mask_input, PassReport& report) {
  report.pass = "awq-calibrate";
  AwqObserver observer(awq_activation_channels(graph, targets), options.max_rows);
  auto calib = collect_activations<AwqCalibration>(graph, data, threads, mask_input, observer, report);
  report.stats["max_rows"] = options.max_rows;
  spdlog::info("awq: {} activations over {} samples, {:.2f} s",
               report.stats["activations"].get<int64_t>(), calib.samples, report.seconds);
  return calib;
}

void apply_awq(Graph& graph, std::span<const W4A16Target> targets, const AwqCalibration& calib,
               const AwqOptions& options, PassReport& report) {
  if (options.grid < 1) fail_usage("awq: the alpha grid needs at least one point");
  const Device device = resolve_device(options.device);
  // Device buffers for the whole pass: every activation's grid reuses them.
  KernelWorkspace workspace;
  KernelWorkspace* const device_workspace = device == Device::Cpu ? nullptr : &workspace;
  const auto consumers = graph.consumers();
  const auto producers = graph.producers();
  const bool subgraphs = has_subgraphs(graph);
  std::unordered_set<std::string> outputs;
  for (const ValueInfo& v : graph.outputs) outputs.insert(v.name);

  // Targets by activation, in order of first use.
  std::vector<std::string> order;
  std::unordered_map<std::string, std::vector<W4A16Target>> by_act;
  const auto channels = awq_activation_channels(graph, targets);
  for (const W4A16Target& t : targets) {
    const auto a = activation_of(graph, t);
    if (!a || !channels.count(*a)) continue;
    if (!by_act.count(*a)) order.push_back(*a);
    by_act[*a].push_back(t);
  }
  // A weight read by nodes of another activation (tied) cannot take one activation's scales.
  std::unordered_map<std::string, std::set<std::string>> weight_acts;
  for (const auto& [act, ts] : by_act)
    for (const W4A16Target& t : ts) weight_acts[t.weight].insert(act);

  report.stats["awq"] = nlohmann::ordered_json::array();
  report.stats["awq_grid"] = options.grid;
  for (const std::string& act : order) {
    const auto c = calib.activations.find(act);
    if (c == calib.activations.end() || c->second.rows == 0 ||
        c->second.channels != channels.at(act)) {
      report.warn("awq: no calibration rows for activation '" + act +
                  "': its weights are rounded to nearest");
      report.count("awq_no_data");
      continue;
    }
    const AwqActivation& a = c->second;
    std::vector<AwqMember> members;
    std::vector<W4A16Target> member_targets;  // members[i] is member_targets[i]'s weight
    std::set<size_t> member_nodes;
    for (const W4A16Target& t : by_act[act]) {
      const auto uses = consumers.find(t.weight);
      bool own = weight_acts[t.weight].size() == 1;
      if (uses != consumers.end())
        for (size_t u : uses->second) {
          const Node& n = graph.nodes[u];
          own = own && n.inputs.size() > 1 && n.inputs[0] == act && n.inputs[1] == t.weight &&
                std::count(n.inputs.begin(), n.inputs.end(), t.weight) == 1;
        }
      const Tensor& w = *graph.find_initializer(t.weight);
      if (!own || !std::isfinite(amax(std::span<const float>(w.to_f32()), Device::Cpu))) continue;
      if (std::any_of(member_targets.begin(), member_targets.end(),
                      [&](const W4A16Target& m) { return m.weight == t.weight; })) {
        member_nodes.insert(t.node);
        continue;
      }
      AwqMember m;
      m.w = weight_kn(w, t.axis);
      m.n = w.shape()[t.axis == 0 ? 1 : 0];
      members.push_back(std::move(m));
      member_targets.push_back(t);
      member_nodes.insert(t.node);
    }
    if (members.empty()) continue;
    const AwqScaleSearch found =
        awq_search_scales(a, members, options, device, device_workspace);
    const double alpha = static_cast<double>(found.best) / options.grid;
    nlohmann::ordered_json row;
    row["activation"] = act;
    row["weights"] = nlohmann::ordered_json::array();
    for (const W4A16Target& t : member_targets) row["weights"].push_back(t.weight);
    row["channels"] = a.channels;
    row["rows"] = a.sample_rows();
    row["alpha"] = alpha;
    row["error_rtn"] = found.error_rtn;
    row["error_awq"] = found.error_best;
    std::string where = "none (alpha 0: round to nearest)";
    std::vector<AwqClip> clips;
    if (options.clip) {
      double before = 0.0, after = 0.0;
      int64_t clipped = 0;
      for (const AwqMember& m : members) {
        clips.push_back(awq_search_clip(a, found.s, m, options));
        before += clips.back().before;
        after += clips.back().after;
        clipped += clips.back().clipped;
      }
      row["clip_error_before"] = before;
      row["clip_error_after"] = after;
      row["clipped_block_columns"] = clipped;
    }
    const bool clipping =
        std::any_of(clips.begin(), clips.end(), [](const AwqClip& c) { return c.clipped > 0; });
    if (found.best > 0 || clipping) {
      for (size_t i = 0; i < members.size(); ++i) {
        const AwqMember& m = members[i];
        const W4A16Target& target = member_targets[i];
        const Tensor w = *graph.find_initializer(target.weight);
        std::vector<float> v = w.to_f32();
        const int64_t rows = w.shape()[0], cols = w.shape()[1];
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t col = 0; col < cols; ++col) {
            const int64_t kk = target.axis == 0 ? r : col, nn = target.axis == 0 ? col : r;
            float& x = v[static_cast<size_t>(r * cols + col)];
            x *= found.s[static_cast<size_t>(kk)];
            if (!clips.empty()) {
              const float lim =
                  clips[i].limit[static_cast<size_t>((kk / options.block_size) * m.n + nn)];
              x = std::clamp(x, -lim, lim);
            }
          }
        graph.set_initializer(target.weight, Tensor::from_f32(v, w.shape(), w.dtype()));
      }
      if (clipping) report.count("awq_clipped");
    }
    if (found.best > 0) {
      const int64_t k = a.channels;
      std::vector<float> inv(static_cast<size_t>(k));
      for (size_t i = 0; i < inv.size(); ++i) inv[i] = 1.0f / found.s[i];
      // Folding changes the activation for every reader: only when all of them are scaled.
      bool only_members = !subgraphs && !outputs.count(act) && producers.count(act) > 0;
      const auto readers = consumers.find(act);
      if (readers != consumers.end())
        for (size_t r : readers->second) only_members = only_members && member_nodes.count(r) > 0;
      std::optional<std::string> folded;
      if (only_members) folded = fold_into_producer(graph, producers.at(act), inv);
      if (folded) {
        where = "folded into " + *folded;
        report.count("awq_folded");
      } else {
        Node mul;
        mul.op_type = "Mul";
        mul.name = graph.unique_name(act + "_awq_Mul");
        const std::string inv_name = graph.unique_name(act + "_awq_inv_scale");
        graph.set_initializer(inv_name, Tensor::from_f32(inv, {k}, a.dtype));
        mul.inputs = {act, inv_name};
        mul.outputs = {graph.unique_name(act + "_awq")};
        for (size_t n : member_nodes) graph.nodes[n].inputs[0] = mul.outputs[0];
        graph.nodes.push_back(std::move(mul));
        where = "Mul inserted";
        report.count("awq_mul");
      }
      report.count("awq_scaled");
    }
    row["inverse_scale"] = where;
    spdlog::info(
        "awq: {} ({} weights) alpha {:.2f}, sample error {:.4g} -> {:.4g} (rtn -> awq), {}", act,
        members.size(), alpha, found.error_rtn, found.error_best, where);
    report.stats["awq"].push_back(std::move(row));
  }
}

}  // namespace qforge
