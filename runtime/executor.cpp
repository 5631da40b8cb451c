#include "runtime/executor.h"

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "ir/error.h"
#include "runtime/cuda/device_runtime.h"
#include "runtime/int4_fusion.h"
#include "runtime/op_registry.h"
#include "runtime/op_utils.h"

namespace qforge {

struct Executor::Plan {
  struct Step {
    ops::OpFn fn = nullptr;
    int64_t opset = 0;
    std::vector<int> inputs;   // slot ids, -1 for absent optional inputs
    std::vector<int> outputs;  // slot ids, -1 for absent optional outputs
    std::vector<int> release;  // slots to drop once this step has run
    bool device = false;       // tried on the CUDA device first (Device::Cuda)
    // HalfCompute::Ort: f16/bf16 inputs are widened to f32 first, so the op computes and
    // returns f32; `fold_cast` (a model Cast ORT removes) then just passes the f32 value on.
    bool wide = false;
    bool fold_cast = false;
    // Per output: the 16-bit type its f32 result is rounded to in its slot (F32: kept as is),
    // and a second slot (-1: none) that receives a rounded copy while the slot keeps f32.
    std::vector<DType> narrow;
    std::vector<int> rounded_copy;
  };
  std::vector<Step> steps;
  std::vector<std::string> names;                 // slot id -> value name
  std::vector<std::pair<int, Tensor>> constants;  // initializers, by slot
  std::vector<int> input_slots;                   // per graph input
  std::vector<int> output_slots;                  // per graph output
  std::vector<bool> constant;                     // per slot: an initializer
  std::vector<std::string> kept_f32;              // 16-bit values stored as f32 (Ort)
};

namespace {

std::string dims_to_string(const std::vector<Dim>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) s += ", ";
    s += dims[i].value ? std::to_string(*dims[i].value)
                       : (dims[i].param.empty() ? std::string("?") : dims[i].param);
  }
  return s + "]";
}

std::string quoted_feed(const std::string& name) { return "feed '" + name + "'"; }

[[noreturn]] void fail_unknown_feed(const std::string& name, const std::vector<ValueInfo>& inputs) {
  std::string names;
  for (const auto& in : inputs) names.append(names.empty() ? "" : ", ").append(in.name);
  fail_invalid(quoted_feed(name) + " is not an input of the graph (inputs: " + names + ")");
}

// A feed against its graph input: dtype, rank and every fixed dimension.
void check_feed(const ValueInfo& info, const Tensor& tensor) {
  const std::string feed = quoted_feed(info.name);
  const std::string input = "graph input '" + info.name + "'";
  if (tensor.empty()) fail_invalid(feed + " holds no tensor");
  if (info.dtype && *info.dtype != tensor.dtype()) {
    fail_invalid(feed + " has dtype " + std::string(dtype_name(tensor.dtype())) + " but " + input +
                 " is " + std::string(dtype_name(*info.dtype)));
  }
  if (!info.shape) return;
  const auto& dims = *info.shape;
  const std::string shape = shape_to_string(tensor.shape());
  if (dims.size() != tensor.rank()) {
    fail_invalid(feed + " has shape " + shape + " (rank " + std::to_string(tensor.rank()) +
                 ") but " + input + " has rank " + std::to_string(dims.size()) + " " +
                 dims_to_string(dims));
  }
  const auto bad = [&](size_t d) {
    fail_invalid(feed + " has shape " + shape + " but dimension " + std::to_string(d) + " of " +
                 input + " " + dims_to_string(dims) + " is " + std::to_string(*dims[d].value));
  };
  for (size_t d = 0; d < dims.size(); ++d) {
    if (dims[d].value && *dims[d].value != tensor.shape()[d]) bad(d);
  }
}

int64_t opset_of(const Graph& g, const std::string& domain) {
  const std::string d = domain == "ai.onnx" ? "" : domain;
  int64_t v = g.opset(d);
  if (v == 0 && d.empty()) v = g.opset("ai.onnx");
  if (v == 0 && d.empty()) v = Executor::kDefaultOpset;
  return v;
}


