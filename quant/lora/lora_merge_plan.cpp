#include "quant/lora/lora_merge_plan.h"

#include <algorithm>
#include <set>
#include <unordered_map>

#include "ir/error.h"
#include "ir/tied_weights.h"
#include "quant/lora/lora_math.h"
#include "quant/lora/weight_binding.h"

namespace qforge {

namespace {

bool mergeable_dtype(DType d) { return d == DType::F32 || d == DType::F16 || d == DType::BF16; }

// PEFT loads a saved layer ("<module>.base_layer.weight", "original_module") into the shared
// tensor, but a modules_to_save copy is a module of its own that its merge puts in place of the
// original, untying it from its aliases.
bool unties(const LoraReplacement& rep) {
  return rep.key.find(".base_layer.") == std::string::npos &&
         rep.key.find(".original_module.") == std::string::npos;
}

[[noreturn]] void fail_tied_replacement(const LoraReplacement& rep, const std::string& tied_to) {
  fail_unsupported("'" + rep.key + "' (modules_to_save) replaces '" + rep.target +
                   "', which is tied to " + tied_to +
                   "; PEFT's merge unties them, which this checkpoint cannot hold: untie the base "
                   "model (tie_word_embeddings=False, with an lm_head.weight of its own) and merge "
                   "into that");
}

std::string dims(int64_t a, int64_t b) {
  const int64_t d[2] = {a, b};
  return shape_to_string(d);
}

class Planner {
 public:
  Planner(const Graph& base, const LoraMergeOptions& options, PassReport& report)
      : base_(base),
        options_(options),
        report_(report),
        binder_(base, BindOptions{options.reference}) {}

  void add_module(const WeightedAdapter& wa, const LoraModule& m);
  void add_replacement(const WeightedAdapter& wa, const LoraReplacement& r);
  MergePlan take() { return std::move(plan_); }

 private:
  MergeTarget& target(const std::string& initializer) {
    auto [it, added] = index_.emplace(initializer, plan_.targets.size());
    if (added) plan_.targets.push_back({initializer, {}});
    return plan_.targets[it->second];
  }
  void unmatched(const LoraAdapter& a, const std::vector<std::string>& keys,
                 const std::string& why) {
    for (const auto& k : keys) plan_.unmatched.push_back(a.name + ": " + k);
    report_.warn("adapter '" + a.name + "': " + list_names(keys, 3) +
                 " land on no base weight: " + why);
  }
  const Tensor& checked_base(const std::string& label, const std::string& initializer) {
    const Tensor& w = *base_.find_initializer(initializer);
    if (!mergeable_dtype(w.dtype())) {
      fail_unsupported(label + ": base tensor '" + initializer + "' is " +
                       std::string(dtype_name(w.dtype())) +
                       "; LoRA merges into f32, f16 or bf16 weights (merge before quantizing)");
    }
    return w;
  }
  bool stored_transposed(const LoraAdapter& a, const LoraModule& m, const WeightBinding& b,
                         const Tensor& w, const std::string& label);

