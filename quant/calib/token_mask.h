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
#include <span>
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
  // One past the last position that is real in some row: the positions from here on are
  // padding in every row (0 when no position is real).
  [[nodiscard]] int64_t used_length() const;
  // One past row b's last real position (0 when none is real).
  [[nodiscard]] int64_t used_length(int64_t b) const;
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
  // The rows of `value` ([batch, seq, rest...], f32) at the real positions, where they lie: one
  // span per run of consecutive real positions, in order. Laid end to end they are real_rows'
  // values; calibration reads them so, without the copy.
  [[nodiscard]] std::vector<std::span<const float>> real_spans(const Tensor& value) const;

 private:
  int64_t batch_ = 0;
  int64_t seq_ = 0;
  int64_t real_ = 0;
  std::vector<uint8_t> keep_;
};

// Trailing padding cut from a batch before it runs. Where every row of a batch ends in
// padding, the positions past its longest sequence change no real position's values in a model
// that masks its padded keys (attention adds a large negative to them, so their softmax
// weights are exactly 0), and right-padded causal decoders never read later positions at all;
// running them only costs time. Calibration (stream_batches) runs each batch only as long as
// its longest sequence: a batch padded to 128 that holds 20 tokens per row runs 20 positions.
// Leading (left) padding is kept: the positions of the real tokens would move.

// A graph input's sequence axis: the input and the axis that carries the mask's sequence dim.
struct SequenceAxis {
  std::string input;
  size_t axis = 0;
};

// The graph inputs that carry the sequence dim of the mask input `mask_input` ([batch, seq]),
// each with its axis: the mask's dim 1, and every dim of another input whose dim_param is the
// same name. Empty, so that no batch is cut, when the mask input is not among `inputs`, when
// its sequence dim is fixed or unnamed (a graph exported for one length may reshape by it),
// when no other input carries that name (a decoder's mask over past and new tokens is named
// apart from its ids), or when an input carries it on two axes.
std::vector<SequenceAxis> sequence_axes(const std::vector<ValueInfo>& inputs,
                                        const std::string& mask_input);

// Cuts the trailing padding of `batch`, whose token mask is `mask`: every feed named in `axes`
// keeps its first max(mask.used_length(), 1) positions along its axis. Nothing is cut when a
// named feed does not have mask.seq() positions there, or when a feed not named is laid out
// [batch, seq, ...] as the mask is (a token input the graph names apart). Returns the number of
// positions cut from each row (0: the batch is as it was). The feeds are replaced, not
// written: storage they share is left as it was.
int64_t cut_trailing_padding(BatchSource::Feeds& batch, std::span<const SequenceAxis> axes,
                             const TokenMask& mask);

}  // namespace qforge
