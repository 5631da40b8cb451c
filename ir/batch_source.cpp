#include "ir/batch_source.h"

#include "ir/error.h"
#include "ir/sha256.h"

namespace qforge {

std::string BatchSource::sample_origin(int64_t sample) const {
  return source() + " sample " + std::to_string(sample);
}

MemoryBatches::MemoryBatches(std::vector<Feeds> batches, std::string source)
    : batches_(std::move(batches)), source_(std::move(source)) {
  for (const Feeds& feeds : batches_) {
    if (feeds.empty() || feeds.front().second.rank() == 0) {
      fail_usage(source_ + ": a batch needs at least one input with a sample axis");
    }
    const int64_t rows = feeds.front().second.shape()[0];
    for (const auto& [name, t] : feeds) {
      if (t.rank() == 0 || t.shape()[0] != rows) {
        fail_usage(source_ + ": input '" + name + "' does not have " + std::to_string(rows) +
                   " samples along axis 0 like the batch's first input");
      }
    }
    size_ += rows;
  }
}

bool MemoryBatches::next(Feeds& batch, Feeds* extras) {
  if (extras != nullptr) extras->clear();
  if (cursor_ >= batches_.size()) return false;
  batch = batches_[cursor_++];
  return true;
}

std::string MemoryBatches::digest() {
  if (!digest_.empty()) return digest_;
  // Sample by sample, input by input, so that the digest does not depend on the batching.
  Sha256 hasher;
  for (const Feeds& feeds : batches_) {
    const int64_t rows = feeds.front().second.shape()[0];
    for (int64_t r = 0; r < rows; ++r) {
      for (const auto& [name, t] : feeds) {
        const auto bytes = t.bytes();
        const size_t row_bytes = bytes.size() / static_cast<size_t>(rows);
        hasher.update(bytes.subspan(static_cast<size_t>(r) * row_bytes, row_bytes));
      }
    }
  }
  digest_ = hasher.hex_digest();
  return digest_;
}

}  // namespace qforge
