// tokenizer.json as llama.cpp's converter puts it into GGUF: tokens in id order with holes
// filled by "[PAD<i>]", token types, merges in both JSON forms, special ids from
// tokenizer_config.json then config.json, the pre-tokenizer name, and refusals.
#include <gtest/gtest.h>

#include <string>

#include "importers/hf/hf_decoder_facts.h"
#include "importers/hf/hf_tokenizer.h"
#include "ir/error.h"

using namespace qforge;

namespace {

const char* kLlama3Pre =
    R"({"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},{"type":"ByteLevel","use_regex":false}]})";

std::string tokenizer_json(const std::string& pre, const std::string& merges) {
  return R"({"added_tokens":[{"id":4,"content":"<|bos|>","special":true},)"
         R"({"id":5,"content":"<|im_start|>","special":false},)"
         R"({"id":6,"content":"my)"
         "\xe2\x96\x81"
         R"(word","special":false}],"pre_tokenizer":)" +
         pre + R"(,"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2,"\u0120a":3},"merges":)" +
         merges + "}}";
}

}  // namespace

TEST(HfTokenizer, TokensTypesAndPadding) {
  const auto t = parse_hf_tokenizer(tokenizer_json(R"({"type":"ByteLevel"})", R"(["a b"])"), "",
                                    "", 9, "dir");
  ASSERT_EQ(t.tokens.size(), 9u);
  EXPECT_EQ(t.tokens[2], "ab");
  EXPECT_EQ(t.tokens[3], "\xc4\xa0" "a");
  EXPECT_EQ(t.tokens[4], "<|bos|>");
  EXPECT_EQ(t.tokens[6], "my word");  // a user-defined token's U+2581 becomes a space
  EXPECT_EQ(t.tokens[7], "[PAD7]");
  const std::vector<int32_t> types = {1, 1, 1, 1, 3, 3, 4, 5, 5};  // <|..|> looks special
  EXPECT_EQ(t.token_types, types);
  EXPECT_EQ(t.pre, "gpt-2");
  EXPECT_EQ(t.merges, std::vector<std::string>{"a b"});
}

TEST(HfTokenizer, PairMergesEncodeSpacesAsU0120) {
  const auto t = parse_hf_tokenizer(tokenizer_json(kLlama3Pre, R"([["a","b"],["a b","c"]])"), "",
                                    "", std::nullopt, "dir");
  EXPECT_EQ(t.merges, (std::vector<std::string>{"a b", "a\xc4\xa0" "b c"}));
  EXPECT_EQ(t.pre, "llama-bpe");
  EXPECT_EQ(t.tokens.size(), 7u);
}

TEST(HfTokenizer, SpecialIdsFromTokenizerConfigThenConfig) {
  const auto t = parse_hf_tokenizer(
      tokenizer_json(R"({"type":"ByteLevel"})", "[]"),
      R"({"bos_token":{"content":"<|bos|>"},"add_bos_token":false,"chat_template":"{{x}}"})",
      R"({"bos_token_id":0,"eos_token_id":5,"pad_token_id":99})", std::nullopt, "dir");
  ASSERT_EQ(t.special_ids.size(), 2u);  // pad 99 is past the vocabulary: left out
  EXPECT_EQ(t.special_ids[0], (std::pair<std::string, uint32_t>{"bos", 4}));  // config's 0 loses
  EXPECT_EQ(t.special_ids[1], (std::pair<std::string, uint32_t>{"eos", 5}));
  EXPECT_EQ(t.add_bos, false);
  EXPECT_FALSE(t.add_eos.has_value());
  EXPECT_EQ(t.chat_template, "{{x}}");
}

TEST(HfTokenizer, UnknownPreTokenizerIsDefaultWithAReason) {
  const auto t = parse_hf_tokenizer(tokenizer_json(R"({"type":"Whitespace"})", "[]"), "", "",
                                    std::nullopt, "dir");
  EXPECT_EQ(t.pre, "default");
  EXPECT_NE(t.pre_reason.find("Whitespace"), std::string::npos);
}

TEST(HfTokenizer, RefusesSentencePieceAndOverflowingIds) {
  const std::string sp =
      R"({"model":{"type":"BPE","byte_fallback":true,"vocab":{"a":0},"merges":[]}})";
  try {
    parse_hf_tokenizer(sp, "", "", std::nullopt, "dir");
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::Unsupported);
  }
  const std::string unigram = R"({"model":{"type":"Unigram","vocab":[]}})";
  EXPECT_THROW(parse_hf_tokenizer(unigram, "", "", std::nullopt, "dir"), Error);
  try {
    parse_hf_tokenizer(tokenizer_json(R"({"type":"ByteLevel"})", "[]"), "", "", 5, "dir");
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::InvalidInput);
    EXPECT_NE(std::string(e.what()).find("vocab_size 5"), std::string::npos) << e.what();
  }
  const std::string huge = R"({"model":{"type":"BPE","vocab":{"a":4611686018427387904}}})";
  EXPECT_THROW(parse_hf_tokenizer(huge, "", "", std::nullopt, "dir"), Error);
}

TEST(HfDecoderFacts, ReadsEpsHeadDimAndRopeType) {
  const auto f = parse_hf_decoder_facts(
      R"({"rms_norm_eps":1e-6,"head_dim":128,"rope_scaling":{"rope_type":"llama3"}})", "c");
  EXPECT_EQ(f.rms_norm_eps, 1e-6);
  EXPECT_TRUE(f.head_dim_given);
  EXPECT_EQ(f.rope_type, "llama3");
  const auto g = parse_hf_decoder_facts(
      R"({"rope_parameters":{"rope_type":"default","rope_theta":10000}})", "c");
  EXPECT_FALSE(g.rms_norm_eps.has_value());
  EXPECT_EQ(g.rope_type, "default");
  EXPECT_THROW(parse_hf_decoder_facts(R"({"rms_norm_eps":"x"})", "c"), Error);
  EXPECT_THROW(parse_hf_decoder_facts("[1]", "c"), Error);
}

TEST(HfTokenizer, KeysOfTheWrongTypeAreIgnoredNotThrownAsJsonErrors) {
  // A fuzzed file: "type" holding an array, "byte_fallback" a string. json::value would throw a
  // type_error; the reader treats them as absent.
  const auto t = parse_hf_tokenizer(
      R"({"pre_tokenizer":{"type":["ByteLevel"]},"model":{"type":"BPE","byte_fallback":"no",)"
      R"("vocab":{"a":0},"merges":[]},"added_tokens":[{"id":1,"content":"b","special":"x"}]})",
      "", "", std::nullopt, "dir");
  EXPECT_EQ(t.pre, "default");
  EXPECT_EQ(t.tokens.size(), 2u);
}
