#include "ir/lora_adapter.h"

namespace qforge {

std::string_view lora_layer_kind_name(LoraLayerKind kind) {
  switch (kind) {
    case LoraLayerKind::Linear:
      return "linear";
    case LoraLayerKind::Conv:
      return "conv";
    case LoraLayerKind::Embedding:
      return "embedding";
  }
  return "?";
}

int64_t LoraModule::in_features() const {
  int64_t n = 1;
  for (size_t i = 1; i < a.rank(); ++i) n *= a.shape()[i];
  return n;
}

}  // namespace qforge
