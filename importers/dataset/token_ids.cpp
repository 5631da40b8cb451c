// Token-id calibration data: see token_ids.h. Both formats are read into rows (ids, mask, where
// each came from), then laid out the same way (layout()).
#include "importers/dataset/token_ids.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <span>
#include <sstream>

#include "importers/dataset/data_block.h"
#include "importers/torch/byte_io.h"
#include "ir/error.h"
#include "ir/sha256.h"

namespace qforge {

using torch_detail::printable;
using torch_detail::quote;

namespace {

struct Row {
  std::vector<int64_t> ids;
  std::vector<int64_t> mask;  // empty: every position is real
  int64_t origin = 0;
};

void check_options(const TokenIdOptions& o) {
  if (o.calib_size < 0) {
    fail_usage("--calib-size " + std::to_string(o.calib_size) + ": use 0 (all) or a count");
  }
  if (o.seq_len < 0) {
    fail_usage("--seq-len " + std::to_string(o.seq_len) + ": use 0 (no limit) or a length");
  }
  if (o.batch < 1) fail_usage("--batch " + std::to_string(o.batch) + ": use 1 or more samples");
  if (o.vocab_size < 0) fail_usage("vocab size " + std::to_string(o.vocab_size) + " < 0");
}

// Rows -> the table: padding dropped at both ends, cut to seq_len, right-padded to T.
TokenIdTable layout(std::vector<Row> rows, const TokenIdOptions& o, const std::string& where,
                    const std::string& unit) {
  if (rows.empty()) {
    fail_invalid(where + " holds no samples; give at least one row of token ids");
  }
  TokenIdTable t;
  t.rows = static_cast<int64_t>(rows.size());
  std::vector<std::pair<size_t, size_t>> spans;  // [first, last) real positions per row
  for (const Row& r : rows) {
    size_t first = 0, last = r.ids.size();
    if (!r.mask.empty()) {
      while (first < last && r.mask[first] == 0) ++first;
      while (last > first && r.mask[last - 1] == 0) --last;
    }
    if (first == last) {
      fail_invalid(where + " " + unit + " " + std::to_string(r.origin) +
                   " has no real token (empty, or attention_mask all 0); drop the row");
    }
    if (o.seq_len > 0) last = std::min(last, first + static_cast<size_t>(o.seq_len));
    spans.emplace_back(first, last);
    t.seq = std::max(t.seq, static_cast<int64_t>(last - first));
  }
  const auto total = static_cast<size_t>(t.rows * t.seq);
  t.ids.assign(total, 0);
  t.mask.assign(total, 0);
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto [first, last] = spans[i];
    for (size_t p = first; p < last; ++p) {
      const size_t at = i * static_cast<size_t>(t.seq) + (p - first);
      t.mask[at] = rows[i].mask.empty() ? 1 : rows[i].mask[p];
      t.ids[at] = t.mask[at] != 0 ? rows[i].ids[p] : 0;  // a padded hole reads the pad id
      t.real_tokens += t.mask[at];
    }
    t.origin.push_back(rows[i].origin);
  }
  return t;
}

// A JSON array of integers, checked one value at a time; `what` names it in messages.
std::vector<int64_t> int_array(const nlohmann::json& v, const std::string& here,
                               const std::string& key, bool is_mask, int64_t vocab) {
  if (!v.is_array()) {
    fail_invalid(here + ": \"" + key + "\" is " + std::string(v.type_name()) +
                 ", not an array of integers");
  }
  std::vector<int64_t> out;
  out.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const nlohmann::json& x = v[i];
    const std::string at = here + ": " + key + "[" + std::to_string(i) + "]";
    int64_t value = 0;
    if (x.is_number_unsigned()) {
      const auto u = x.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        fail_invalid(at + " is " + std::to_string(u) + ", too large for a token id");
      }
      value = static_cast<int64_t>(u);
    } else if (x.is_number_integer()) {
      value = x.get<int64_t>();
    } else {
      const std::string text = printable(x.dump(), 40);
      fail_invalid(at + " is " + text + ", not an integer; " +
                   (is_mask ? "an attention_mask holds 0 and 1"
                            : "token ids are the tokenizer's integer ids"));
    }
    if (is_mask && value != 0 && value != 1) {
      fail_invalid(at + " is " + std::to_string(value) +
                   "; an attention_mask holds 0 (padding) and 1 (token)");
    }
    if (!is_mask && value < 0) {
      fail_invalid(at + " is " + std::to_string(value) +
                   "; token ids are non-negative (regenerate the ids with the tokenizer)");
    }
    if (!is_mask && vocab > 0 && value >= vocab) {
      fail_invalid(at + " is " + std::to_string(value) + ", not below the model's vocabulary of " +
                   std::to_string(vocab) + "; use the model's own tokenizer");
    }
    out.push_back(value);
  }
  return out;
}