// ---- HalfCompute::Ort planning -----------------------------------------------------------------

bool in_default_domain(const Node& n) { return n.domain.empty() || n.domain == "ai.onnx"; }

// Ops that ONNX Runtime's CPU provider (1.31, x86) runs with an fp16 kernel: their fp16 inputs
// and outputs stay 16-bit there. Probed one op at a time with an fp16 input, reading the
// optimized model ORT saves (no InsertedCast around the node). Every other op with an fp16
// input runs in f32 between Casts that ORT inserts.
bool ort_has_fp16_cpu_kernel(const Node& n) {
  static const std::unordered_set<std::string> kDefault = {
      "Cast",      "CastLike", "Identity", "Round",   "Sign",    "IsNaN",   "Max",
      "Min",       "Clip",     "Transpose", "Reshape", "Unsqueeze", "Squeeze", "Flatten",
      "Concat",    "Split",    "Slice",    "Gather",  "Expand",  "Shape",   "Size",
      "LayerNormalization", "DequantizeLinear", "QuantizeLinear", "ConstantOfShape"};
  static const std::unordered_set<std::string> kMicrosoft = {"MatMulNBits",
                                                             "SkipLayerNormalization"};
  if (in_default_domain(n)) return kDefault.count(n.op_type) > 0;
  if (n.domain == "com.microsoft") return kMicrosoft.count(n.op_type) > 0;
  return false;
}

// Declared element type of the values of `g` as far as the planning needs it (is it f16/bf16):
// from the graph's inputs, outputs, value_info and initializers, then per node by the op's rule
// (the type of its first float input for most ops).
std::unordered_map<std::string, DType> declared_dtypes(const Graph& g) {
  std::unordered_map<std::string, DType> t;
  for (const auto& [name, tensor] : g.initializers()) t[name] = tensor.dtype();
  for (const auto* list : {&g.inputs, &g.outputs, &g.value_info}) {
    for (const auto& v : *list) {
      if (v.dtype) t[v.name] = *v.dtype;
    }
  }
  static const std::unordered_set<std::string> kI64 = {"Shape", "Size", "NonZero", "ArgMax",
                                                       "ArgMin"};
  static const std::unordered_set<std::string> kBool = {
      "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or", "Xor",
      "IsNaN", "IsInf"};
  const auto in = [&](const Node& n, size_t i) -> std::optional<DType> {
    if (i >= n.inputs.size()) return std::nullopt;
    const auto it = t.find(n.inputs[i]);
    return it == t.end() ? std::nullopt : std::optional(it->second);
  };
  for (const Node& n : g.nodes) {
    std::optional<DType> d;
    if (in_default_domain(n)) {
      if (n.op_type == "Cast") {
        d = dtype_from_onnx(static_cast<int>(n.attr_int("to", 0)));
      } else if (n.op_type == "CastLike") {
        d = in(n, 1);
      } else if (kI64.count(n.op_type)) {
        d = DType::I64;
      } else if (kBool.count(n.op_type)) {
        d = DType::Bool;
      } else if (n.op_type == "DequantizeLinear" || n.op_type == "Where") {
        d = in(n, 1);
      } else if (n.op_type == "Constant" || n.op_type == "ConstantOfShape") {
        const Attribute* a = n.attr("value");
        if (a != nullptr && a->type == AttrType::Tensor) d = a->t.dtype();
      }
    }
    if (!d && !(in_default_domain(n) && n.op_type == "QuantizeLinear")) {
      for (size_t i = 0; i < n.inputs.size() && !d; ++i) {
        const auto x = in(n, i);
        if (x && (*x == DType::F32 || *x == DType::F64 || ops::is_half(*x))) d = x;
      }
    }
    if (!d) continue;
    for (const auto& out : n.outputs) {
      if (!out.empty()) t.emplace(out, *d);
    }
  }
  return t;
}

