#include "quant/lora/lora_merge.h"

#include <algorithm>
#include <cstring>

#include "ir/error.h"
#include "quant/lora/lora_math.h"
#include "quant/lora/lora_merge_plan.h"
#include "quant/lora/weight_binding.h"

namespace qforge {

namespace {

// The target's fp32 working copy: for an f32 initializer, the buffer of the tensor that will
// replace it (no final copy); otherwise a widened copy, rounded once at the end.
struct WorkingCopy {
  Tensor out;
  std::vector<float> widened;
  std::span<float> values;
};

WorkingCopy working_copy(const Tensor& init) {
  WorkingCopy w;
  if (init.dtype() == DType::F32) {
    w.out = Tensor(DType::F32, init.shape());
    std::memcpy(w.out.mutable_bytes().data(), init.bytes().data(), init.nbytes());
    w.values = w.out.mutable_data<float>();
  } else {
    w.widened = init.to_f32();
    w.values = w.widened;
  }
  return w;
}

// Applies a target's steps in fp32 and rounds once to the initializer's dtype. `delta` is
// scratch space shared across targets.
Tensor apply_steps(const MergeTarget& target, const Tensor& init, std::vector<float>& delta,
                   Device device) {
  WorkingCopy work = working_copy(init);
  std::span<float> w = work.values;
  const bool any_dora =
      std::any_of(target.steps.begin(), target.steps.end(), [](const MergeStep& s) {
        return s.module != nullptr && !s.bias && !s.module->magnitude.empty();
      });
  std::vector<float> w0;  // the weight before any adapter: DoRA's norm is taken on it
  if (any_dora) w0.assign(w.begin(), w.end());
  for (const MergeStep& step : target.steps) {
    if (step.replacement != nullptr) {
      const Tensor& t = step.replacement->tensor;
      const std::vector<float> v =
          step.transposed ? transpose_2d(t.to_f32(), t.shape()[0], t.shape()[1]) : t.to_f32();
      std::copy(v.begin(), v.end(), w.begin());
      continue;
    }
    const LoraModule& m = *step.module;
    if (step.bias) {
      add_scaled(w, m.bias.to_f32(), step.scale);
      continue;
    }
    const int64_t out = m.out_features();
    const int64_t in = m.in_features();
    if (delta.size() < static_cast<size_t>(out * in)) delta.resize(static_cast<size_t>(out * in));
    const std::span<float> d(delta.data(), static_cast<size_t>(out * in));
    lora_delta(m.a.to_f32(), m.b.to_f32(), out, in, m.r, step.scale, step.transposed, d, device);
    if (m.magnitude.empty()) {
      add_scaled(w, d);
    } else {
      dora_merge(w0, w, d, m.magnitude.to_f32(), out, in, step.transposed);
    }
  }
  if (!work.out.empty()) return std::move(work.out);
  return Tensor::from_f32(work.widened, init.shape(), init.dtype());
}

class LoraMergePass final : public Pass {
 public:
  LoraMergePass(std::vector<WeightedAdapter> adapters, LoraMergeOptions options)
      : adapters_(std::move(adapters)), options_(options) {}
  std::string_view name() const override { return "lora-merge"; }
  void run(Graph& graph, PassReport& report) override {
    merge_lora(graph, adapters_, options_, report);
  }

 private:
  std::vector<WeightedAdapter> adapters_;
  LoraMergeOptions options_;
};

}  // namespace

void merge_lora(Graph& base, const std::vector<WeightedAdapter>& adapters,
                const LoraMergeOptions& options, PassReport& report) {
  MergePlan plan = plan_lora_merge(base, adapters, options, report);
  if (!plan.unmatched.empty() && !options.allow_unmatched) {
    fail_invalid(
        std::to_string(plan.unmatched.size()) +
        " adapter tensors land on no base weight: " + list_names(plan.unmatched) +
        "; check that the adapter was trained on this base model, or allow unmatched keys (--allow-unmatched)");
  }
  std::vector<Tensor> results;
  results.reserve(plan.targets.size());
  std::vector<float> delta;
  for (const MergeTarget& target : plan.targets) {
    results.push_back(
        apply_steps(target, *base.find_initializer(target.initializer), delta, options.device));
  }
  for (size_t i = 0; i < plan.targets.size(); ++i) {
    base.set_initializer(plan.targets[i].initializer, std::move(results[i]));
  }
  int64_t modules = 0;
  int64_t dora = 0;
  int64_t replaced = 0;
  for (const auto& row : plan.rows) {
    if (row.contains("module")) {
      ++modules;
      dora += row["dora"].get<bool>() ? 1 : 0;
    } else {
      ++replaced;
    }
  }
  report.count("adapters", static_cast<int64_t>(adapters.size()));
  report.count("modules_merged", modules);
  report.count("dora_modules", dora);
  report.count("tensors_replaced", replaced);
  report.count("tensors_written", static_cast<int64_t>(plan.targets.size()));
  report.count("unmatched_keys", static_cast<int64_t>(plan.unmatched.size()));
  report.stats["modules"] = std::move(plan.rows);
}

std::unique_ptr<Pass> make_lora_merge_pass(std::vector<WeightedAdapter> adapters,
                                           LoraMergeOptions options) {
  return std::make_unique<LoraMergePass>(std::move(adapters), options);
}

}  // namespace qforge
