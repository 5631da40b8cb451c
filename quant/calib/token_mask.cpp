#include "quant/calib/token_mask.h"

#include <algorithm>
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

int64_t TokenMask::used_length() const {
  int64_t used = 0;
  for (int64_t b = 0; b < batch_; ++b) used = std::max(used, used_length(b));
  return used;
}

int64_t TokenMask::used_length(int64_t b) const {
  for (int64_t s = seq_; s > 0; --s) {
    if (is_real(b, s - 1)) return s;
  }
  return 0;
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

std::vector<std::span<const float>> TokenMask::real_spans(const Tensor& value) const {
  if (!covers(value) || value.dtype() != DType::F32) {
    fail_internal("TokenMask::real_spans: value of shape " + shape_to_string(value.shape()) +
                  " is not f32 laid out [batch, seq, ...]");
  }
  const std::span<const float> all = value.data<float>();
  const size_t positions = static_cast<size_t>(batch_ * seq_);
  const size_t row = positions == 0 ? 0 : all.size() / positions;
  std::vector<std::span<const float>> spans;
  for (size_t p = 0; p < positions;) {
    if (keep_[p] == 0) {
      ++p;
      continue;
    }
    const size_t first = p;
    while (p < positions && keep_[p] != 0) ++p;
    spans.push_back(all.subspan(first * row, (p - first) * row));
  }
  return spans;
}

std::vector<SequenceAxis> sequence_axes(const std::vector<ValueInfo>& inputs,
                                        const std::string& mask_input) {
  const ValueInfo* mask = nullptr;
  for (const ValueInfo& v : inputs) {
    if (v.name == mask_input) mask = &v;
  }
  if (mask == nullptr || !mask->shape || mask->shape->size() != 2) return {};
  const Dim& seq = (*mask->shape)[1];
  if (seq.value || seq.param.empty()) return {};
  std::vector<SequenceAxis> axes;
  bool others = false;
  for (const ValueInfo& v : inputs) {
    if (!v.shape) continue;
    int found = 0;
    for (size_t a = 0; a < v.shape->size(); ++a) {
      const Dim& d = (*v.shape)[a];
      if (d.value || d.param != seq.param) continue;
      if (++found > 1) return {};
      axes.push_back({v.name, a});
      others = others || v.name != mask_input;
    }
  }
  return others ? axes : std::vector<SequenceAxis>{};
}

int64_t cut_trailing_padding(BatchSource::Feeds& batch, std::span<const SequenceAxis> axes,
                             const TokenMask& mask) {
  const int64_t seq = mask.seq(), length = std::max<int64_t>(mask.used_length(), 1);
  if (length >= seq || axes.empty()) return 0;
  std::vector<std::pair<Tensor*, size_t>> cut;
  for (auto& [name, t] : batch) {
    bool named = false;
    for (const SequenceAxis& a : axes) {
      if (a.input != name) continue;
      if (a.axis >= t.rank() || t.shape()[a.axis] != seq || dtype_bits(t.dtype()) % 8 != 0) {
        return 0;
      }
      cut.emplace_back(&t, a.axis);
      named = true;
    }
    if (!named && mask.covers(t)) return 0;
  }
  for (auto [t, axis] : cut) {
    Shape shape = t->shape();
    const std::span<const int64_t> dims(shape);
    const auto outer = static_cast<int64_t>(shape_numel(dims.first(axis)));
    const size_t inner = shape_numel(dims.subspan(axis + 1)) *
                         static_cast<size_t>(dtype_bits(t->dtype()) / 8);
    shape[axis] = length;  // the feeds are small: a zero-filled tensor costs nothing here
    Tensor out(t->dtype(), shape);
    const std::byte* src = t->bytes().data();
    std::byte* dst = out.mutable_bytes().data();
    const size_t from = static_cast<size_t>(seq) * inner, to = static_cast<size_t>(length) * inner;
    for (int64_t o = 0; o < outer; ++o) {
      std::memcpy(dst + static_cast<size_t>(o) * to, src + static_cast<size_t>(o) * from, to);
    }
    *t = std::move(out);
  }
  return seq - length;
}

}  // namespace qforge
