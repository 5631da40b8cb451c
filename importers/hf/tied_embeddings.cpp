#include "importers/hf/tied_embeddings.h"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "ir/tied_weights.h"

namespace qforge {

namespace {

// Input embeddings of the decoder families that tie lm_head.weight to them.
constexpr const char* kInputEmbeddings[] = {
    "model.embed_tokens.weight",          // Llama, Mistral, Qwen2, Gemma, Phi-3, ...
    "model.decoder.embed_tokens.weight",  // OPT
    "transformer.wte.weight",             // GPT-2, GPT-J, Falcon (transformer.word_embeddings)
    "transformer.word_embeddings.weight",
    "model.embed_in.weight",
};
constexpr const char* kOutputProjection = "lm_head.weight";

}  // namespace

void record_tied_embeddings(const std::filesystem::path& checkpoint, Graph& graph) {
  const std::filesystem::path config = checkpoint.parent_path() / "config.json";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(config, ec)) return;
  std::ifstream in(config, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  const auto json = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (!json.is_object()) {
    spdlog::warn("'{}' is not a JSON object; tie_word_embeddings not read from it",
                 config.string());
    return;
  }
  const auto tie = json.find("tie_word_embeddings");
  const bool has_head = graph.has_initializer(kOutputProjection);
  const bool tied = tie != json.end() ? (tie->is_boolean() && tie->get<bool>()) : !has_head;
  if (!tied) return;
  for (const char* embedding : kInputEmbeddings) {
    const Tensor* e = graph.find_initializer(embedding);
    if (e == nullptr) continue;
    const Tensor* head = graph.find_initializer(kOutputProjection);
    if (head != nullptr && head->shape() != e->shape()) return;  // not the same matrix: no tie
    set_tied_weights(graph, {{kOutputProjection, embedding}});
    return;
  }
}

}  // namespace qforge