// Per node of `g` (the graph as written, before the int4 fusion), keyed by its first output:
// does ORT run it in f32 on widened fp16 inputs (`wide`), and is it a model Cast that ORT's
// RemoveDuplicateCastTransformer folds into its neighbours (`fold`)?
struct OrtDecision {
  bool wide = false;
  bool fold = false;
};
std::unordered_map<std::string, OrtDecision> ort_decisions(
    const Graph& g, const std::unordered_map<std::string, DType>& dtype) {
  const auto half = [&](const std::string& v) {
    const auto it = dtype.find(v);
    return !v.empty() && it != dtype.end() && ops::is_half(it->second);
  };
  const auto producers = g.producers();
  const auto consumers = g.consumers();
  std::unordered_set<std::string> outputs;
  for (const auto& o : g.outputs) outputs.insert(o.name);
  const size_t n = g.nodes.size();
  // ORT: a node with an fp16 input and no fp16 kernel gets Casts to f32 inserted around it.
  std::vector<bool> assigned(n), needs_cast(n);
  const auto has_half_input = [&](const Node& node) {
    return std::any_of(node.inputs.begin(), node.inputs.end(), half);
  };
  for (size_t i = 0; i < n; ++i) {
    assigned[i] = ort_has_fp16_cpu_kernel(g.nodes[i]);
    needs_cast[i] = !assigned[i] && has_half_input(g.nodes[i]);
  }
  // ForceSingleNodeCPUFloat16ToFloat32 (IsIsolatedFp16NodeOnCpu): a node with an fp16 kernel
  // is run in f32 too when it reads some value made by another node, makes no graph output,
  // has an fp16 input and an fp16 output, every fp16 input made by a node comes from one that
  // needs Casts, and every reader of its fp16 outputs needs Casts (initializers and graph
  // inputs are simply cast). Nodes are visited in order and a forced node counts as needing
  // Casts for the nodes after it, as in ORT.
  for (size_t i = 0; i < n; ++i) {
    const Node& node = g.nodes[i];
    if (!assigned[i]) continue;
    bool has_input_edge = false, reads_half = false, inputs_casted = true;
    for (const auto& in : node.inputs) {
      if (in.empty()) continue;
      const auto p = producers.find(in);
      if (p != producers.end()) has_input_edge = true;
      if (!half(in)) continue;
      reads_half = true;
      if (p != producers.end() && !needs_cast[p->second]) inputs_casted = false;
    }
    bool feeds_output = false, has_half_output = false, outputs_casted = true;
    for (const auto& out : node.outputs) {
      if (out.empty()) continue;
      if (outputs.count(out)) feeds_output = true;
      if (!half(out)) continue;
      has_half_output = true;
      const auto c = consumers.find(out);
      if (c == consumers.end()) continue;
      for (size_t r : c->second) {
        if (!needs_cast[r]) outputs_casted = false;
      }
    }
    if (has_input_edge && !feeds_output && reads_half && inputs_casted && has_half_output &&
        outputs_casted) {
      assigned[i] = false;
      needs_cast[i] = true;
    }
  }
  std::unordered_map<std::string, OrtDecision> out;
  for (size_t i = 0; i < n; ++i) {
    const Node& node = g.nodes[i];
    if (node.outputs.empty()) continue;
    OrtDecision d;
    d.wide = needs_cast[i];
    // A model Cast between f32 and 16 bits next to a Cast that ORT inserted: the pair is
    // removed (both are of the float type group), so no rounding happens there. Cast(f32 ->
    // 16 bits): the Casts inserted before the f32-computing readers of its output cancel it,
    // those readers see the f32 input (other readers and a graph output still get it rounded).
    // Cast(16 bits -> f32) of a value an f32-computing node made: it cancels the Cast inserted
    // after that node, unless its output is a graph output.
    if (in_default_domain(node) && node.op_type == "Cast" && node.inputs.size() == 1) {
      const auto src = dtype.find(node.inputs[0]);
      const auto dst = dtype.find(node.outputs[0]);
      if (src != dtype.end() && dst != dtype.end()) {
        if (src->second == DType::F32 && ops::is_half(dst->second)) d.wide = d.fold = true;
        const auto p = producers.find(node.inputs[0]);
        if (ops::is_half(src->second) && dst->second == DType::F32 && p != producers.end() &&
            needs_cast[p->second] && !outputs.count(node.outputs[0])) {
          d.wide = d.fold = true;
        }
      }
    }
    out.emplace(node.outputs[0], d);
  }
  return out;
}

}  // namespace

