// A SentencePiece tokenizer.model as llama.cpp's converter (_create_vocab_sentencepiece) puts it
// into GGUF: pieces with their scores, types by SentencePiece type (user-defined pieces count as
// normal), "[PAD<i>]" up to config.json's vocab_size, added_tokens.json and tokenizer_config's
// added_tokens_decoder over the pieces with score -1000, and refusals of what is not a model.
#include <gtest/gtest.h>

#include <string>

#include "importers/hf/hf_tokenizer.h"
#include "importers/hf/sentencepiece_model.pb.h"
#include "ir/error.h"

using namespace qforge;

namespace {

using Piece = spm::ModelProto::SentencePiece;

std::string model_bytes() {
  spm::ModelProto m;
  const std::pair<const char*, Piece::Type> pieces[] = {
      {"<unk>", Piece::UNKNOWN}, {"<s>", Piece::CONTROL}, {"</s>", Piece::CONTROL},
      {"<0x41>", Piece::BYTE},   {"<tool>", Piece::USER_DEFINED}, {"\xe2\x96\x81the", Piece::NORMAL},
      {"zz", Piece::UNUSED}};
  float score = 0.0f;
  for (const auto& [text, type] : pieces) {
    Piece* p = m.add_pieces();
    p->set_piece(text);
    p->set_score(score -= 1.5f);
    p->set_type(type);
  }
  return m.SerializeAsString();
}

int32_t type(GgufTokenType t) { return static_cast<int32_t>(t); }

}  // namespace

TEST(SentencePieceTokenizer, PiecesScoresAndTypesAsTheConverterWritesThem) {
  const HfTokenizer t = parse_sentencepiece_tokenizer(
      model_bytes(), "", "", R"({"bos_token":"<s>","add_bos_token":true,"add_prefix_space":false})",
      R"({"bos_token_id":1,"eos_token_id":2})", 9, "dir");
  EXPECT_EQ(t.model, "llama");
  EXPECT_EQ(t.pre, "default");
  EXPECT_TRUE(t.merges.empty());
  ASSERT_EQ(t.tokens.size(), 9u);
  ASSERT_EQ(t.scores.size(), 9u);
  EXPECT_EQ(t.tokens[5], "\xe2\x96\x81the");
  EXPECT_EQ(t.tokens[7], "[PAD7]");
  EXPECT_FLOAT_EQ(t.scores[0], -1.5f);
  EXPECT_FLOAT_EQ(t.scores[6], -10.5f);
  EXPECT_FLOAT_EQ(t.scores[8], -10000.0f);
  const std::vector<int32_t> want = {
      type(GgufTokenType::Unknown), type(GgufTokenType::Control), type(GgufTokenType::Control),
      type(GgufTokenType::Byte),    type(GgufTokenType::Normal),  type(GgufTokenType::Normal),
      type(GgufTokenType::Unused),  type(GgufTokenType::Unused),  type(GgufTokenType::Unused)};
  EXPECT_EQ(t.token_types, want);
  ASSERT_TRUE(t.add_bos.has_value());
  EXPECT_TRUE(*t.add_bos);
  ASSERT_TRUE(t.add_space_prefix.has_value());
  EXPECT_FALSE(*t.add_space_prefix);
  ASSERT_EQ(t.special_ids.size(), 2u);
  EXPECT_EQ(t.special_ids[0], std::make_pair(std::string("bos"), 1u));
  EXPECT_EQ(t.special_ids[1], std::make_pair(std::string("eos"), 2u));
}

TEST(SentencePieceTokenizer, AddedTokensOverridePiecesWithScoreMinus1000) {
  const HfTokenizer t = parse_sentencepiece_tokenizer(
      model_bytes(), R"({"<extra>": 7, "<past>": 99})", "",
      R"({"added_tokens_decoder":{"0":{"content":"<unk>","special":true},)"
      R"("8":{"content":"my)" "\xe2\x96\x81" R"(word","special":false},"x":{"content":"bad"}}})",
      "", 9, "dir");
  EXPECT_EQ(t.tokens[7], "<extra>");
  EXPECT_EQ(t.token_types[7], type(GgufTokenType::UserDefined));
  EXPECT_FLOAT_EQ(t.scores[7], -1000.0f);
  EXPECT_EQ(t.token_types[0], type(GgufTokenType::Control));  // special in the decoder
  EXPECT_FLOAT_EQ(t.scores[0], -1000.0f);
  EXPECT_EQ(t.tokens[8], "my word");  // user-defined spaces pre-normalized
  EXPECT_EQ(t.token_types[8], type(GgufTokenType::UserDefined));
}

TEST(SentencePieceTokenizer, MorePiecesThanTheVocabularyAreLeftOut) {
  const HfTokenizer t = parse_sentencepiece_tokenizer(model_bytes(), "", "", "", "", 4, "dir");
  ASSERT_EQ(t.tokens.size(), 4u);
  EXPECT_EQ(t.tokens[3], "<0x41>");
}

TEST(SentencePieceTokenizer, WhatIsNotAModelIsRefusedNamingTheFile) {
  for (const std::string& bytes : {std::string(), std::string("\xff\xff\xff\xff", 4),
                                  model_bytes().substr(0, 9)}) {
    try {
      parse_sentencepiece_tokenizer(bytes, "", "", "", "", std::nullopt, "dir");
      FAIL() << "accepted " << bytes.size() << " bytes";
    } catch (const Error& e) {
      EXPECT_EQ(e.category(), ErrorCategory::InvalidInput);
      EXPECT_NE(std::string(e.what()).find("dir/tokenizer.model"), std::string::npos) << e.what();
    }
  }
}
