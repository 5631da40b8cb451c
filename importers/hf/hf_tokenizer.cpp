#include "importers/hf/hf_tokenizer.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include <spdlog/spdlog.h>

#include "importers/hf/sentencepiece_model.pb.h"
#include "ir/error.h"

namespace qforge {

namespace {

using nlohmann::json;

// A key's string or boolean value, or `fallback` when absent or of another type: a file may hold
// anything, and json::value throws on a type it cannot convert.
std::string str_or(const json& o, const char* key, const std::string& fallback) {
  const auto it = o.find(key);
  return it != o.end() && it->is_string() ? it->get<std::string>() : fallback;
}
bool bool_or(const json& o, const char* key, bool fallback) {
  const auto it = o.find(key);
  return it != o.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

json parse_json(const std::string& text, const std::string& file) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) fail_invalid("'" + file + "' is not a JSON object; re-save the tokenizer");
  return j;
}

// Split regexes of the pre-tokenizers llama.cpp knows by name (llama-vocab.cpp), with the
// name convert_hf_to_gguf.py's get_vocab_base_pre gives them.
struct KnownPre {
  const char* regex;
  const char* name;
};
constexpr KnownPre kKnownPre[] = {
    {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
     "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
     "llama-bpe"},
    {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
     "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
     "qwen2"},
};

bool byte_level_with_regex(const json& p) {
  if (!p.is_object() || str_or(p, "type", "") != "ByteLevel") return false;
  const auto it = p.find("use_regex");
  return it == p.end() || !it->is_boolean() || it->get<bool>();
}

// tokenizer.ggml.pre from tokenizer.json's pre_tokenizer. llama.cpp's converter hashes the
// token ids of a probe text; qforge does not run the tokenizer, so it recognizes the
// pre-tokenizers by their definition: GPT-2's ByteLevel (its built-in regex) and the Split
// regexes above. Anything else is "default", with the reason kept for a warning.
std::pair<std::string, std::string> detect_pre(const json& tok) {
  const auto it = tok.find("pre_tokenizer");
  if (it == tok.end() || it->is_null()) return {"default", "tokenizer.json has no pre_tokenizer"};
  const json& p = *it;
  if (byte_level_with_regex(p)) return {"gpt-2", ""};
  if (p.is_object() && str_or(p, "type", "") == "Sequence" && p.contains("pretokenizers") &&
      p["pretokenizers"].is_array()) {
    for (const auto& step : p["pretokenizers"]) {
      if (!step.is_object() || str_or(step, "type", "") != "Split") continue;
      const auto pat = step.find("pattern");
      if (pat == step.end() || !pat->is_object()) continue;
      const auto re = pat->find("Regex");
      if (re == pat->end() || !re->is_string()) continue;
      for (const auto& known : kKnownPre) {
        if (re->get<std::string>() == known.regex) return {known.name, ""};
      }
      return {"default", "its Split regex is not one llama.cpp knows by name"};
    }
  }
  return {"default", "its pre_tokenizer (" + str_or(p, "type", "?") +
                         ") is not one llama.cpp knows by name"};
}

// convert_hf_to_gguf.py does_token_look_special.
bool looks_special(const std::string& t) {
  auto starts = [&t](const std::string& s) { return t.rfind(s, 0) == 0; };
  auto ends = [&t](const std::string& s) {
    return t.size() >= s.size() && t.compare(t.size() - s.size(), s.size(), s) == 0;
  };
  if (t == "<pad>" || t == "<mask>" || t == "<2mass>" || t == "[@BOS@]") return true;
  if (starts("<|") && ends("|>")) return true;
  if (starts("<\xef\xbd\x9c") && ends("\xef\xbd\x9c>")) return true;  // <｜ ... ｜>
  return starts("<unused") && ends(">");
}

// Merges as "a b"; the list-of-pairs form (transformers >= 4.45) encodes a space inside a part
// as U+0120, as gguf-py does.
std::vector<std::string> read_merges(const json& model, const std::string& file) {
  std::vector<std::string> out;
  const auto it = model.find("merges");
  if (it == model.end() || !it->is_array()) return out;
  for (const auto& m : *it) {
    if (m.is_string()) {
      out.push_back(m.get<std::string>());
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      std::string joined;
      for (int k = 0; k < 2; ++k) {
        if (k) joined += ' ';
        for (char c : m[k].get<std::string>()) {
          if (c == ' ') {
            joined += "\xc4\xa0";
          } else {
            joined += c;
          }
        }
      }
      out.push_back(std::move(joined));
    } else {
      fail_invalid("'" + file + "': model.merges holds " + m.dump().substr(0, 60) +
                   ", expected \"a b\" or [\"a\", \"b\"]");
    }
  }
  return out;
}

// U+2581 (SentencePiece's space) as a plain space.
std::string replace_metaspace(const std::string& text) {
  static const std::string kMeta = "\xe2\x96\x81";
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    if (text.compare(i, kMeta.size(), kMeta) == 0) {
      out.push_back(' ');
      i += kMeta.size();
    } else {
      out.push_back(text[i++]);
    }
  }
  return out;
}