std::optional<HalfCompute> parse_half_compute(std::string_view text) {
  if (text == "auto") return HalfCompute::Auto;
  if (text == "ort") return HalfCompute::Ort;
  if (text == "per-op") return HalfCompute::PerOp;
  return std::nullopt;
}

// NOLINTNEXTLINE(modernize-pass-by-value): callers keep their graph; the copy is shallow.
Executor::Executor(const Graph& graph, ExecutorOptions options) : graph_(graph) {
  if (options.device == Device::Cuda) {
    resolve_device(Device::Cuda);  // Unsupported, saying why, without a device
    device_ = std::make_shared<DeviceRuntime>();
  }
  threads_ = options.threads > 0 ? options.threads : std::max(1, omp_get_max_threads());
  graph_.check();
  half_compute_ = options.half_compute;
  if (half_compute_ == HalfCompute::Auto) {
    half_compute_ = options.device == Device::Cuda ? HalfCompute::PerOp : HalfCompute::Ort;
  }
  // Ort: decided on the graph as written (what ORT sees), before the int4 fusion rewrites it.
  std::unordered_map<std::string, DType> dtypes;
  std::unordered_map<std::string, OrtDecision> ort;
  if (half_compute_ == HalfCompute::Ort) {
    dtypes = declared_dtypes(graph_);
    ort = ort_decisions(graph_, dtypes);
  }
  if (options.fuse_int4) fuse_int4_matmuls(graph_);

  auto plan = std::make_shared<Plan>();
  std::unordered_map<std::string, int> slot_of;
  auto slot = [&](const std::string& name) {
    const auto [it, added] = slot_of.emplace(name, static_cast<int>(plan->names.size()));
    if (added) plan->names.push_back(name);
    return it->second;
  };
  for (const auto& [name, tensor] : graph_.initializers()) {
    plan->constants.emplace_back(slot(name), tensor);
  }
  for (const auto& in : graph_.inputs) plan->input_slots.push_back(slot(in.name));

  // Every op is looked up now, so an unsupported one is reported before anything runs.
  for (size_t i = 0; i < graph_.nodes.size(); ++i) {
    const Node& node = graph_.nodes[i];
    Plan::Step step;
    step.fn = ops::find_op(node.domain, node.op_type);
    step.opset = opset_of(graph_, node.domain);
    if (step.fn == nullptr) {
      ops::OpContext ctx(node, i, step.opset, 1);
      fail_unsupported(ctx.label() + " is not supported by the qforge runtime");
    }
    for (const auto& in : node.inputs) step.inputs.push_back(in.empty() ? -1 : slot(in));
    for (const auto& out : node.outputs) step.outputs.push_back(out.empty() ? -1 : slot(out));
    step.device = device_ != nullptr && DeviceRuntime::has_device_op(node);
    if (!node.outputs.empty()) {
      const auto it = ort.find(node.outputs[0]);
      if (it != ort.end()) {
        step.wide = it->second.wide;
        step.fold_cast = it->second.fold;
      }
    }
    if (step.wide) step.device = false;
    step.narrow.assign(step.outputs.size(), DType::F32);
    step.rounded_copy.assign(step.outputs.size(), -1);
    plan->steps.push_back(std::move(step));
  }
  for (const auto& out : graph_.outputs) plan->output_slots.push_back(slot(out.name));

  // Ort: a 16-bit value made by a wide step is f32 in its slot. Readers that are not wide,
  // and a graph output, need it rounded: in the slot itself when no wide step reads it,
  // otherwise in a second slot beside it.
  if (half_compute_ == HalfCompute::Ort) {
    std::vector<std::vector<std::pair<size_t, size_t>>> readers(plan->names.size());
    for (size_t i = 0; i < plan->steps.size(); ++i) {
      const auto& ins = plan->steps[i].inputs;
      for (size_t k = 0; k < ins.size(); ++k) {
        if (ins[k] >= 0) readers[static_cast<size_t>(ins[k])].emplace_back(i, k);
      }
    }
    std::vector<size_t> output_index(plan->names.size(), SIZE_MAX);
    for (size_t o = 0; o < plan->output_slots.size(); ++o) {
      output_index[static_cast<size_t>(plan->output_slots[o])] = o;
    }
    for (size_t i = 0; i < plan->steps.size(); ++i) {
      Plan::Step& step = plan->steps[i];
      if (!step.wide) continue;
      for (size_t k = 0; k < step.outputs.size(); ++k) {
        const int s = step.outputs[k];
        if (s < 0) continue;
        const auto d = dtypes.find(plan->names[static_cast<size_t>(s)]);
        if (d == dtypes.end() || !ops::is_half(d->second)) continue;
        const auto& rs = readers[static_cast<size_t>(s)];
        const bool is_output = output_index[static_cast<size_t>(s)] != SIZE_MAX;
        const bool wide_reader = std::any_of(rs.begin(), rs.end(), [&](const auto& r) {
          return plan->steps[r.first].wide;
        });
        const bool half_reader = is_output || std::any_of(rs.begin(), rs.end(), [&](const auto& r) {
          return !plan->steps[r.first].wide;
        });
        if (!wide_reader) {
          step.narrow[k] = d->second;
          continue;
        }
        plan->kept_f32.push_back(plan->names[static_cast<size_t>(s)]);
        if (!half_reader) continue;
        const int copy = slot(plan->names[static_cast<size_t>(s)] + "\x1f" + "rounded");
        step.rounded_copy[k] = copy;
        step.narrow[k] = d->second;  // the dtype of the copy
        for (const auto& [reader, input] : rs) {
          if (!plan->steps[reader].wide) plan->steps[reader].inputs[input] = copy;
        }
        if (is_output) plan->output_slots[output_index[static_cast<size_t>(s)]] = copy;
      }
    }
    std::sort(plan->kept_f32.begin(), plan->kept_f32.end());
  }
  plan->constant.assign(plan->names.size(), false);
  for (const auto& [s, t] : plan->constants) plan->constant[static_cast<size_t>(s)] = true;

  // Last use of each slot; graph outputs are never released.
  std::vector<int> last_use(plan->names.size(), -1);
  for (size_t i = 0; i < plan->steps.size(); ++i) {
    for (int s : plan->steps[i].inputs) {
      if (s >= 0) last_use[static_cast<size_t>(s)] = static_cast<int>(i);
    }
  }
  const std::unordered_set<int> kept(plan->output_slots.begin(), plan->output_slots.end());
  for (size_t i = 0; i < plan->steps.size(); ++i) {
    auto& step = plan->steps[i];
    std::unordered_set<int> listed;
    auto release = [&](int s) {
      if (s >= 0 && !kept.count(s) && listed.insert(s).second) step.release.push_back(s);
    };
    for (int s : step.inputs) {
      if (s >= 0 && last_use[static_cast<size_t>(s)] == static_cast<int>(i)) release(s);
    }
    for (int s : step.outputs) {  // produced but never read
      if (s >= 0 && last_use[static_cast<size_t>(s)] < 0) release(s);
    }
  }
  plan_ = std::move(plan);
}

