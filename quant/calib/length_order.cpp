#include "quant/calib/length_order.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "ir/error.h"
#include "quant/calib/token_mask.h"

namespace qforge {

namespace {

// What a sample's feeds must share to be stacked into one batch: each feed's dtype and shape
// past the sample axis.
using Signature = std::vector<std::pair<DType, Shape>>;

Signature signature_of(const BatchSource::Feeds& batch) {
  Signature s;
  for (const auto& [name, t] : batch) {
    s.emplace_back(t.dtype(), Shape(t.shape().begin() + 1, t.shape().end()));
  }
  return s;
}

}  // namespace

bool orders_by_length(const std::vector<ValueInfo>& inputs, const std::string& mask_input) {
  if (mask_input.empty() || sequence_axes(inputs, mask_input).empty()) return false;
  for (const ValueInfo& v : inputs) {
    if (v.name != mask_input) continue;
    return v.shape && !v.shape->empty() && !v.shape->front().value;
  }
  return false;
}

LengthOrderedBatches::LengthOrderedBatches(BatchSource& data, std::string mask_input,
                                           int64_t window_bytes)
    : data_(data), mask_input_(std::move(mask_input)), window_bytes_(window_bytes) {}

void LengthOrderedBatches::rewind() {
  data_.rewind();
  window_.clear();
  samples_.clear();
  cursor_ = 0;
  read_ = 0;
  origin_.clear();
}

bool LengthOrderedBatches::fill() {
  window_.clear();
  samples_.clear();
  cursor_ = 0;
  std::vector<Signature> signatures;
  int64_t bytes = 0;
  Feeds batch;
  while (bytes < window_bytes_ && data_.next(batch)) {
    if (batch.empty() || batch.front().second.rank() == 0) {
      fail_internal("length order: a batch without a sample axis");
    }
    const int64_t rows = batch.front().second.shape()[0];
    if (batch_ == 0) batch_ = std::max<int64_t>(rows, 1);
    const TokenMask mask(batch, mask_input_);
    const Signature sig = signature_of(batch);
    const auto found = std::find(signatures.begin(), signatures.end(), sig);
    const auto shapes = static_cast<size_t>(found - signatures.begin());
    if (found == signatures.end()) signatures.push_back(sig);
    Feeds copy;
    for (const auto& [name, t] : batch) {
      if (t.rank() == 0 || t.shape()[0] != rows) {
        fail_internal("length order: input '" + name + "' has another sample count");
      }
      copy.emplace_back(name, Tensor::copy_of(t.dtype(), t.shape(), t.bytes()));
      bytes += static_cast<int64_t>(t.nbytes());
    }
    for (int64_t r = 0; r < rows; ++r) {
      samples_.push_back({.batch = window_.size(),
                          .row = r,
                          .shapes = shapes,
                          .length = mask.used_length(r),
                          .origin = read_++});
    }
    window_.push_back(std::move(copy));
  }
  // Samples of one shape together (in the order the shapes first came), shortest first; ties in
  // the source's order.
  std::stable_sort(samples_.begin(), samples_.end(), [](const Sample& a, const Sample& b) {
    if (a.shapes != b.shapes) return a.shapes < b.shapes;
    return a.length < b.length;
  });
  return !samples_.empty();
}

bool LengthOrderedBatches::next(Feeds& batch, Feeds* extras) {
  if (extras != nullptr) extras->clear();  // calibration reads no extras
  if (cursor_ == samples_.size() && !fill()) return false;
  // Up to batch_ samples of one shape.
  size_t end = cursor_ + 1;
  while (end < samples_.size() && static_cast<int64_t>(end - cursor_) < batch_ &&
         samples_[end].shapes == samples_[cursor_].shapes) {
    ++end;
  }
  const auto n = static_cast<int64_t>(end - cursor_);
  const Feeds& first = window_[samples_[cursor_].batch];
  batch.clear();
  for (size_t f = 0; f < first.size(); ++f) {
    const Tensor& like = first[f].second;
    Shape shape = like.shape();
    const size_t row_bytes = like.nbytes() / static_cast<size_t>(shape[0]);
    shape[0] = n;
    Tensor t(like.dtype(), shape);
    const std::span<std::byte> out = t.mutable_bytes();
    for (int64_t i = 0; i < n; ++i) {
      const Sample& s = samples_[cursor_ + static_cast<size_t>(i)];
      const std::span<const std::byte> in = window_[s.batch][f].second.bytes();
      std::memcpy(out.data() + static_cast<size_t>(i) * row_bytes,
                  in.data() + static_cast<size_t>(s.row) * row_bytes, row_bytes);
    }
    batch.emplace_back(first[f].first, std::move(t));
  }
  for (size_t i = cursor_; i < end; ++i) origin_.push_back(samples_[i].origin);
  cursor_ = end;
  return true;
}

std::string LengthOrderedBatches::sample_origin(int64_t sample) const {
  if (sample >= 0 && sample < static_cast<int64_t>(origin_.size())) {
    return data_.sample_origin(origin_[static_cast<size_t>(sample)]);
  }
  return data_.sample_origin(sample);
}

}  // namespace qforge