  const Graph& base_;
  const LoraMergeOptions& options_;
  PassReport& report_;
  WeightBinder binder_;
  MergePlan plan_;
  std::unordered_map<std::string, size_t> index_;
};

// Whether the stored weight is PEFT's canonical [out, in] transposed. The layout comes from the
// base weight's shape; the adapter's fan_in_fan_out decides only square weights.
bool Planner::stored_transposed(const LoraAdapter& a, const LoraModule& m, const WeightBinding& b,
                                const Tensor& w, const std::string& label) {
  const Shape& s = w.shape();
  const int64_t out = m.out_features();
  const int64_t in = m.in_features();
  const std::string where = label + ": base weight '" + b.initializer + "' " + shape_to_string(s);
  if (m.kind == LoraLayerKind::Conv) {
    const Shape& ka = m.a.shape();
    if (s.size() != ka.size() || b.transposed || s[0] != out ||
        !std::equal(s.begin() + 2, s.end(), ka.begin() + 2)) {
      fail_invalid(where + " does not fit lora_A " + shape_to_string(ka) + " and lora_B " +
                   shape_to_string(m.b.shape()) + "; the adapter was trained on another model");
    }
    if (s[1] != ka[1]) {
      if (s[1] > 0 && ka[1] % s[1] == 0) {
        fail_unsupported(where +
                         " is a grouped convolution (groups=" + std::to_string(ka[1] / s[1]) +
                         "); PEFT cannot merge LoRA into grouped convolutions either");
      }
      fail_invalid(where + " has " + std::to_string(s[1]) + " input channels, lora_A " +
                   std::to_string(ka[1]));
    }
    return false;
  }
  if (s.size() != 2) fail_invalid(where + " is not 2-D, but the adapter's factors are");
  const int64_t p0 = b.transposed ? s[1] : s[0];
  const int64_t p1 = b.transposed ? s[0] : s[1];
  const bool canonical = p0 == out && p1 == in;
  const bool flipped = p0 == in && p1 == out;
  if (m.kind == LoraLayerKind::Embedding) {
    if (!flipped) {
      fail_invalid(where + " is not [num_embeddings, embedding_dim] = " + dims(in, out) +
                   " as lora_embedding_A/B imply; the adapter was trained on another model");
    }
    return !b.transposed;
  }
  if (!canonical && !flipped) {
    fail_invalid(where + " fits neither " + dims(out, in) + " nor " + dims(in, out) +
                 " from lora_B @ lora_A; the adapter was trained on another model");
  }
  const bool flag = a.format == LoraFormat::Peft && a.config.fan_in_fan_out;
  const bool layout = (canonical && flipped) ? flag : flipped;
  if (a.format == LoraFormat::Peft && layout != flag) {
    const std::string msg =
        where + " is stored " +
        (layout ? "[in, out] (GPT-2 Conv1D layout)" : "[out, in] (nn.Linear layout)") +
        " but adapter_config.json has fan_in_fan_out=" + (flag ? "true" : "false") +
        "; fix fan_in_fan_out or let the weight's shape decide";
    if (!options_.fan_in_fan_out_from_shape) fail_invalid(msg);
    report_.warn(msg);
  }
  return layout != b.transposed;
}

void Planner::add_module(const WeightedAdapter& wa, const LoraModule& m) {
  const LoraAdapter& a = wa.adapter;
  const std::string label = "adapter '" + a.name + "', module '" + m.name + "'";
  std::vector<std::string> weight_keys;
  std::vector<std::string> bias_keys;
  for (const auto& k : m.keys) (k.ends_with(".bias") ? bias_keys : weight_keys).push_back(k);
  const BindResult r =
      a.format == LoraFormat::Kohya ? binder_.bind_flat(m.name) : binder_.bind(m.name + ".weight");
  if (!r.binding) {
    unmatched(a, m.keys, r.why_not);
    return;
  }
  const WeightBinding& b = *r.binding;
  const Tensor& w = checked_base(label, b.initializer);
  const bool t = stored_transposed(a, m, b, w, label);
  const auto scale = static_cast<float>(m.scaling * wa.weight);
  target(b.initializer).steps.push_back({&m, nullptr, false, t, scale});
  std::string bias_initializer;
  if (!m.bias.empty()) {
    const int64_t out = m.out_features();
    const BindResult rb = binder_.bind(m.name + ".bias", std::span<const int64_t>(&out, 1));
    if (!rb.binding) {
      unmatched(a, bias_keys,
                "the base layer has no bias (PEFT cannot merge lora_bias into it either)");
    } else {
      bias_initializer = rb.binding->initializer;
      checked_base(label, bias_initializer);
      target(bias_initializer).steps.push_back({&m, nullptr, true, false, scale});
    }
  }
  plan_.rows.push_back({{"adapter", a.name},
                        {"module", m.name},
                        {"initializer", b.initializer},
                        {"match", bind_kind_name(b.kind)},
                        {"kind", lora_layer_kind_name(m.kind)},
                        {"layout", t != b.transposed ? "in,out" : "out,in"},
                        {"r", m.r},
                        {"r_from", m.r_from},
                        {"alpha", m.alpha},
                        {"alpha_from", m.alpha_from},
                        {"scaling", m.scaling},
                        {"weight", wa.weight},
                        {"dora", !m.magnitude.empty()},
                        {"bias", bias_initializer}});
}

void Planner::add_replacement(const WeightedAdapter& wa, const LoraReplacement& rep) {
  const LoraAdapter& a = wa.adapter;
  const BindResult r = binder_.bind(rep.target, std::span<const int64_t>(rep.tensor.shape()));
  if (!r.binding) {
    unmatched(a, {rep.key}, r.why_not);
    return;
  }
  const WeightBinding& b = *r.binding;
  const Tensor& w = *base_.find_initializer(b.initializer);
  if (w.dtype() != rep.tensor.dtype() &&
      !(mergeable_dtype(w.dtype()) && dtype_is_float(rep.tensor.dtype()))) {
    fail_unsupported("adapter '" + a.name + "': '" + rep.key + "' is " +
                     std::string(dtype_name(rep.tensor.dtype())) + " but base tensor '" +
                     b.initializer + "' is " + std::string(dtype_name(w.dtype())));
  }
  if (b.kind == BindKind::Tied && unties(rep)) {
    fail_tied_replacement(rep, "'" + b.initializer + "' (tie_word_embeddings)");
  }
  MergeTarget& tgt = target(b.initializer);
  for (const auto& step : tgt.steps) {
    if (step.replacement != nullptr)
      report_.warn("'" + b.initializer + "' is replaced by several adapters; the last wins");
  }
  tgt.steps.push_back({nullptr, &rep, false, b.transposed, 1.0f});
  plan_.rows.push_back({{"adapter", a.name},
                        {"replaces", b.initializer},
                        {"key", rep.key},
                        {"match", bind_kind_name(b.kind)}});
}

}  // namespace

namespace {

// An ONNX initializer read by nodes of several modules changes for all of them: right for tied
// weights, wrong where the exporter merged weights that merely had equal values.
void warn_shared_initializers(const Graph& base, const MergePlan& plan, PassReport& report) {
  if (base.nodes.empty()) return;
  const auto consumers = base.consumers();
  for (const auto& target : plan.targets) {
    const auto it = consumers.find(target.initializer);
    if (it == consumers.end() || it->second.size() < 2) continue;
    std::set<std::string> scopes;
    for (size_t i : it->second) {
      const std::string& node = base.nodes[i].name;
      std::string scope = node.empty() ? std::string("#") : node.substr(0, node.rfind('/'));
      if (node.empty()) scope += std::to_string(i);  // unnamed nodes count apart
      scopes.insert(std::move(scope));
    }
    if (scopes.size() < 2) continue;
    report.warn("initializer '" + target.initializer + "' feeds " +
                std::to_string(it->second.size()) + " nodes in " + std::to_string(scopes.size()) +
                " modules (" + list_names({scopes.begin(), scopes.end()}, 3) +
                "); the merge changes it for all of them. If the exporter merged equal weights, "
                "re-export the model with distinct weights");
  }
}

}  // namespace

namespace {

bool windows_overlap(const Tensor& a, const Tensor& b) {
  return a.storage() == b.storage() && a.offset() < b.offset() + b.nbytes() &&
         b.offset() < a.offset() + a.nbytes();
}

bool same_window(const Tensor& a, const Tensor& b) {
  return a.storage() == b.storage() && a.offset() == b.offset() && a.dtype() == b.dtype() &&
         a.shape() == b.shape();
}

// An exporter's transposed copy of a tied embedding: same dtype, transposed shape.
bool transposed_shape(const Tensor& t, const Tensor& u) {
  return t.rank() == 2 && u.rank() == 2 && u.dtype() == t.dtype() && dtype_is_float(t.dtype()) &&
         u.shape()[0] == t.shape()[1] && u.shape()[1] == t.shape()[0];
}

std::vector<TiedCopy> find_aliases(const Graph& base, const std::string& name) {
  const Tensor& t = *base.find_initializer(name);
  std::vector<TiedCopy> out;
  // In a graph, an initializer holding exactly the transpose. Small or constant tensors may be
  // equal by chance and are never taken for copies.
  constexpr uint64_t kMinElements = 16;
  std::vector<float> transposed;  // computed once a candidate shows up
  bool constant = false;
  for (const auto& [other, u] : base.initializers()) {
    if (other == name) continue;
    if (t.storage() != nullptr && windows_overlap(t, u)) {
      if (!same_window(t, u)) {
        fail_unsupported("LoRA merge into '" + name + "': its storage overlaps that of '" + other +
                         "' (a view of another shape or offset), so merging would untie them; "
                         "re-save the checkpoint with each tensor in storage of its own");
      }
      out.push_back({other, false, "shared storage"});
      continue;
    }
    if (base.nodes.empty() || t.numel() < kMinElements || !transposed_shape(t, u)) continue;
    if (transposed.empty()) {
      transposed = transpose_2d(t.to_f32(), t.shape()[0], t.shape()[1]);
      constant = std::all_of(transposed.begin(), transposed.end(),
                             [&](float v) { return v == transposed.front(); });
    }
    if (!constant && u.to_f32() == transposed) out.push_back({other, true, "transposed copy"});
  }
  for (const TiedWeight& tie : tied_weights(base)) {
    const std::string* alias = tie.source == name   ? &tie.alias
                               : tie.alias == name ? &tie.source
                                                   : nullptr;
    if (alias == nullptr) continue;
    const Tensor* u = base.find_initializer(*alias);
    if (u == nullptr || u->shape() != t.shape() || u->dtype() != t.dtype()) continue;
    const bool seen = std::any_of(out.begin(), out.end(),
                                  [&](const TiedCopy& c) { return c.initializer == *alias; });
    if (!seen) out.push_back({*alias, false, "tie_word_embeddings"});
  }
  return out;
}

// Folds targets that are aliases of one weight into one, so that every adapter's steps apply to
// the one tensor (in the first target's orientation) and the result reaches every alias.
void tie_targets(const Graph& base, MergePlan& plan, PassReport& report) {
  std::unordered_map<std::string, size_t> index;
  for (size_t i = 0; i < plan.targets.size(); ++i) index.emplace(plan.targets[i].initializer, i);
  std::vector<char> absorbed(plan.targets.size(), 0);
  auto rows = nlohmann::ordered_json::array();
  for (size_t i = 0; i < plan.targets.size(); ++i) {
    if (absorbed[i]) continue;
    std::vector<TiedCopy> copies = find_aliases(base, plan.targets[i].initializer);
    for (const TiedCopy& c : copies) {
      const auto it = index.find(c.initializer);
      if (it != index.end() && it->second != i && !absorbed[it->second]) {
        for (MergeStep step : plan.targets[it->second].steps) {
          step.transposed = step.transposed != c.transposed;
          plan.targets[i].steps.push_back(step);
        }
        absorbed[it->second] = 1;
      }
      rows.push_back({{"initializer", plan.targets[i].initializer},
                      {"alias", c.initializer},
                      {"how", c.how},
                      {"transposed", c.transposed}});
    }
    MergeTarget& target = plan.targets[i];
    if (copies.empty()) continue;
    // PEFT loads saved layers into the base before it merges any adapter.
    std::stable_partition(target.steps.begin(), target.steps.end(),
                          [](const MergeStep& s) { return s.replacement != nullptr; });
    for (const MergeStep& step : target.steps) {
      if (step.replacement != nullptr && unties(*step.replacement)) {
        fail_tied_replacement(*step.replacement, "'" + copies.front().initializer + "' (" +
                                                     copies.front().how + ")");
      }
    }
    target.tied = std::move(copies);
  }
  for (size_t i = plan.targets.size(); i-- > 0;) {
    if (absorbed[i]) plan.targets.erase(plan.targets.begin() + static_cast<std::ptrdiff_t>(i));
  }
  if (!rows.empty()) {
    report.count("tied_copies", static_cast<int64_t>(rows.size()));
    report.stats["tied"] = std::move(rows);
  }
}

}  // namespace

MergePlan plan_lora_merge(const Graph& base, const std::vector<WeightedAdapter>& adapters,
                          const LoraMergeOptions& options, PassReport& report) {
  Planner planner(base, options, report);
  for (const auto& wa : adapters) {
    for (const auto& rep : wa.adapter.replacements) planner.add_replacement(wa, rep);
    for (const auto& m : wa.adapter.modules) planner.add_module(wa, m);
  }
  MergePlan plan = planner.take();
  tie_targets(base, plan, report);
  warn_shared_initializers(base, plan, report);
  return plan;
}

}  // namespace qforge
