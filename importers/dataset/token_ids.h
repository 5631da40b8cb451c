#pragma once
// Token-id calibration data for decoder-only language models (calib_data/README.md, "Token
// ids"): the samples are sequences of token ids, made from text by the model's tokenizer.
//
// Formats:
//   FILE.npz    `input_ids` int32 or int64 [N, T], optional `attention_mask` [N, T] of 0/1 (what
//               np.savez('ids.npz', **tok(texts, padding=True, return_tensors='np')) writes;
//               other arrays, e.g. token_type_ids, are ignored). Stored or deflated.
//   FILE.jsonl  one JSON object per line, {"input_ids": [...]} with an optional
//               "attention_mask" of the same length; blank lines are skipped.
// Each row keeps the positions from its first to its last real token (mask 1): padding on
// either side, left padding included, is dropped, so every row starts at position 0. Rows
// longer than seq_len are cut to their first seq_len positions. T is the longest row (at most
// seq_len); shorter rows are padded on the right with id 0 and mask 0. A pass serves the first
// calib_size rows in file order, `batch` at a time, as input_ids and attention_mask int64 [b, T].
//
// Refused with one line naming the file, the line (jsonl, 1-based) or sample (npz, 0-based) and
// what to do: a negative or non-integer id, a mask value other than 0 or 1, input_ids and
// attention_mask of different shapes or lengths, arrays that are not [N, T] (a ragged array
// saved as Python objects), an id >= vocab_size (when given), an empty file, a row with no real
// token. The whole set (ids and mask, N x T x 16 bytes) is held in memory: token ids are small
// beside the hidden states a layer-wise pass keeps.
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "ir/batch_source.h"

namespace qforge {

struct TokenIdOptions {
  int64_t calib_size = 0;  // rows served per pass, the first ones of the file (0 = all)
  int64_t seq_len = 0;     // cut rows to this many positions (0 = no limit)
  int64_t batch = 1;       // rows per batch
  int64_t vocab_size = 0;  // > 0: ids must be below it
};

// Rows read and laid out: ids and mask [rows, seq], row-major, right-padded.
struct TokenIdTable {
  int64_t rows = 0;
  int64_t seq = 0;
  std::vector<int64_t> ids;
  std::vector<int64_t> mask;
  std::vector<int64_t> origin;  // per row: its line (jsonl, 1-based) or sample (npz, 0-based)
  int64_t real_tokens = 0;      // positions with mask 1
};

// Parses .jsonl text; `source` names it in messages ("calibration data 'ids.jsonl'"). Reads
// only the lines that hold the first calib_size rows. Throws Error(InvalidInput) for bad rows,
// Usage for bad options.
TokenIdTable parse_token_ids_jsonl(std::string_view text, std::string_view source,
                                   const TokenIdOptions& options);

// Reads an .npz or .jsonl file (by extension). Error(IO) when unreadable, Unsupported for
// another extension or array dtype, InvalidInput as above.
TokenIdTable read_token_ids(const std::filesystem::path& path, const TokenIdOptions& options,
                            std::string_view role = "calibration data");

class TokenIds final : public BatchSource {
 public:
  TokenIds(const std::filesystem::path& path, const TokenIdOptions& options,
           std::string_view role = "calibration data");
  // Rows already read; `source` as source() returns it.
  TokenIds(TokenIdTable table, int64_t batch, std::string source, std::string format);

  bool next(Feeds& batch, Feeds* extras = nullptr) override;
  void rewind() override { cursor_ = 0; }
  [[nodiscard]] int64_t size() const override { return table_.rows; }
  // SHA-256 of each row's input_ids then attention_mask bytes (int64, little-endian), row by row.
  std::string digest() override;
  [[nodiscard]] const std::string& source() const override { return source_; }
  // "calibration data 'ids.jsonl' line 12" / "calibration data 'ids.npz' sample 7".
  [[nodiscard]] std::string sample_origin(int64_t sample) const override;

  [[nodiscard]] int64_t seq_len() const { return table_.seq; }   // T
  [[nodiscard]] int64_t real_tokens() const { return table_.real_tokens; }
  [[nodiscard]] int64_t batch() const { return batch_; }
  [[nodiscard]] const std::string& format() const { return format_; }  // "npz", "jsonl"
  [[nodiscard]] const TokenIdTable& table() const { return table_; }

 private:
  TokenIdTable table_;
  int64_t batch_ = 1;
  std::string source_;
  std::string format_;
  std::string role_source_;  // "calibration data 'ids.jsonl'"
  int64_t cursor_ = 0;
  std::string digest_;
};

}  // namespace qforge