// Rows of the two arrays of an .npz: values checked, as int64.
std::vector<int64_t> npz_values(dataset_detail::DataBlock& block, size_t index, int64_t n,
                                int64_t t) {
  const Tensor all = block.read(index, 0, n);
  std::vector<int64_t> out(static_cast<size_t>(n * t));
  const std::byte* src = all.bytes().data();
  if (all.dtype() == DType::I64) {
    std::memcpy(out.data(), src, out.size() * sizeof(int64_t));
  } else {  // I32
    for (size_t i = 0; i < out.size(); ++i) {
      int32_t v;
      std::memcpy(&v, src + i * sizeof(int32_t), sizeof(int32_t));
      out[i] = v;
    }
  }
  return out;
}

std::vector<Row> npz_rows(const std::filesystem::path& path, const TokenIdOptions& o,
                          const std::string& where) {
  std::unique_ptr<dataset_detail::DataBlock> block;
  try {
    block = dataset_detail::open_npz_block(path);
  } catch (const Error& e) {
    const std::string m = e.what();
    if (m.find("Python objects") != std::string::npos) {
      fail_invalid(where + ": " + m +
                   " (rows of different lengths?); pad them (tokenizer padding=True) or write "
                   "one row per line of a .jsonl");
    }
    throw;
  }
  const auto& arrays = block->arrays();
  auto find = [&](std::string_view name) -> std::optional<size_t> {
    for (size_t i = 0; i < arrays.size(); ++i)
      if (arrays[i].name == name) return i;
    return std::nullopt;
  };
  const auto ids_at = find("input_ids");
  if (!ids_at) {
    std::string names;
    for (const auto& a : arrays) names += (names.empty() ? "" : ", ") + a.name;
    fail_invalid(where + " has no 'input_ids' array (it holds " + names +
                 "); save the tokenizer's output: np.savez(path, **tok(texts, padding=True, "
                 "return_tensors='np'))");
  }
  const auto mask_at = find("attention_mask");
  auto check = [&](size_t index) {
    const dataset_detail::BlockArray& a = arrays[index];
    if (a.dtype != DType::I64 && a.dtype != DType::I32) {
      fail_unsupported(where + " array '" + a.name + "' is " + std::string(dtype_name(a.dtype)) +
                       "; give int32 or int64 (np.int64)");
    }
    if (a.shape.size() != 2) {
      fail_invalid(where + " array '" + a.name + "' has shape " + shape_to_string(a.shape) +
                   "; token ids are [samples, positions]");
    }
  };
  check(*ids_at);
  const Shape shape = arrays[*ids_at].shape;
  if (mask_at) {
    check(*mask_at);
    if (arrays[*mask_at].shape != shape) {
      fail_invalid(where + ": attention_mask " + shape_to_string(arrays[*mask_at].shape) +
                   " does not match input_ids " + shape_to_string(shape) +
                   "; save both from one tokenizer call");
    }
  }
  const int64_t n = o.calib_size > 0 ? std::min(o.calib_size, shape[0]) : shape[0];
  const int64_t t = shape[1];
  if (n == 0) fail_invalid(where + " holds no samples; give at least one row of token ids");
  const std::vector<int64_t> ids = npz_values(*block, *ids_at, n, t);
  const std::vector<int64_t> mask =
      mask_at ? npz_values(*block, *mask_at, n, t) : std::vector<int64_t>();
  std::vector<Row> rows(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) {
    Row& row = rows[static_cast<size_t>(r)];
    row.origin = r;
    const auto begin = static_cast<size_t>(r * t);
    row.ids.assign(ids.begin() + static_cast<ptrdiff_t>(begin),
                   ids.begin() + static_cast<ptrdiff_t>(begin + static_cast<size_t>(t)));
    if (mask_at) {
      row.mask.assign(mask.begin() + static_cast<ptrdiff_t>(begin),
                      mask.begin() + static_cast<ptrdiff_t>(begin + static_cast<size_t>(t)));
    }
    const std::string here = where + " sample " + std::to_string(r);
    for (int64_t p = 0; p < t; ++p) {
      const auto i = static_cast<size_t>(p);
      const bool real = row.mask.empty() || row.mask[i] != 0;
      if (!row.mask.empty() && row.mask[i] != 0 && row.mask[i] != 1) {
        fail_invalid(here + ": attention_mask[" + std::to_string(p) + "] is " +
                     std::to_string(row.mask[i]) +
                     "; an attention_mask holds 0 (padding) and 1 (token)");
      }
      if (real && row.ids[i] < 0) {
        fail_invalid(here + ": input_ids[" + std::to_string(p) + "] is " +
                     std::to_string(row.ids[i]) +
                     "; token ids are non-negative (regenerate the ids with the tokenizer)");
      }
      if (real && o.vocab_size > 0 && row.ids[i] >= o.vocab_size) {
        fail_invalid(here + ": input_ids[" + std::to_string(p) + "] is " +
                     std::to_string(row.ids[i]) + ", not below the model's vocabulary of " +
                     std::to_string(o.vocab_size) + "; use the model's own tokenizer");
      }
    }
  }
  return rows;
}

