#pragma once
// Merges LoRA adapters into base weights exactly as PEFT's merge_and_unload() does:
//   Linear     W += scaling * B @ A            (transposed for fan_in_fan_out / GPT-2 Conv1D)
//   Conv       W += scaling * B @ A            (kernels flattened; grouped conv refused, as PEFT)
//   Embedding  W += scaling * (B @ A)^T
//   DoRA       W  = m / ||W0 + delta||_row * (W + delta), norm per output feature
//   lora_bias  b += scaling * lora_B.bias
//   modules_to_save and other whole tensors replace the base's.
// Several adapters apply in order, each adapter's scaling multiplied by its weight (PEFT's
// scaling * weight, as set_scale does). Arithmetic is fp32; each changed tensor is rounded once
// to its own dtype. Works on weights-only graphs (state dicts) and on ONNX graphs, where the
// base weights are found through WeightBinder (names, node scopes, content). Tied weights
// (lora_merge_plan.h) receive the merge as one tensor, as PEFT merges into the shared one.
#include <memory>
#include <vector>

#include "ir/lora_adapter.h"
#include "ir/graph.h"
#include "ir/pass.h"
#include "kernels/device.h"

namespace qforge {

struct WeightedAdapter {
  LoraAdapter adapter;
  double weight = 1.0;
};

struct LoraMergeOptions {
  // The PyTorch state dict an ONNX base was exported from, to find its anonymous weights by
  // content. Not owned; must outlive the merge.
  const Graph* reference = nullptr;
  // Adapter tensors that land on no base weight become warnings instead of an error.
  bool allow_unmatched = false;
  // When the base weight's shape says the layout is [in, out] (or [out, in]) and the adapter's
  // fan_in_fan_out says otherwise, follow the shape with a warning instead of failing.
  bool fan_in_fan_out_from_shape = false;
  // Where the B.A products run (quant/lora_math.h: Cuda is one fp32 cuBLAS GEMM each).
  Device device = Device::Cpu;
};

// Nothing in `base` changes unless every check passes. Throws InvalidInput (unmatched adapter
// keys, listed; shapes that disagree; fan_in_fan_out contradicting the weight's layout),
// Unsupported (grouped conv, base dtypes other than f32/f16/bf16). Reports one row per module
// (adapter, module, initializer, match, r, alpha, scaling, weight, dora, bias) and per
// replaced tensor.
void merge_lora(Graph& base, const std::vector<WeightedAdapter>& adapters,
                const LoraMergeOptions& options, PassReport& report);

std::unique_ptr<Pass> make_lora_merge_pass(std::vector<WeightedAdapter> adapters,
                                           LoraMergeOptions options);

}  // namespace qforge
