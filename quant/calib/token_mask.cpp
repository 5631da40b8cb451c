#include "quant/calib/token_mask.h"

#include <cstring>

#include "ir/error.h"

namespace qforge {

std::string resolve_mask_input(const Graph& graph, std::string_view requested) {
  const auto is_input = [&graph](std::string_view name) {
    for (const ValueInfo& v : graph.inputs) {
      if (v.name == name && !graph.has_initializer(v.name)) return true;
    }
    return false;
  };
  if (requested == kMaskNone) return "";
  if (requested == kMaskAuto || requested.empty()) {
    return is_input(kDefaultMaskInput) ? std::string(kDefaultMaskInput) : std::string();
  }
  if (!is_input(requested)) {
    std::string names;
    for (const ValueInfo& v : graph.inputs) {
      if (graph.has_initializer(v.name)) continue;
      names += (names.empty() ? "" : ", ") + v.name;
    }
    fail_usage("--calib-mask '" + std::string(requested) + "' is not an input of the model (" +
               names + "); name the attention-mask input, or give 'none'");
  }
  return std::string(requested);
}

TokenMask::TokenMask(const BatchSource::Feeds& feeds, const std::string& name) {
  const Tensor* mask = nullptr;
  for (const auto& [n, t] : feeds) {
    if (n == name) mask = &t;
  }
  if (mask == nullptr) fail_invalid("the batch has no mask input '" + name + "'");
  if (mask->rank() != 2) {
    fail_invalid("mask input '" + name + "' has shape " + shape_to_string(mask->shape()) +
                 "; a token mask is [batch, seq]");
  }
  batch_ = mask->shape()[0];
  seq_ = mask->shape()[1];
  const std::vector<float> values = mask->to_f32();
  keep_.resize(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    keep_[i] = values[i] != 0.0f ? 1 : 0;
    real_ += keep_[i];
  }
}

bool TokenMask::covers(const Tensor& value) const {
  return value.rank() >= 2 && value.shape()[0] == batch_ && value.shape()[1] == seq_;
}

Tensor TokenMask::real_rows(const Tensor& value) const {
  std::shared_ptr<OwnedStorage> fresh;
  return real_rows(value, fresh);
}

Tensor TokenMask::real_rows(const Tensor& value, std::shared_ptr<OwnedStorage>& scratch) const {
  if (!covers(value) || dtype_bits(value.dtype()) % 8 != 0) {
    fail_internal("TokenMask::real_rows: value of shape " + shape_to_string(value.shape()) +
                  " is not laid out [batch, seq, ...] of whole bytes");
  }
  Shape shape(value.shape().begin() + 1, value.shape().end());
  shape[0] = real_;
  const size_t positions = static_cast<size_t>(batch_ * seq_);
  const size_t row_bytes = positions == 0 ? 0 : value.nbytes() / positions;
  const size_t bytes = row_bytes * static_cast<size_t>(real_);
  if (!scratch || scratch.use_count() != 1 || scratch->bytes().size() < bytes) {
    scratch = std::make_shared<OwnedStorage>(bytes);
  }
  const std::byte* src = value.bytes().data();
  std::byte* dst = scratch->mutable_bytes().data();
  for (size_t p = 0; p < positions; ++p) {
    if (keep_[p] == 0) continue;
    std::memcpy(dst, src + p * row_bytes, row_bytes);
    dst += row_bytes;
  }
  return Tensor(value.dtype(), std::move(shape), scratch, 0);
}

}  // namespace qforge