constexpr int64_t kMaxVocab = int64_t{1} << 22;  // the largest real vocabularies hold ~262k

constexpr const char* kSpecialTypes[] = {"bos", "eos", "unk", "sep", "pad", "cls", "mask"};

void set_special(HfTokenizer& t, const std::string& typ, const json& id, size_t n_vocab) {
  if (!id.is_number_integer()) return;
  const auto v = id.get<int64_t>();
  if (v < 0 || static_cast<uint64_t>(v) >= n_vocab) return;
  for (const auto& [name, existing] : t.special_ids) {
    if (name == typ) return;  // the first source that names it wins
  }
  t.special_ids.emplace_back(typ, static_cast<uint32_t>(v));
}

// gguf-py SpecialVocab: the chat template, add_<type>_token flags, and the special token ids named
// by tokenizer_config.json (matched against tokenizer.json's added tokens) or config.json.
void add_special_vocab(HfTokenizer& t, const json& added_tokens,
                       const std::string& tokenizer_config_json, const std::string& config_json,
                       const std::string& dir) {
  const size_t n_vocab = t.tokens.size();
  if (!tokenizer_config_json.empty()) {
    const json tc = parse_json(tokenizer_config_json, dir + "/tokenizer_config.json");
    if (const auto it = tc.find("chat_template"); it != tc.end() && it->is_string()) {
      t.chat_template = it->get<std::string>();
    }
    if (const auto it = tc.find("add_prefix_space"); it != tc.end() && it->is_boolean()) {
      t.add_space_prefix = it->get<bool>();
    }
    for (const char* typ : kSpecialTypes) {
      const std::string s(typ);
      if (const auto it = tc.find("add_" + s + "_token"); it != tc.end() && it->is_boolean()) {
        if (s == "bos") t.add_bos = it->get<bool>();
        if (s == "eos") t.add_eos = it->get<bool>();
      }
      const auto entry = tc.find(s + "_token");
      if (entry == tc.end()) continue;
      std::string content;
      if (entry->is_string()) {
        content = entry->get<std::string>();
      } else if (entry->is_object() && entry->contains("content") &&
                 (*entry)["content"].is_string()) {
        content = (*entry)["content"].get<std::string>();
      } else {
        continue;
      }
      for (const auto& a : added_tokens) {
        if (a["content"].get<std::string>() == content) {
          set_special(t, s, a["id"], n_vocab);
          break;
        }
      }
    }
  }
  if (!config_json.empty()) {
    const json cfg = parse_json(config_json, dir + "/config.json");
    for (const char* typ : kSpecialTypes) {
      const auto it = cfg.find(std::string(typ) + "_token_id");
      if (it != cfg.end()) set_special(t, typ, *it, n_vocab);
    }
  }
}

}  // namespace

