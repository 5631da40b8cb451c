#pragma once
// What a pass reads calibration samples from: batches of named tensors, one per model input.
// The dataset importer implements it over files (importers/dataset/dataset.h); MemoryBatches
// serves batches held in memory (tests, and callers that build samples themselves). Passes see
// only this interface, so they never read files while they run.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ir/tensor.h"

namespace qforge {

class BatchSource {
 public:
  using Feeds = std::vector<std::pair<std::string, Tensor>>;

  BatchSource() = default;
  virtual ~BatchSource() = default;
  BatchSource(const BatchSource&) = delete;
  BatchSource& operator=(const BatchSource&) = delete;

  // The next batch, one tensor per model input in model order ([b, ...]); false after the
  // last. `extras`, when given, receives the rows of arrays served beside the inputs (labels).
  virtual bool next(Feeds& batch, Feeds* extras = nullptr) = 0;
  // Starts the next pass from the first sample.
  virtual void rewind() = 0;
  // Samples served per pass.
  [[nodiscard]] virtual int64_t size() const = 0;
  // SHA-256 (hex) of the samples served per pass: each sample contributes each input's bytes
  // (C order, little-endian) in input order, whatever the batching.
  virtual std::string digest() = 0;
  // Where the samples come from, for messages ("calib.npz").
  [[nodiscard]] virtual const std::string& source() const = 0;
  // Where sample `sample` of a pass (0-based, counting the samples served) comes from, for
  // messages that blame one sample: "calibration data 'calib.npz' sample 7".
  [[nodiscard]] virtual std::string sample_origin(int64_t sample) const;
};

// Batches held in memory, served in order. Every batch must have the same inputs in the same
// order; a sample is one row along axis 0 of each.
class MemoryBatches final : public BatchSource {
 public:
  explicit MemoryBatches(std::vector<Feeds> batches, std::string source = "samples in memory");

  bool next(Feeds& batch, Feeds* extras = nullptr) override;
  void rewind() override { cursor_ = 0; }
  [[nodiscard]] int64_t size() const override { return size_; }
  std::string digest() override;
  [[nodiscard]] const std::string& source() const override { return source_; }

 private:
  std::vector<Feeds> batches_;
  std::string source_;
  size_t cursor_ = 0;
  int64_t size_ = 0;
  std::string digest_;
};

}  // namespace qforge
