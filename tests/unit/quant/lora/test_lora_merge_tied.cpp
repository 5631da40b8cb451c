// Tied weights: a LoRA delta merged into one alias reaches every alias, as PEFT's merge into the
// one shared tensor does; a merge that would break a tie is refused.
#include <gtest/gtest.h>

#include "ir/tied_weights.h"
#include "quant/lora/lora_merge.h"
#include "tests/unit/quant/lora/lora_test_util.h"

using namespace qforge;
using namespace qforge::lora_test;

namespace {

constexpr int64_t kVocab = 8;
constexpr int64_t kHidden = 4;
constexpr int64_t kRank = 2;

// A Linear adapter on lm_head ([vocab, hidden]), scaling 2 / 2 = 1.
Graph lm_head_factors() {
  Graph w;
  w.set_initializer("base_model.model.lm_head.lora_A.weight", random_tensor({kRank, kHidden}, 11));
  w.set_initializer("base_model.model.lm_head.lora_B.weight", random_tensor({kVocab, kRank}, 12));
  return w;
}

// An Embedding adapter on embed_tokens: A [r, vocab], B [hidden, r]; delta = (B A)^T.
Graph embedding_factors() {
  Graph w;
  w.set_initializer("base_model.model.model.embed_tokens.lora_embedding_A",
                    random_tensor({kRank, kVocab}, 13));
  w.set_initializer("base_model.model.model.embed_tokens.lora_embedding_B",
                    random_tensor({kHidden, kRank}, 14));
  return w;
}

std::vector<float> lm_head_delta(const Graph& f) {
  return ref_delta(f.find_initializer("base_model.model.lm_head.lora_A.weight")->to_f32(),
                   f.find_initializer("base_model.model.lm_head.lora_B.weight")->to_f32(), kVocab,
                   kHidden, kRank, 1.0f);
}

std::vector<float> embedding_delta(const Graph& f) {
  const auto ba = ref_delta(
      f.find_initializer("base_model.model.model.embed_tokens.lora_embedding_A")->to_f32(),
      f.find_initializer("base_model.model.model.embed_tokens.lora_embedding_B")->to_f32(),
      kHidden, kVocab, kRank, 1.0f);
  return ref_transpose(ba, kHidden, kVocab);
}

std::vector<float> plus(std::vector<float> a, const std::vector<float>& b) {
  for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
  return a;
}

}  // namespace

TEST(LoraMergeTied, SharedStorageAliasesBothReceiveTheDelta) {
  Graph base;  // as a torch.save file of a tied model reads: two names, one storage window
  const Tensor embedding = random_tensor({kVocab, kHidden}, 3);
  base.set_initializer("model.embed_tokens.weight", embedding);
  base.set_initializer("lm_head.weight", embedding);
  const Graph factors = lm_head_factors();
  PassReport report;
  merge_lora(base, {{peft_adapter(config_json(2, 2), factors), 1.0}}, {}, report);
  const auto want = plus(embedding.to_f32(), lm_head_delta(factors));
  expect_near_all(base.find_initializer("lm_head.weight")->to_f32(), want, 1e-6f, "lm_head");
  expect_near_all(base.find_initializer("model.embed_tokens.weight")->to_f32(), want, 1e-6f,
                  "embed_tokens");
  EXPECT_EQ(base.find_initializer("lm_head.weight")->storage(),
            base.find_initializer("model.embed_tokens.weight")->storage());
  EXPECT_EQ(report.stats["tied_copies"], 1);
}

TEST(LoraMergeTied, DeltasOfBothAliasesAddUp) {
  Graph base;
  const Tensor embedding = random_tensor({kVocab, kHidden}, 3);
  base.set_initializer("lm_head.weight", embedding);
  base.set_initializer("model.embed_tokens.weight", embedding);
  const Graph head = lm_head_factors();
  const Graph emb = embedding_factors();
  PassReport report;
  merge_lora(base,
             {{peft_adapter(config_json(2, 2), head, "head"), 1.0},
              {peft_adapter(config_json(2, 2), emb, "emb"), 1.0}},
             {}, report);
  const auto want = plus(plus(embedding.to_f32(), lm_head_delta(head)), embedding_delta(emb));
  expect_near_all(base.find_initializer("lm_head.weight")->to_f32(), want, 1e-5f, "lm_head");
  expect_near_all(base.find_initializer("model.embed_tokens.weight")->to_f32(), want, 1e-5f,
                  "embed_tokens");
}

