#include "quant/calib/model_comparison.h"

#include <algorithm>
#include <map>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "ir/error.h"
#include "quant/calib/calibration.h"
#include "quant/calib/sample_context.h"
#include "quant/calib/token_mask.h"
#include "runtime/executor.h"

namespace qforge {

namespace {

// Adds ref vs quant to c's sums; with a mask that covers them, over real positions only.
void accumulate(const Tensor& ref, const Tensor& quant, const std::optional<TokenMask>& mask,
                ValueComparison& c) {
  const bool masked = mask && mask->covers(ref) && quant.shape() == ref.shape();
  const std::vector<float> r = (masked ? mask->real_rows(ref) : ref).to_f32();
  const std::vector<float> q = (masked ? mask->real_rows(quant) : quant).to_f32();
  c.error.add(r, q);
}

size_t argmax(const std::vector<float>& v, size_t row, size_t classes) {
  const auto first = v.begin() + static_cast<std::ptrdiff_t>(row * classes);
  return static_cast<size_t>(std::max_element(first, first + static_cast<std::ptrdiff_t>(classes)) -
                             first);
}

// Top-1 agreement (and accuracy against labels when the data has them) for [N, C] outputs.
void accumulate_top1(const Tensor& ref, const Tensor& quant, const Tensor* labels,
                     ValueComparison& c) {
  if (ref.rank() != 2 || ref.shape()[1] < 2) return;
  const auto rows = static_cast<size_t>(ref.shape()[0]);
  const auto classes = static_cast<size_t>(ref.shape()[1]);
  const std::vector<float> r = ref.to_f32();
  const std::vector<float> q = quant.to_f32();
  std::vector<float> l;
  if (labels != nullptr && labels->numel() == rows && !dtype_is_float(labels->dtype())) {
    l = labels->to_f32();
  }
  for (size_t n = 0; n < rows; ++n) {
    const size_t fr = argmax(r, n, classes);
    const size_t qr = argmax(q, n, classes);
    c.top1_same += fr == qr;
    ++c.top1_total;
    if (!l.empty()) {
      c.right_float += static_cast<double>(fr) == l[n];
      c.right_quant += static_cast<double>(qr) == l[n];
      ++c.labelled;
    }
  }
}

// Where the quantized graph holds a value's quantized form: DequantizeLinear(QuantizeLinear(X))
// outputs, by name, mapped to X.
std::unordered_map<std::string, std::string> dequantized_aliases(const Graph& g) {
  std::unordered_map<std::string, std::string> quantized_from;  // Q output -> X
  for (const Node& n : g.nodes) {
    if (n.op_type == "QuantizeLinear" && !n.inputs.empty() && !n.outputs.empty()) {
      quantized_from[n.outputs[0]] = n.inputs[0];
    }
  }
  std::unordered_map<std::string, std::string> out;
  for (const Node& n : g.nodes) {
    if (n.op_type != "DequantizeLinear" || n.inputs.empty() || n.outputs.empty()) continue;
    const auto it = quantized_from.find(n.inputs[0]);
    if (it != quantized_from.end()) out.emplace(n.outputs[0], it->second);
  }
  return out;
}

// The per-layer comparison points: values of the float graph (node outputs, and inputs that the
// quantized graph quantizes) that the quantized graph computes too, as itself or in Q/DQ form;
// graph outputs are reported on their own.
std::unordered_set<std::string> shared_values(
    const Graph& ref, const Graph& quant,
    const std::unordered_map<std::string, std::string>& aliases) {
  std::unordered_set<std::string> in_quant;
  for (const Node& n : quant.nodes) in_quant.insert(n.outputs.begin(), n.outputs.end());
  std::unordered_set<std::string> quantized;
  for (const auto& [dq, x] : aliases) quantized.insert(x);
  std::unordered_set<std::string> out;
  for (const Node& n : ref.nodes) {
    for (const std::string& o : n.outputs) {
      if (!o.empty() && (in_quant.count(o) || quantized.count(o))) out.insert(o);
    }
  }
  for (const ValueInfo& v : ref.inputs) {
    if (quantized.count(v.name)) out.insert(v.name);
  }
  for (const ValueInfo& v : ref.outputs) out.erase(v.name);
  return out;
}

bool has_value(const std::vector<ValueInfo>& values, const std::string& name) {
  return std::any_of(values.begin(), values.end(),
                     [&](const ValueInfo& v) { return v.name == name; });
}

const Tensor* find_extra(const BatchSource::Feeds& extras, const std::string& name) {
  for (const auto& [n, t] : extras) {
    if (n == name) return &t;
  }
  return nullptr;
}

}  // namespace

ModelComparison compare_models(const Graph& float_graph, const Graph& quant_graph,
                               BatchSource& data, const ModelCompareOptions& options) {
  for (const ValueInfo& v : calibration_inputs(float_graph)) {
    if (!has_value(quant_graph.inputs, v.name)) {
      fail_invalid("compare: input '" + v.name + "' of " + options.float_name +
                   " is not an input of " + options.quant_name +
                   "; compare a model with its own quantized version");
    }
  }
  ModelComparison result;
  for (const ValueInfo& v : float_graph.outputs) {
    if (!has_value(quant_graph.outputs, v.name)) {
      fail_invalid("compare: output '" + v.name + "' of " + options.float_name +
                   " is not an output of " + options.quant_name);
    }
    result.outputs.push_back({.name = v.name});
  }
  ExecutorOptions eo;
  eo.threads = options.threads;
  eo.fuse_ops = false;  // every shared value is compared, so every one is computed
  Executor ref_exec(float_graph, eo);
  Executor quant_exec(quant_graph, eo);
  const auto aliases = dequantized_aliases(quant_graph);
  const std::unordered_set<std::string> shared = shared_values(float_graph, quant_graph, aliases);
  std::unordered_set<std::string> has_dequantized;
  for (const auto& [dq, x] : aliases) has_dequantized.insert(x);
  std::unordered_map<std::string, Tensor> ref_values;
  std::map<std::string, ValueComparison> layers;
  std::optional<TokenMask> mask;  // the running batch's, when it has padded positions
  ref_exec.set_observer([&](const std::string& name, const Tensor& t) {
    if (t.dtype() == DType::F32 && shared.count(name)) ref_values[name] = t;
  });
  quant_exec.set_observer([&](const std::string& observed, const Tensor& t) {
    // A quantized value is compared in the form its readers see: after Q/DQ.
    const auto alias = aliases.find(observed);
    if (alias == aliases.end() && has_dequantized.count(observed)) return;
    const std::string& name = alias == aliases.end() ? observed : alias->second;
    const auto it = ref_values.find(name);
    if (it == ref_values.end() || t.dtype() != DType::F32 || t.shape() != it->second.shape())
      return;
    ValueComparison& c = layers[name];
    c.name = name;
    accumulate(it->second, t, mask, c);
    ref_values.erase(it);
  });

  data.rewind();
  BatchSource::Feeds batch, extras;
  while (data.next(batch, &extras)) {
    mask.reset();
    if (!options.mask_input.empty()) {
      TokenMask m(batch, options.mask_input);
      if (!m.all_real()) mask = std::move(m);
    }
    const std::vector<Tensor> r = run_batch(ref_exec, batch, data, result.samples);
    const std::vector<Tensor> q = run_batch(quant_exec, batch, data, result.samples);
    ref_values.clear();
    const Tensor* labels = find_extra(extras, "labels");
    for (size_t i = 0; i < result.outputs.size(); ++i) {
      ValueComparison& out = result.outputs[i];
      if (r[i].shape() != q[i].shape() || !dtype_is_float(r[i].dtype()) ||
          !dtype_is_float(q[i].dtype())) {
        fail_invalid("compare: output '" + out.name + "' is " +
                     std::string(dtype_name(r[i].dtype())) + " " + shape_to_string(r[i].shape()) +
                     " in " + options.float_name + " but " +
                     std::string(dtype_name(q[i].dtype())) + " " + shape_to_string(q[i].shape()) +
                     " in " + options.quant_name);
      }
      accumulate(r[i], q[i], mask, out);
      accumulate_top1(r[i], q[i], labels, out);
    }
    result.samples += batch_samples(batch);
    if (options.progress) options.progress(result.samples, data.size());
  }

  for (auto& [name, c] : layers) result.layers.push_back(std::move(c));
  std::sort(result.layers.begin(), result.layers.end(),
            [](const ValueComparison& a, const ValueComparison& b) {
              return ranks_worse(a.row(), b.row());
            });
  return result;
}

}  // namespace qforge
