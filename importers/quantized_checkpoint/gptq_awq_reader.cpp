#include "importers/quantized_checkpoint/gptq_awq_reader.h"

#include <algorithm>
#include <set>
#include <vector>

#include <nlohmann/json.hpp>

#include "ir/error.h"
#include "ir/quantized_linear.h"

namespace qforge {

namespace {

using nlohmann::json;

constexpr std::string_view kQweight = ".qweight";
constexpr int64_t kMaxDim = int64_t{1} << 31;
// AutoAWQ packs columns 0,2,4,6,1,3,5,7 into a word's nibbles 0..7: column c of a word sits in
// nibble kAwqNibble[c] (AutoAWQ's AWQ_REVERSE_ORDER).
constexpr int kAwqNibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};

enum class Layout { Gptq, Awq };

struct Config {
  std::string file;
  std::string method;
  int bits = 4;
  int64_t group = -1;         // -1: one group over K
  uint32_t stored_zero = 8;   // what every packed zero must hold
};

json quant_config(const std::string& text, const std::string& file) {
  const json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) fail_invalid("'" + file + "' is not a JSON object");
  const auto q = j.find("quantization_config");
  if (q == j.end() || !q->is_object()) {
    fail_invalid("'" + file + "' has no quantization_config object");
  }
  return *q;
}

int64_t int_key(const json& q, const char* key, const std::string& file, int64_t fallback,
                bool required) {
  const auto it = q.find(key);
  if (it == q.end() || it->is_null()) {
    if (required) fail_invalid("'" + file + "': quantization_config has no \"" + key + "\"");
    return fallback;
  }
  if (!it->is_number_integer()) {
    fail_invalid("'" + file + "': quantization_config." + key + " is " + it->dump() +
                 ", not an integer");
  }
  return it->get<int64_t>();
}

