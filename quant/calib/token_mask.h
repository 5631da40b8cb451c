#pragma once
// Which positions of a batch hold real tokens, so that calibration counts only those.
//
// A transformer batch pads its sequences to one length; the padded positions compute values no
// user ever reads, yet an observer that counts them shifts ranges, histograms, AWQ's
// activation scales and GPTQ's Hessian towards garbage (the more padding, the worse). When the
// graph has a mask input ([batch, seq], non-zero = real token; `attention_mask` by default),
// every activation whose two leading dimensions equal the mask's [batch, seq] reaches the
// observers with its padded rows left out: [batch, seq, ...] becomes [real, ...]. Activations
// of other shapes (attention scores [batch, heads, seq, seq], pooled [batch, hidden] outputs,
// weights-only values) are observed whole: their rows are not tokens, or mix real and padded
// ones. A tensor whose leading dimensions only happen to equal [batch, seq] (heads == seq) is
// masked too; the statistics of such a tensor lose the rows of masked positions, never gain
// garbage.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ir/batch_source.h"
#include "ir/graph.h"
#include "ir/tensor.h"

namespace qforge {

// The default mask input name, and the values of --calib-mask that mean "the default if the
// graph has it" and "no mask".
inline constexpr std::string_view kDefaultMaskInput = "attention_mask";
inline constexpr std::string_view kMaskAuto = "auto";
inline constexpr std::string_view kMaskNone = "none";

// The graph input that masks calibration for `requested` ("auto": attention_mask when the graph
// has that input, else none; "none": none; a name: that input, Error(Usage) when the graph has
// no such input). Empty: no mask.
std::string resolve_mask_input(const Graph& graph, std::string_view requested);

class TokenMask {
 public:
  // The mask of one batch: the feed named `name` in `feeds`, [batch, seq] of any integer, bool
  // or float dtype. Error(InvalidInput) when the feed is missing or not of rank 2, naming it.
  TokenMask(const BatchSource::Feeds& feeds, const std::string& name);

  [[nodiscard]] int64_t batch() const { return batch_; }
  [[nodiscard]] int64_t seq() const { return seq_; }
  [[nodiscard]] int64_t real() const { return real_; }  // positions that are real tokens
  [[nodiscard]] bool all_real() const { return real_ == batch_ * seq_; }
  [[nodiscard]] bool is_real(int64_t b, int64_t s) const {
    return keep_[static_cast<size_t>(b * seq_ + s)] != 0;
  }

  // Whether `value` is laid out [batch, seq, ...] as this batch's mask is.
  [[nodiscard]] bool covers(const Tensor& value) const;
  // `value` ([batch, seq, rest...]) with only its real positions: [real, rest...], same dtype.
  [[nodiscard]] Tensor real_rows(const Tensor& value) const;
  // The same, in `scratch`'s storage when nothing else holds it and it is large enough (else in
  // a new one, kept there): calibration copies every observed value of a padded batch, and a
  // fresh zero-filled tensor for each was 6% of static INT8's time on MiniLM.
  [[nodiscard]] Tensor real_rows(const Tensor& value,
                                 std::shared_ptr<OwnedStorage>& scratch) const;

 private:
  int64_t batch_ = 0;
  int64_t seq_ = 0;
  int64_t real_ = 0;
  std::vector<uint8_t> keep_;
};

}  // namespace qforge