HfTokenizer parse_hf_tokenizer(const std::string& tokenizer_json,
                               const std::string& tokenizer_config_json,
                               const std::string& config_json, std::optional<int64_t> vocab_size,
                               const std::string& dir) {
  const std::string file = dir + "/tokenizer.json";
  const json tok = parse_json(tokenizer_json, file);
  const auto model_it = tok.find("model");
  if (model_it == tok.end() || !model_it->is_object()) {
    fail_invalid("'" + file + "' has no \"model\" object; re-save the tokenizer");
  }
  const json& model = *model_it;
  const std::string type = str_or(model, "type", "BPE");
  if (type != "BPE") {
    fail_unsupported("'" + file + "' is a " + type +
                     " tokenizer; GGUF export handles byte-level BPE (tokenizer.ggml.model gpt2)");
  }
  if (bool_or(model, "byte_fallback", false)) {
    fail_unsupported("'" + file + "' is a SentencePiece-style BPE (byte_fallback) and the folder "
                     "has no tokenizer.model; GGUF export reads such a vocabulary from "
                     "tokenizer.model: copy it beside config.json");
  }
  const auto vocab_it = model.find("vocab");
  if (vocab_it == model.end() || !vocab_it->is_object()) {
    fail_invalid("'" + file + "' has no model.vocab object");
  }
  std::map<int64_t, std::string> by_id;
  for (const auto& [text, id] : vocab_it->items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0) {
      fail_invalid("'" + file + "': token '" + text + "' has id " + id.dump());
    }
    by_id[id.get<int64_t>()] = text;
  }
  struct Added {
    bool special = false;
  };
  std::map<int64_t, Added> added;
  json added_tokens = tok.contains("added_tokens") ? tok["added_tokens"] : json::array();
  if (!added_tokens.is_array()) fail_invalid("'" + file + "': added_tokens is not an array");
  for (const auto& a : added_tokens) {
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
        a["id"].get<int64_t>() < 0 || !a.contains("content") || !a["content"].is_string()) {
      fail_invalid("'" + file + "': an added token lacks an integer id or a content string");
    }
    const int64_t id = a["id"].get<int64_t>();
    by_id[id] = a["content"].get<std::string>();
    added[id].special = bool_or(a, "special", false);
  }
  const int64_t max_id = by_id.empty() ? -1 : by_id.rbegin()->first;
  const int64_t n = vocab_size.value_or(max_id + 1);
  if (max_id >= n) {
    fail_invalid("'" + file + "' has token id " + std::to_string(max_id) +
                 ", past config.json's vocab_size " + std::to_string(n) +
                 "; the tokenizer does not belong to this model");
  }
  if (n > kMaxVocab) {
    fail_invalid("'" + file + "': a vocabulary of " + std::to_string(n) + " tokens is past the " +
                 std::to_string(kMaxVocab) + " qforge accepts");
  }
  HfTokenizer t;
  std::tie(t.pre, t.pre_reason) = detect_pre(tok);
  t.tokens.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const auto it = by_id.find(i);
    if (it == by_id.end()) {
      t.tokens.push_back("[PAD" + std::to_string(i) + "]");
      t.token_types.push_back(static_cast<int32_t>(GgufTokenType::Unused));
      continue;
    }
    std::string text = it->second;
    GgufTokenType kind = GgufTokenType::Normal;
    if (const auto a = added.find(i); a != added.end()) {
      if (a->second.special || looks_special(text)) {
        kind = GgufTokenType::Control;
      } else {
        kind = GgufTokenType::UserDefined;
        text = replace_metaspace(text);  // pre-normalized user-defined spaces
      }
    }
    t.tokens.push_back(std::move(text));
    t.token_types.push_back(static_cast<int32_t>(kind));
  }
  t.merges = read_merges(model, file);
  add_special_vocab(t, added_tokens, tokenizer_config_json, config_json, dir);
  return t;
}