std::vector<std::string> Executor::supported_ops() { return ops::registered_ops(); }

std::vector<std::string> Executor::values_kept_f32() const { return plan_->kept_f32; }

void Executor::bind_feeds(const std::vector<std::pair<std::string, Tensor>>& feeds,
                          std::vector<Tensor>& slots) const {
  std::unordered_map<std::string, size_t> input_index;
  for (size_t i = 0; i < graph_.inputs.size(); ++i) input_index.emplace(graph_.inputs[i].name, i);
  std::vector<bool> fed(graph_.inputs.size(), false);
  for (const auto& [name, tensor] : feeds) {
    const auto it = input_index.find(name);
    if (it == input_index.end()) fail_unknown_feed(name, graph_.inputs);
    if (fed[it->second]) fail_invalid(quoted_feed(name) + " is given twice");
    fed[it->second] = true;
    check_feed(graph_.inputs[it->second], tensor);
    slots[static_cast<size_t>(plan_->input_slots[it->second])] = tensor;
  }
  for (size_t i = 0; i < fed.size(); ++i) {
    if (!fed[i] && !graph_.has_initializer(graph_.inputs[i].name)) {
      fail_invalid("graph input '" + graph_.inputs[i].name + "' is not fed");
    }
  }
}

std::vector<Tensor> Executor::run(const std::vector<std::pair<std::string, Tensor>>& feeds) const {
  const Plan& plan = *plan_;
  std::vector<Tensor> slots(plan.names.size());
  for (const auto& [s, t] : plan.constants) slots[static_cast<size_t>(s)] = t;
  bind_feeds(feeds, slots);
  if (observer_) {
    for (const auto& [name, tensor] : feeds) observer_(name, tensor);
  }
  // Device::Cuda: device copies beside the host slots, moved only when the other side reads.
  std::optional<DeviceRuntime::Run> dev;
  if (device_) dev.emplace(*device_, slots, plan.constant);

  for (size_t i = 0; i < plan.steps.size(); ++i) {
    const Plan::Step& step = plan.steps[i];
    const Node& node = graph_.nodes[i];
    if (step.device && dev->run(node, step.inputs, step.outputs)) {
      if (observer_) observer_(node.outputs[0], dev->host(step.outputs[0]));
      for (int s : step.release) dev->release(s);
      continue;
    }
    ops::OpContext ctx(node, i, step.opset, threads_);
    ctx.inputs.resize(step.inputs.size(), nullptr);
    for (size_t k = 0; k < step.inputs.size(); ++k) {
      if (step.inputs[k] < 0) continue;
      const Tensor& t = dev ? dev->host(step.inputs[k]) : slots[static_cast<size_t>(step.inputs[k])];
      if (t.empty()) {
        fail_internal(ctx.label() + " reads '" + node.inputs[k] + "', which holds no tensor");
      }
      ctx.inputs[k] = &t;
    }
    ctx.outputs.resize(step.outputs.size());
    std::vector<Tensor> widened;
    if (step.wide) {
      widened.resize(ctx.inputs.size());
      for (size_t k = 0; k < ctx.inputs.size(); ++k) {
        if (ctx.inputs[k] == nullptr || !ops::is_half(ctx.inputs[k]->dtype())) continue;
        widened[k] = ops::to_f32(*ctx.inputs[k]);
        ctx.inputs[k] = &widened[k];
      }
    }
    if (step.fold_cast) {
      ctx.outputs[0] = ops::to_f32(ctx.input(0));
    } else {
      step.fn(ctx);
    }
    for (size_t k = 0; k < step.outputs.size(); ++k) {
      if (step.outputs[k] < 0) continue;
      if (ctx.outputs[k].empty()) {
        fail_internal(ctx.label() + " did not produce output '" + node.outputs[k] + "'");
      }
      Tensor& dst = slots[static_cast<size_t>(step.outputs[k])];
      dst = std::move(ctx.outputs[k]);
      const bool round = step.narrow[k] != DType::F32 && dst.dtype() == DType::F32;
      if (round && step.rounded_copy[k] >= 0) {
        slots[static_cast<size_t>(step.rounded_copy[k])] = ops::from_f32(dst, step.narrow[k]);
      } else if (round) {
        dst = ops::from_f32(dst, step.narrow[k]);
      }
      if (observer_) observer_(node.outputs[k], dst);
    }
    for (int s : step.release) {
      if (dev) dev->release(s);
      slots[static_cast<size_t>(s)] = Tensor();
    }
  }

  std::vector<Tensor> out;
  out.reserve(plan.output_slots.size());
  for (size_t i = 0; i < plan.output_slots.size(); ++i) {
    const int slot = plan.output_slots[i];
    const Tensor& t = dev ? dev->host(slot) : slots[static_cast<size_t>(slot)];
    if (t.empty()) fail_internal("graph output '" + graph_.outputs[i].name + "' was not computed");
    out.push_back(t);
  }
  return out;
}

}  // namespace qforge
