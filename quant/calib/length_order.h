#pragma once
// Calibration batches of like lengths. A batch runs as long as its longest sequence
// (token_mask.h, cut_trailing_padding), so a batch that mixes short and long sentences computes
// the short ones' padding: on real text, whose lengths spread widely, most of what it runs.
// Range calibration sums nothing over the samples (min and max, and histograms whose bins nest:
// observer.h), so it may take them in any order. LengthOrderedBatches serves another source's
// samples in windows of whole source batches: each window's samples sorted by the positions
// they need (shortest first; ties, and samples of other shapes, in the source's order), then
// cut into batches of the source's size. Shortest first, because the batches then only grow:
// longest first, each long batch after another added its memory to the process's (on MiniLM
// with 256 sentences of 4-128 tokens, peak RSS of `calibrate --method percentile` 450 MB
// shortest first, 1,738 MB longest first, 882 MB in data-set order). The same samples, each
// once per pass; what changes is the padding computed (MiniLM's 256 calibration sentences in
// batches of 32: 3,552 positions run in data-set order, 3,232 so, of which 3,112 are real; those
// 256 sentences at 4-128 tokens: 24,928 positions in data-set order, 10,240 so).
//
// What the order changes in the ranges: values the mask does not cover (attention scores
// [batch, heads, seq, seq]) are observed whole, padded rows and columns included, so fewer
// padded positions put less of them in those ranges; and a real position's value may differ by
// an ulp with the padding after it (an attention row's sum over more zero weights). A data
// set's order then matters only where samples of equal length share batches and where windows
// fall; the same data give the same bits. AWQ and GPTQ sum products over the samples in order:
// their calibration keeps it.
#include <cstdint>
#include <string>
#include <vector>

#include "ir/batch_source.h"
#include "ir/graph.h"

namespace qforge {

// Whether range calibration takes a graph's samples in batches of like lengths: where it cuts
// each batch to its longest sequence (sequence_axes names the inputs to cut) and the graph takes
// any batch size (the mask input's batch dim is not fixed).
bool orders_by_length(const std::vector<ValueInfo>& inputs, const std::string& mask_input);

class LengthOrderedBatches final : public BatchSource {
 public:
  // Window bound: source batches are read until their copies hold this many bytes.
  static constexpr int64_t kWindowBytes = int64_t{64} << 20;

  // `mask_input`: the feed holding each batch's token mask ([batch, seq], non-zero = real).
  LengthOrderedBatches(BatchSource& data, std::string mask_input,
                       int64_t window_bytes = kWindowBytes);

  bool next(Feeds& batch, Feeds* extras = nullptr) override;
  void rewind() override;
  [[nodiscard]] int64_t size() const override { return data_.size(); }
  std::string digest() override { return data_.digest(); }  // of the samples, in data-set order
  [[nodiscard]] const std::string& source() const override { return data_.source(); }
  // Sample `sample` as served here is the source's sample origin_[sample].
  [[nodiscard]] std::string sample_origin(int64_t sample) const override;

 private:
  struct Sample {
    size_t batch;    // in window_
    int64_t row;     // in that batch
    size_t shapes;   // index of its feeds' shapes and dtypes among the window's
    int64_t length;  // positions it needs: one past its last real token
    int64_t origin;  // its place in the source's pass
  };
  bool fill();  // reads the next window; false at the source's end

  BatchSource& data_;
  std::string mask_input_;
  int64_t window_bytes_;
  std::vector<Feeds> window_;    // the window's source batches, copied
  std::vector<Sample> samples_;  // in the order they are served
  size_t cursor_ = 0;            // next of samples_
  int64_t batch_ = 0;            // samples per batch: the source's first batch's
  int64_t read_ = 0;             // source samples read this pass
  std::vector<int64_t> origin_;  // served -> source sample, this pass
};

}  // namespace qforge