HfTokenizer parse_sentencepiece_tokenizer(const std::string& model_proto,
                                          const std::string& added_tokens_json,
                                          const std::string& tokenizer_json,
                                          const std::string& tokenizer_config_json,
                                          const std::string& config_json,
                                          std::optional<int64_t> vocab_size,
                                          const std::string& dir) {
  const std::string file = dir + "/tokenizer.model";
  spm::ModelProto proto;
  if (!proto.ParseFromString(model_proto) || proto.pieces_size() == 0) {
    fail_invalid("'" + file + "' is not a SentencePiece model (no pieces could be read); "
                 "re-save the tokenizer with save_pretrained");
  }
  const int64_t pieces = proto.pieces_size();
  const int64_t n = vocab_size.value_or(pieces);
  if (n <= 0 || n > kMaxVocab) {
    fail_invalid("'" + file + "': a vocabulary of " + std::to_string(n) + " tokens is outside "
                 "the 1.." + std::to_string(kMaxVocab) + " qforge accepts");
  }
  HfTokenizer t;
  t.model = "llama";
  t.pre = "default";
  const auto un = static_cast<size_t>(n);
  t.tokens.resize(un);
  t.scores.assign(un, -10000.0f);
  t.token_types.assign(un, static_cast<int32_t>(GgufTokenType::Unused));
  for (int64_t i = 0; i < n; ++i) t.tokens[static_cast<size_t>(i)] = "[PAD" + std::to_string(i) + "]";
  if (pieces > n) {
    spdlog::warn("'{}' has {} pieces, past config.json's vocab_size {}: pieces from id {} are "
                 "left out, as llama.cpp's converter leaves them", file, pieces, n, n);
  }
  using Piece = spm::ModelProto::SentencePiece;
  for (int64_t i = 0; i < std::min(pieces, n); ++i) {
    const Piece& p = proto.pieces(static_cast<int>(i));
    GgufTokenType kind = GgufTokenType::Normal;
    switch (p.type()) {
      case Piece::UNKNOWN: kind = GgufTokenType::Unknown; break;
      case Piece::CONTROL: kind = GgufTokenType::Control; break;
      case Piece::UNUSED: kind = GgufTokenType::Unused; break;
      case Piece::BYTE: kind = GgufTokenType::Byte; break;
      default: break;  // NORMAL and USER_DEFINED pieces are normal tokens to the converter
    }
    const auto at = static_cast<size_t>(i);
    t.tokens[at] = p.piece();
    t.scores[at] = p.score();
    t.token_types[at] = static_cast<int32_t>(kind);
  }
  // added_tokens.json: {"text": id}, in the file's order.
  if (!added_tokens_json.empty()) {
    const auto added = nlohmann::ordered_json::parse(added_tokens_json, nullptr, false);
    if (!added.is_object()) {
      fail_invalid("'" + dir + "/added_tokens.json' is not a JSON object of token ids");
    }
    for (const auto& [text, id] : added.items()) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= n) continue;
      const auto at = static_cast<size_t>(id.get<int64_t>());
      t.tokens[at] = text;
      t.scores[at] = -1000.0f;
      t.token_types[at] = static_cast<int32_t>(GgufTokenType::UserDefined);
    }
  }
  // tokenizer_config.json's added_tokens_decoder: {"id": {"content": ..., "special": ...}}.
  if (!tokenizer_config_json.empty()) {
    const auto tc = nlohmann::ordered_json::parse(tokenizer_config_json, nullptr, false);
    const auto decoder = tc.is_object() ? tc.find("added_tokens_decoder") : tc.end();
    if (tc.is_object() && decoder != tc.end() && decoder->is_object()) {
      for (const auto& [key, entry] : decoder->items()) {
        int64_t id = -1;
        try {
          size_t used = 0;
          id = std::stoll(key, &used);
          if (used != key.size()) id = -1;
        } catch (const std::exception&) {
          id = -1;
        }
        if (id < 0 || id >= n || !entry.is_object() || !entry.contains("content") ||
            !entry["content"].is_string()) {
          continue;
        }
        std::string text = entry["content"].get<std::string>();
        const auto at = static_cast<size_t>(id);
        const bool special = entry.contains("special") && entry["special"].is_boolean() &&
                             entry["special"].get<bool>();
        if (special || looks_special(text)) {
          t.token_types[at] = static_cast<int32_t>(GgufTokenType::Control);
        } else {
          text = replace_metaspace(text);  // pre-normalized user-defined spaces
          t.token_types[at] = static_cast<int32_t>(GgufTokenType::UserDefined);
        }
        t.scores[at] = -1000.0f;
        t.tokens[at] = std::move(text);
      }
    }
  }
  json added_tokens = json::array();
  if (!tokenizer_json.empty()) {
    const json tok = parse_json(tokenizer_json, dir + "/tokenizer.json");
    if (const auto it = tok.find("added_tokens"); it != tok.end() && it->is_array()) {
      for (const auto& a : *it) {
        if (a.is_object() && a.contains("id") && a["id"].is_number_integer() &&
            a.contains("content") && a["content"].is_string()) {
          added_tokens.push_back(a);
        }
      }
    }
  }
  add_special_vocab(t, added_tokens, tokenizer_config_json, config_json, dir);
  return t;
}

namespace {

std::string read_text(const std::filesystem::path& p, bool required) {
  std::ifstream in(p, std::ios::binary);
  if (!in) {
    if (required) fail_io("cannot read '" + p.string() + "'");
    return {};
  }
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

HfTokenizer read_hf_tokenizer(const std::filesystem::path& dir,
                              std::optional<int64_t> vocab_size) {
  if (std::filesystem::is_regular_file(dir / "tokenizer.model")) {
    return parse_sentencepiece_tokenizer(
        read_text(dir / "tokenizer.model", true), read_text(dir / "added_tokens.json", false),
        read_text(dir / "tokenizer.json", false), read_text(dir / "tokenizer_config.json", false),
        read_text(dir / "config.json", false), vocab_size, dir.string());
  }
  if (!std::filesystem::is_regular_file(dir / "tokenizer.json")) {
    fail_io(std::string("'").append(dir.string()).append(
        "' has no tokenizer.json or tokenizer.model; GGUF export needs the vocabulary (copy "
        "the tokenizer files beside config.json)"));
  }
  return parse_hf_tokenizer(read_text(dir / "tokenizer.json", true),
                            read_text(dir / "tokenizer_config.json", false),
                            read_text(dir / "config.json", false), vocab_size, dir.string());
}

}  // namespace qforge