std::string read_text(const std::filesystem::path& path, const std::string& where) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail_io("cannot open " + where + ": no such file, or not readable");
  std::ostringstream s;
  s << f.rdbuf();
  if (f.bad()) fail_io("cannot read " + where);
  return s.str();
}

}  // namespace

TokenIdTable parse_token_ids_jsonl(std::string_view text, std::string_view source,
                                   const TokenIdOptions& options) {
  check_options(options);
  const std::string where(source);
  std::vector<Row> rows;
  size_t pos = 0;
  int64_t line = 0;
  while (pos < text.size() && (options.calib_size == 0 ||
                               static_cast<int64_t>(rows.size()) < options.calib_size)) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view body = text.substr(pos, end - pos);
    pos = end + 1;
    ++line;
    if (body.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    const std::string here = where + " line " + std::to_string(line);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(body);
    } catch (const nlohmann::json::exception& e) {
      fail_invalid(here + " is not JSON (" + printable(e.what(), 120) +
                   "); write one object per line, {\"input_ids\": [...]}");
    }
    if (!j.is_object()) {
      fail_invalid(here + " is a JSON " + std::string(j.type_name()) +
                   ", not an object; write {\"input_ids\": [...]} per line");
    }
    const auto ids = j.find("input_ids");
    if (ids == j.end()) {
      fail_invalid(here + " has no \"input_ids\"; write {\"input_ids\": [...]} per line");
    }
    Row row;
    row.origin = line;
    row.ids = int_array(*ids, here, "input_ids", false, options.vocab_size);
    const auto mask = j.find("attention_mask");
    if (mask != j.end() && !mask->is_null()) {
      row.mask = int_array(*mask, here, "attention_mask", true, 0);
      if (row.mask.size() != row.ids.size()) {
        fail_invalid(here + ": attention_mask has " + std::to_string(row.mask.size()) +
                     " values for " + std::to_string(row.ids.size()) +
                     " input_ids; give one per token");
      }
    }
    rows.push_back(std::move(row));
  }
  if (rows.empty()) {
    fail_invalid(where + " holds no rows; write one {\"input_ids\": [...]} object per line");
  }
  return layout(std::move(rows), options, where, "line");
}

