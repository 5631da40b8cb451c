// libFuzzer target: .jsonl token-id calibration data through parse_token_ids_jsonl, with and
// without --seq-len and --calib-size. Any exception other than qforge::Error, any crash or
// sanitizer report, or an accepted table that breaks its invariants (a row without a real token,
// a negative id, a mask value other than 0/1, an id at a padded position, a row longer than
// seq_len, sizes that disagree) is a bug.
// Seeds: tests/fuzz/corpus/token_ids_jsonl.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>

#include "importers/dataset/token_ids.h"
#include "ir/error.h"

#include "abort_on_internal.h"

namespace {

void check(const qforge::TokenIdTable& t, const qforge::TokenIdOptions& o) {
  const auto cells = static_cast<size_t>(t.rows * t.seq);
  if (t.rows < 1 || t.seq < 1 || t.ids.size() != cells || t.mask.size() != cells ||
      t.origin.size() != static_cast<size_t>(t.rows) || (o.seq_len > 0 && t.seq > o.seq_len) ||
      (o.calib_size > 0 && t.rows > o.calib_size)) {
    __builtin_trap();
  }
  int64_t real = 0;
  for (int64_t r = 0; r < t.rows; ++r) {
    const auto at = static_cast<size_t>(r * t.seq);
    if (t.mask[at] != 1) __builtin_trap();  // every row starts with a real token
    for (int64_t p = 0; p < t.seq; ++p) {
      const int64_t m = t.mask[at + static_cast<size_t>(p)];
      const int64_t id = t.ids[at + static_cast<size_t>(p)];
      if ((m != 0 && m != 1) || id < 0 || (m == 0 && id != 0)) __builtin_trap();
      real += m;
    }
  }
  if (real != t.real_tokens) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  for (const auto& [calib_size, seq_len] : {std::pair<int64_t, int64_t>{0, 0}, {2, 3}}) {
    qforge::TokenIdOptions o;
    o.calib_size = calib_size;
    o.seq_len = seq_len;
    try {
      check(qforge::parse_token_ids_jsonl(text, "fuzz.jsonl", o), o);
    } catch (const qforge::Error& e) {
      qforge::fuzz::abort_on_internal(e);
    }
  }
  return 0;
}
