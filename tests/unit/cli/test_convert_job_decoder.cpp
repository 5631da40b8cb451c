// The convert driver on a model folder with an .onnx output: the decoder graph is built from
// config.json and written (inputs input_ids and attention_mask, output logits); a model_type
// qforge does not build is refused by name with nothing written. Agreement with transformers is
// tests/interop/test_hf_decoder.py.
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <string>

#include "cli/convert_job.h"
#include "exporters/safetensors/safetensors_writer.h"
#include "importers/load_model.h"
#include "ir/error.h"
#include "runtime/executor.h"
#include "tests/unit/temp_dir.h"

namespace qforge::cli {
namespace {

namespace fs = std::filesystem;

// A tiny Llama folder (hidden 16, one layer, vocab 20) stored in bf16, or the same tensors under
// another model_type.
void write_folder(const fs::path& dir, const std::string& model_type) {
  fs::create_directories(dir);
  std::ofstream(dir / "config.json")
      << R"({"model_type": ")" << model_type
      << R"(", "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 1,
            "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 20,
            "tie_word_embeddings": true, "rms_norm_eps": 1e-6, "dtype": "bfloat16"})";
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 0.3f);
  Graph g;
  auto add = [&](const std::string& name, Shape shape) {
    std::vector<float> v(shape_numel(shape));
    for (float& x : v) x = dist(rng);
    g.set_initializer(name, Tensor::from_f32(v, shape, DType::BF16));
  };
  add("model.embed_tokens.weight", {20, 16});
  add("model.layers.0.input_layernorm.weight", {16});
  add("model.layers.0.self_attn.q_proj.weight", {16, 16});
  add("model.layers.0.self_attn.k_proj.weight", {8, 16});
  add("model.layers.0.self_attn.v_proj.weight", {8, 16});
  add("model.layers.0.self_attn.o_proj.weight", {16, 16});
  add("model.layers.0.post_attention_layernorm.weight", {16});
  add("model.layers.0.mlp.gate_proj.weight", {24, 16});
  add("model.layers.0.mlp.up_proj.weight", {24, 16});
  add("model.layers.0.mlp.down_proj.weight", {16, 24});
  add("model.norm.weight", {16});
  export_safetensors(g, (dir / "model.safetensors").string(), {});
}

TEST(ConvertDecoder, FolderToOnnxWritesTheDecoderGraph) {
  const test::TempDir tmp;
  write_folder(tmp / "llama", "llama");
  ConvertOptions o;
  o.input = (tmp / "llama").string();
  o.output = (tmp / "m.onnx").string();
  convert_model(o);
  const Graph g = load_model(o.output).graph;
  ASSERT_EQ(g.inputs.size(), 2u);
  EXPECT_EQ(g.inputs[0].name, "input_ids");
  EXPECT_EQ(g.inputs[1].name, "attention_mask");
  ASSERT_EQ(g.outputs.size(), 1u);
  EXPECT_EQ(g.outputs[0].name, "logits");
  EXPECT_EQ(g.find_initializer("model.layers.0.self_attn.q_proj.weight")->dtype(), DType::F32);
  Tensor ids(DType::I64, {1, 5}), mask(DType::I64, {1, 5});
  for (int64_t i = 0; i < 5; ++i) {
    ids.mutable_data<int64_t>()[static_cast<size_t>(i)] = 3 * i + 1;
    mask.mutable_data<int64_t>()[static_cast<size_t>(i)] = 1;
  }
  const Tensor logits = Executor(g).run({{"input_ids", ids}, {"attention_mask", mask}}).at(0);
  EXPECT_EQ(logits.shape(), (Shape{1, 5, 20}));
}

TEST(ConvertDecoder, UnsupportedModelTypeIsRefusedByName) {
  const test::TempDir tmp;
  write_folder(tmp / "gpt2", "gpt2");
  ConvertOptions o;
  o.input = (tmp / "gpt2").string();
  o.output = (tmp / "m.onnx").string();
  try {
    convert_model(o);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::Unsupported);
    const std::string m = e.what();
    EXPECT_NE(m.find("model_type 'gpt2'"), std::string::npos) << m;
    EXPECT_NE(m.find("llama, mistral, qwen2, qwen3, phi3"), std::string::npos) << m;
  }
  EXPECT_FALSE(fs::exists(o.output));
  // A weights-only output still takes the folder as it is.
  o.output = (tmp / "w.safetensors").string();
  convert_model(o);
  EXPECT_TRUE(load_model(o.output).graph.nodes.empty());
}

}  // namespace
}  // namespace qforge::cli