TEST(LoraMergeTied, ExporterTransposedCopyInAGraphGetsTheTransposedResult) {
  Graph base;  // an exporter's graph: Gather on the embedding, MatMul on its transposed copy
  const Tensor embedding = random_tensor({kVocab, kHidden}, 3);
  base.set_initializer("model.embed_tokens.weight", embedding);
  base.set_initializer("onnx::MatMul_9",
                       Tensor::from_f32(ref_transpose(embedding.to_f32(), kVocab, kHidden),
                                        {kHidden, kVocab}));
  base.inputs.push_back({"ids", DType::I64, std::nullopt, ""});
  Node gather{"/model/embed_tokens/Gather", "Gather", "", {"model.embed_tokens.weight", "ids"},
              {"h"}, {}, ""};
  Node matmul{"/lm_head/MatMul", "MatMul", "", {"h", "onnx::MatMul_9"}, {"logits"}, {}, ""};
  base.nodes = {gather, matmul};
  base.outputs.push_back({"logits", DType::F32, std::nullopt, ""});
  const Graph head = lm_head_factors();
  const Graph emb = embedding_factors();
  PassReport report;
  merge_lora(base,
             {{peft_adapter(config_json(2, 2), head, "head"), 1.0},
              {peft_adapter(config_json(2, 2), emb, "emb"), 1.0}},
             {}, report);
  const auto want = plus(plus(embedding.to_f32(), lm_head_delta(head)), embedding_delta(emb));
  expect_near_all(base.find_initializer("model.embed_tokens.weight")->to_f32(), want, 1e-5f,
                  "embedding");
  expect_near_all(base.find_initializer("onnx::MatMul_9")->to_f32(),
                  ref_transpose(want, kVocab, kHidden), 1e-5f, "transposed copy");
  EXPECT_EQ(report.stats["tied"][0]["how"], "transposed copy");
}

TEST(LoraMergeTied, RecordedTieBindsTheNameTheCheckpointLeftOut) {
  Graph base;  // save_pretrained of a tied model: no lm_head.weight, the tie in config.json
  const Tensor embedding = random_tensor({kVocab, kHidden}, 3);
  base.set_initializer("model.embed_tokens.weight", embedding);
  set_tied_weights(base, {{"lm_head.weight", "model.embed_tokens.weight"}});
  const Graph head = lm_head_factors();
  PassReport report;
  merge_lora(base, {{peft_adapter(config_json(2, 2), head), 1.0}}, {}, report);
  expect_near_all(base.find_initializer("model.embed_tokens.weight")->to_f32(),
                  plus(embedding.to_f32(), lm_head_delta(head)), 1e-6f, "embedding");
  EXPECT_FALSE(base.has_initializer("lm_head.weight"));
  EXPECT_EQ(report.stats["modules"][0]["match"], "tied");
}

TEST(LoraMergeTied, OverlappingViewIsRefusedAndNothingChanges) {
  Graph base;
  const Tensor whole = random_tensor({2 * kVocab, kHidden}, 3);
  // The second half of `whole` as its own tensor: a view the merge could not keep in step.
  base.set_initializer("qkv.weight", whole);
  base.set_initializer("lm_head.weight",
                       Tensor(DType::F32, {kVocab, kHidden}, whole.storage(),
                              whole.offset() + static_cast<size_t>(kVocab * kHidden * 4)));
  expect_error(
      [&] {
        PassReport r;
        merge_lora(base, {{peft_adapter(config_json(2, 2), lm_head_factors()), 1.0}}, {}, r);
      },
      ErrorCategory::Unsupported, {"'lm_head.weight'", "overlaps", "'qkv.weight'", "re-save"});
  EXPECT_TRUE(base.find_initializer("qkv.weight")->equals(whole));
}

TEST(LoraMergeTied, ModulesToSaveOfATiedWeightIsRefused) {
  Graph base;
  const Tensor embedding = random_tensor({kVocab, kHidden}, 3);
  base.set_initializer("model.embed_tokens.weight", embedding);
  set_tied_weights(base, {{"lm_head.weight", "model.embed_tokens.weight"}});
  Graph w;
  w.set_initializer("base_model.model.lm_head.weight",  // as PEFT saves modules_to_save
                    random_tensor({kVocab, kHidden}, 5));
  expect_error(
      [&] {
        PassReport r;
        merge_lora(base, {{peft_adapter(config_json(2, 2), w), 1.0}}, {}, r);
      },
      ErrorCategory::Unsupported, {"modules_to_save", "tied to 'model.embed_tokens.weight'",
                                   "tie_word_embeddings=False"});
  EXPECT_TRUE(base.find_initializer("model.embed_tokens.weight")->equals(embedding));
}
