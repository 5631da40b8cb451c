#include "runtime/executor.h"

#include <omp.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <algorithm>
#include <climits>
#include <cstdint>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "ir/error.h"
#include "runtime/cuda/device_runtime.h"
#include "runtime/half_compute.h"
#include "runtime/int4_fusion.h"
#include "runtime/op_fusion.h"
#include "runtime/op_registry.h"
#include "runtime/op_utils.h"
#include "runtime/ops/conv.h"
#include "runtime/ops/matmul.h"

namespace qforge {

struct Executor::Plan {
  struct Step {
    ops::OpFn fn = nullptr;
    int64_t opset = 0;
    std::vector<int> inputs;   // slot ids, -1 for absent optional inputs
    std::vector<int> outputs;  // slot ids, -1 for absent optional outputs
    std::vector<int> release;  // slots to drop once this step has run
    // Per input: this step is the value's last reader, and it is neither a constant nor a
    // graph output nor read twice by the step (OpContext::consumed).
    std::vector<bool> last_read;
    bool device = false;       // tried on the CUDA device first (Device::Cuda)
    // HalfCompute::Ort: f16/bf16 inputs are widened to f32 first, so the op computes and
    // returns f32; `fold_cast` (a model Cast ORT removes) then just passes the f32 value on.
    bool wide = false;
    bool fold_cast = false;
    // Per output: the 16-bit type its f32 result is rounded to in its slot (F32: kept as is),
    // and a second slot (-1: none) that receives a rounded copy while the slot keeps f32.
    std::vector<DType> narrow;
    std::vector<int> rounded_copy;
    // MatMul/Gemm (as B) and Conv (as A): the constant weight packed once
    // (ExecutorOptions::pack_weights).
    std::shared_ptr<const PackedMatrix> packed_weight;
    std::shared_ptr<const PackedRows> packed_rows;
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

// A run's intermediate tensors come and go in the same sizes run after run (and batch after
// batch of a calibration). glibc serves a block above its mmap threshold (adjusted as blocks are
// freed, but never above 32 MiB) with a fresh mapping, and gives the top of its heap back once
// more than twice that is free: such a tensor then costs a page fault and the kernel's zeroing
// per 4 KiB page, on every run. That was 8-20% of a decoder layer's, ResNet-50's and the sample
// CNN's time (an attention score tensor of 32 heads x 512 x 512 is 33.5 MB). Once per process,
// the first executor raises the threshold to 1 GiB and the heap's trim threshold to 2 GiB, so
// freed buffers stay in the heap and later tensors reuse them: the peak is still what the live
// tensors need (plus what fragmentation keeps), and the memory goes back when the process ends.
// Without glibc this does nothing.
void keep_freed_buffers_for_reuse() {
#if defined(__GLIBC__)
  static std::once_flag once;
  std::call_once(once, [] {
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, INT32_MAX);
  });
#endif
}

int64_t opset_of(const Graph& g, const std::string& domain) {
  const std::string d = domain == "ai.onnx" ? "" : domain;
  int64_t v = g.opset(d);
  if (v == 0 && d.empty()) v = g.opset("ai.onnx");
  if (v == 0 && d.empty()) v = Executor::kDefaultOpset;
  return v;
}

}  // namespace

// NOLINTNEXTLINE(modernize-pass-by-value): callers keep their graph; the copy is shallow.
Executor::Executor(const Graph& graph, ExecutorOptions options) : graph_(graph) {
  keep_freed_buffers_for_reuse();
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
  std::unordered_map<std::string, OrtHalfDecision> ort;
  if (half_compute_ == HalfCompute::Ort) {
    dtypes = declared_value_dtypes(graph_);
    ort = ort_half_decisions(graph_, dtypes);
  }
  if (options.fuse_int4) fuse_int4_matmuls(graph_);
  if (options.fuse_ops) fuse_float_ops(graph_, {.attention = options.device != Device::Cuda});

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

  // An initializer that is also a graph input is only a default: a feed may replace it.
  std::unordered_set<std::string> fed_by_input;
  for (const auto& in : graph_.inputs) fed_by_input.insert(in.name);

  struct PackJob {
    size_t step;
    const Tensor* weight;
  };
  std::vector<PackJob> packed;  // the constant weights to pack, once every step is planned
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
    if (options.pack_weights && !step.device && node.inputs.size() > 1) {
      const Tensor* w = graph_.find_initializer(node.inputs[1]);
      if (w != nullptr && !fed_by_input.count(node.inputs[1])) packed.push_back({i, w});
    }
    step.narrow.assign(step.outputs.size(), DType::F32);
    step.rounded_copy.assign(step.outputs.size(), -1);
    plan->steps.push_back(std::move(step));
  }
  // Each constant weight packed by one task (a pure rearrangement: the same bytes whatever
  // the thread count), the weights shared out between the threads.
  run_tasks(threads_, static_cast<int64_t>(packed.size()), [&](int64_t p, int) {
    const auto [i, w] = packed[static_cast<size_t>(p)];
    Plan::Step& step = plan->steps[i];
    const ops::OpContext ctx(graph_.nodes[i], i, step.opset, 1);
    step.packed_weight = ops::pack_constant_weight(ctx, *w);
    step.packed_rows = ops::pack_conv_weight(ctx, *w);
  });
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
    step.last_read.assign(step.inputs.size(), false);
    for (size_t k = 0; k < step.inputs.size(); ++k) {
      const int s = step.inputs[k];
      step.last_read[k] =
          s >= 0 && last_use[static_cast<size_t>(s)] == static_cast<int>(i) && !kept.count(s) &&
          !plan->constant[static_cast<size_t>(s)] &&
          std::count(step.inputs.begin(), step.inputs.end(), s) == 1 &&
          std::count(step.outputs.begin(), step.outputs.end(), s) == 0;
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

std::vector<Tensor> Executor::run(const std::vector<std::pair<std::string, Tensor>>& feeds,
                                  RunCounts* counts) const {
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
  RunCounts ran;

  for (size_t i = 0; i < plan.steps.size(); ++i) {
    const Plan::Step& step = plan.steps[i];
    const Node& node = graph_.nodes[i];
    if (step.device && dev->run(node, step.inputs, step.outputs)) {
      ++ran.device_ops;
      if (observer_) observer_(node.outputs[0], dev->host(step.outputs[0]));
      for (int s : step.release) dev->release(s);
      continue;
    }
    ++ran.cpu_ops;
    ops::OpContext ctx(node, i, step.opset, threads_);
    ctx.packed_weight = step.packed_weight.get();
    ctx.packed_rows = step.packed_rows.get();
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
    if (!dev && !step.wide) {
      ctx.consumed.assign(step.inputs.size(), nullptr);
      for (size_t k = 0; k < step.inputs.size(); ++k) {
        if (step.last_read[k]) ctx.consumed[k] = &slots[static_cast<size_t>(step.inputs[k])];
      }
    }
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
  if (counts != nullptr) {
    if (dev) {
      ran.uploads = dev->uploads();
      ran.downloads = dev->downloads();
    }
    *counts = ran;
  }
  return out;
}

}  // namespace qforge