TokenIdTable read_token_ids(const std::filesystem::path& path, const TokenIdOptions& options,
                            std::string_view role) {
  check_options(options);
  const std::string where = std::string(role) + " " + quote(path.string());
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    fail_io("cannot open " + where + ": no such file");
  }
  const std::string ext = path.extension().string();
  if (ext == ".jsonl") return parse_token_ids_jsonl(read_text(path, where), where, options);
  if (ext == ".npz") return layout(npz_rows(path, options, where), options, where, "sample");
  fail_unsupported(where +
                   " is neither .npz nor .jsonl; token ids come as an .npz of input_ids "
                   "(and attention_mask) or a .jsonl of {\"input_ids\": [...]} lines");
}

TokenIds::TokenIds(const std::filesystem::path& path, const TokenIdOptions& options,
                   std::string_view role)
    : TokenIds(read_token_ids(path, options, role), options.batch, path.string(),
               path.extension() == ".npz" ? "npz" : "jsonl") {
  role_source_ = std::string(role) + " " + quote(source_);
}

TokenIds::TokenIds(TokenIdTable table, int64_t batch, std::string source, std::string format)
    : table_(std::move(table)),
      batch_(batch),
      source_(std::move(source)),
      format_(std::move(format)),
      role_source_("calibration data " + quote(source_)) {
  if (batch_ < 1) fail_usage("--batch " + std::to_string(batch_) + ": use 1 or more samples");
  if (table_.rows < 1 || table_.seq < 1 ||
      table_.ids.size() != static_cast<size_t>(table_.rows * table_.seq) ||
      table_.mask.size() != table_.ids.size()) {
    fail_internal("TokenIds: a table of " + std::to_string(table_.rows) + " x " +
                  std::to_string(table_.seq) + " rows does not hold its values");
  }
}

bool TokenIds::next(Feeds& batch, Feeds* extras) {
  batch.clear();
  if (extras != nullptr) extras->clear();
  if (cursor_ >= table_.rows) return false;
  const int64_t b = std::min(batch_, table_.rows - cursor_);
  const int64_t t = table_.seq;
  Tensor ids(DType::I64, {b, t});
  Tensor mask(DType::I64, {b, t});
  const auto from = static_cast<ptrdiff_t>(cursor_ * t);
  const auto count = static_cast<ptrdiff_t>(b * t);
  std::copy(table_.ids.begin() + from, table_.ids.begin() + from + count,
            ids.mutable_data<int64_t>().begin());
  std::copy(table_.mask.begin() + from, table_.mask.begin() + from + count,
            mask.mutable_data<int64_t>().begin());
  batch.emplace_back("input_ids", std::move(ids));
  batch.emplace_back("attention_mask", std::move(mask));
  cursor_ += b;
  return true;
}

std::string TokenIds::digest() {
  if (!digest_.empty()) return digest_;
  Sha256 hasher;
  const auto t = static_cast<size_t>(table_.seq);
  for (size_t r = 0; r < static_cast<size_t>(table_.rows); ++r) {
    hasher.update(std::as_bytes(std::span<const int64_t>(table_.ids.data() + r * t, t)));
    hasher.update(std::as_bytes(std::span<const int64_t>(table_.mask.data() + r * t, t)));
  }
  digest_ = hasher.hex_digest();
  return digest_;
}

std::string TokenIds::sample_origin(int64_t sample) const {
  const bool known = sample >= 0 && sample < table_.rows;
  const int64_t at = known ? table_.origin[static_cast<size_t>(sample)] : sample;
  return role_source_ + (format_ == "jsonl" && known ? " line " : " sample ") + std::to_string(at);
}

}  // namespace qforge