bool bool_key(const json& q, const char* key, bool fallback) {
  const auto it = q.find(key);
  return it != q.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

std::string string_key(const json& q, const char* key, const std::string& fallback) {
  const auto it = q.find(key);
  return it != q.end() && it->is_string() ? it->get<std::string>() : fallback;
}

Config parse(const std::string& text, const std::string& file, Layout layout,
             QuantizedCheckpoint& out) {
  const json q = quant_config(text, file);
  Config c;
  c.file = file;
  c.method = layout == Layout::Gptq ? "gptq" : "awq";
  const std::string where = "'" + file + "' (" + c.method + "): ";
  std::string format = "gemm";
  c.bits = static_cast<int>(int_key(q, "bits", file, 4, layout == Layout::Gptq));
  if (layout == Layout::Awq && q.contains("w_bit")) {
    c.bits = static_cast<int>(int_key(q, "w_bit", file, 4, false));
  }
  if (c.bits != 4 && !(layout == Layout::Gptq && c.bits == 8)) {
    fail_unsupported(where + std::to_string(c.bits) + "-bit weights; qforge reads 4-bit " +
                     (layout == Layout::Gptq ? std::string("and 8-bit ") : std::string()) +
                     "weights of this layout");
  }
  c.group = int_key(q, q.contains("q_group_size") ? "q_group_size" : "group_size", file, -1,
                    true);
  if (c.group == 0 || c.group < -1 || c.group > kMaxDim) {
    fail_invalid(where + "group_size " + std::to_string(c.group) + " is not a group size");
  }
  if (layout == Layout::Gptq) {
    if (!bool_key(q, "sym", true)) {
      fail_unsupported(where + "sym is false (asymmetric zero points); qforge reads symmetric "
                       "GPTQ weights");
    }
    if (bool_key(q, "desc_act", false)) {
      fail_unsupported(where + "desc_act is true (act-order g_idx); qforge reads GPTQ weights "
                       "quantized in order");
    }
    format = string_key(q, "checkpoint_format", string_key(q, "format", "gptq"));
    if (format != "gptq" && format != "gptq_v2") {
      fail_unsupported(where + "checkpoint_format '" + format + "'; qforge reads gptq and "
                       "gptq_v2");
    }
    const uint32_t zero = 1u << (c.bits - 1);
    c.stored_zero = format == "gptq" ? zero - 1 : zero;  // v1 stores zero - 1
  } else {
    const std::string version = string_key(q, "version", "gemm");
    if (version != "gemm" && version != "GEMM") {
      fail_unsupported(where + "version '" + version + "'; qforge reads AutoAWQ's GEMM layout");
    }
    c.stored_zero = 8;
  }
  out.quant_method = c.method;
  out.format = format;
  QuantizedScheme s;
  s.bits = c.bits;
  s.group_size = c.group > 0 ? c.group : 0;
  out.schemes.push_back(s);
  if (const auto it = q.find("modules_to_not_convert"); layout == Layout::Awq && it != q.end() &&
                                                         it->is_array()) {
    for (const auto& m : *it) {
      if (m.is_string()) out.ignore.push_back(m.get<std::string>());
    }
  }
  return c;
}

[[noreturn]] void tensor_error(const Config& c, const std::string& name, const std::string& what) {
  fail_invalid("'" + c.file + "' (" + c.method + "): tensor '" + name + "' " + what);
}

const Tensor& need(const Config& c, const Graph& g, const std::string& name,
                   const std::string& packed) {
  const Tensor* t = g.find_initializer(name);
  if (t == nullptr) tensor_error(c, packed, "has no " + name + " beside it");
  return *t;
}

void expect(const Config& c, const std::string& name, const Tensor& t, bool want_float,
            const Shape& shape) {
  const bool dtype_ok = want_float ? dtype_is_float(t.dtype()) : t.dtype() == DType::I32;
  if (!dtype_ok || t.shape() != shape) {
    tensor_error(c, name, "is " + std::string(dtype_name(t.dtype())) + " " +
                              shape_to_string(t.shape()) + ", expected " +
                              (want_float ? "a float " : "i32 ") + shape_to_string(shape));
  }
}

// Element (r, col) of a word-packed matrix, `per_word` values per int32 along `axis` (0: rows
// packed, 1: columns packed), in AWQ's order when `awq`.
uint32_t unpacked(const uint32_t* words, int64_t cols_stored, int bits, int64_t r, int64_t col,
                  int axis, bool awq) {
  const int per_word = 32 / bits;
  const uint32_t mask = (1u << bits) - 1;
  if (axis == 0) {
    const uint32_t w = words[(r / per_word) * cols_stored + col];
    return (w >> (bits * (r % per_word))) & mask;
  }
  const uint32_t w = words[r * cols_stored + col / per_word];
  const auto slot = static_cast<int>(col % per_word);
  return (w >> (bits * (awq ? kAwqNibble[slot] : slot))) & mask;
}

QuantizedCheckpoint read(const std::string& config_text, const std::string& file, Graph& graph,
                         Layout layout) {
  QuantizedCheckpoint out;
  const Config c = parse(config_text, file, layout, out);
  const bool awq = layout == Layout::Awq;
  std::set<std::string> modules;
  for (const auto& [name, t] : graph.initializers()) {
    if (name.ends_with(kQweight)) modules.insert(name.substr(0, name.size() - kQweight.size()));
  }
  if (modules.empty()) {
    fail_invalid("'" + file + "' declares " + c.method + " weights, but the folder holds no "
                 "tensor named <module>.qweight");
  }
  const int per_word = 32 / c.bits;
  const int32_t zero = 1 << (c.bits - 1);
  for (const std::string& m : modules) {
    const std::string qweight = m + ".qweight", qzeros = m + ".qzeros", scales = m + ".scales",
                      g_idx = m + ".g_idx", weight = m + ".weight";
    const Tensor& qw = need(c, graph, qweight, qweight);
    const Tensor& qz = need(c, graph, qzeros, qweight);
    const Tensor& sc = need(c, graph, scales, qweight);
    if (qw.dtype() != DType::I32 || qw.rank() != 2) {
      tensor_error(c, qweight, "is " + std::string(dtype_name(qw.dtype())) + " " +
                                   shape_to_string(qw.shape()) + ", expected i32 of rank 2");
    }
    if (graph.has_initializer(weight)) {
      tensor_error(c, weight, "is stored float beside " + qweight + ": one of the two is stray");
    }
    const int64_t k = awq ? qw.shape()[0] : qw.shape()[0] * per_word;
    const int64_t n = awq ? qw.shape()[1] * per_word : qw.shape()[1];
    if (k <= 0 || n <= 0 || k > kMaxDim || n > kMaxDim) {
      tensor_error(c, qweight, "has shape " + shape_to_string(qw.shape()));
    }
    const int64_t group = c.group > 0 ? c.group : k;
    if (k % group != 0) {
      fail_unsupported("'" + file + "' (" + c.method + "): " + qweight + " has K = " +
                       std::to_string(k) + ", not a multiple of the group size " +
                       std::to_string(group) + " (a partial last group); qforge reads whole "
                       "groups");
    }
    const int64_t groups = k / group;
    const int64_t zero_words = (n * c.bits + 31) / 32;
    expect(c, qzeros, qz, false, {groups, zero_words});
    expect(c, scales, sc, true, {groups, n});
    const auto zw = qz.data<uint32_t>();
    for (int64_t gi = 0; gi < groups; ++gi) {
      for (int64_t col = 0; col < n; ++col) {
        const uint32_t z = unpacked(zw.data(), zero_words, c.bits, gi, col, 1, awq);
        if (z != c.stored_zero) {
          fail_unsupported("'" + file + "' (" + c.method + "): " + qzeros + " holds zero " +
                           std::to_string(z) + " at group " + std::to_string(gi) + ", column " +
                           std::to_string(col) + " (the symmetric zero is stored as " +
                           std::to_string(c.stored_zero) + "): asymmetric weights are not read");
        }
      }
    }
    if (const Tensor* gx = graph.find_initializer(g_idx)) {
      expect(c, g_idx, *gx, false, {k});
      const auto idx = gx->data<int32_t>();
      for (int64_t i = 0; i < k; ++i) {
        if (idx[static_cast<size_t>(i)] != i / group) {
          fail_unsupported("'" + file + "' (" + c.method + "): " + g_idx + "[" +
                           std::to_string(i) + "] = " + std::to_string(idx[static_cast<size_t>(i)]) +
                           ", not " + std::to_string(i / group) + " (act-order); qforge reads "
                           "weights quantized in order");
        }
      }
    }
    Tensor values(c.bits == 4 ? DType::I4 : DType::I8, {n, k});
    auto dst = values.mutable_data<uint8_t>();
    const auto qwords = qw.data<uint32_t>();
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t col = 0; col < k; ++col) {
        // GPTQ: [K/pf, N] packed along K; AWQ: [K, N/8] packed along N.
        const uint32_t u = awq ? unpacked(qwords.data(), qw.shape()[1], 4, col, r, 1, true)
                               : unpacked(qwords.data(), n, c.bits, col, r, 0, false);
        const int32_t q = static_cast<int32_t>(u) - zero;
        const int64_t e = r * k + col;
        if (c.bits == 4) {
          dst[static_cast<size_t>(e / 2)] |=
              static_cast<uint8_t>((static_cast<uint32_t>(q) & 0x0f) << (4 * (e % 2)));
        } else {
          dst[static_cast<size_t>(e)] = static_cast<uint8_t>(static_cast<int8_t>(q));
        }
      }
    }
    // scales [G, N] -> [N, G] (or [N] for one group), the same dtype.
    const auto es = static_cast<size_t>(dtype_bits(sc.dtype()) / 8);
    Tensor scale(sc.dtype(), c.group > 0 ? Shape{n, groups} : Shape{n});
    const auto src = sc.data<uint8_t>();
    auto to = scale.mutable_data<uint8_t>();
    for (int64_t gi = 0; gi < groups; ++gi) {
      for (int64_t col = 0; col < n; ++col) {
        std::copy_n(src.data() + static_cast<size_t>(gi * n + col) * es, es,
                    to.data() + static_cast<size_t>(col * groups + gi) * es);
      }
    }
    graph.remove_initializer(qweight);
    graph.remove_initializer(qzeros);
    graph.remove_initializer(scales);
    graph.remove_initializer(g_idx);
    store_quantized_linear(graph, weight, std::move(values), std::move(scale),
                           c.group > 0 ? c.group : 0);
    ++out.schemes[0].linears;
    ++out.quantized_linears;
  }
  return out;
}

}  // namespace

QuantizedCheckpoint read_gptq(const std::string& config_text, const std::string& file,
                              Graph& graph) {
  return read(config_text, file, graph, Layout::Gptq);
}

QuantizedCheckpoint read_awq(const std::string& config_text, const std::string& file,
                             Graph& graph) {
  return read(config_text, file, graph, Layout::Awq);
}

}  // namespace qforge
