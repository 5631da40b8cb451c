// compressed-tensors pack-quantized: the int32 packing of known values, and the folder written
// from the records alone (names, shapes, config, side files, shards), part by part.
#include "exporters/compressed_tensors/compressed_tensors_writer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "importers/load_model.h"
#include "importers/safetensors/safetensors_reader.h"
#include "ir/error.h"
#include "ir/quantized_linear.h"

using namespace qforge;

namespace {

namespace fs = std::filesystem;

std::string read_text(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

Tensor int4_values(const std::vector<int8_t>& q, Shape shape) {
  Tensor t(DType::I4, std::move(shape));
  auto b = t.mutable_data<uint8_t>();
  for (size_t i = 0; i < q.size(); ++i) {
    b[i / 2] = static_cast<uint8_t>(b[i / 2] | ((q[i] & 0x0f) << (4 * (i % 2))));
  }
  return t;
}

TEST(PackQuantizedInt32, Int4EightPerWordLowFirstOffsetBy8) {
  // Row 0: -8..7 (q + 8 = 0..15); row 1: all -1 (7 per nibble).
  std::vector<int8_t> q;
  for (int i = -8; i < 8; ++i) q.push_back(static_cast<int8_t>(i));
  for (int i = 0; i < 16; ++i) q.push_back(-1);
  const Tensor packed = pack_quantized_int32(int4_values(q, {2, 16}));
  ASSERT_EQ(packed.dtype(), DType::I32);
  ASSERT_EQ(packed.shape(), (Shape{2, 2}));
  const auto w = packed.data<uint32_t>();
  EXPECT_EQ(w[0], 0x76543210u);
  EXPECT_EQ(w[1], 0xfedcba98u);
  EXPECT_EQ(w[2], 0x77777777u);
  EXPECT_EQ(w[3], 0x77777777u);
}

TEST(PackQuantizedInt32, Int8FourPerWordOffsetBy128AndZeroPadding) {
  Tensor q(DType::I8, {1, 6});
  const int8_t v[6] = {-127, -1, 0, 1, 127, 5};
  std::copy(v, v + 6, q.mutable_data<int8_t>().begin());
  const Tensor packed = pack_quantized_int32(q);
  ASSERT_EQ(packed.shape(), (Shape{1, 2}));
  const auto w = packed.data<uint32_t>();
  EXPECT_EQ(w[0], 0x81807f01u);  // 1, 127, 128, 129 low byte first
  EXPECT_EQ(w[1], 0x000085ffu);  // 255, 133, then padding zeros
}

class CompressedTensorsWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("qforge_ctw_" +
             std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "src");
    std::ofstream(root_ / "src" / "config.json") << R"({"model_type": "llama", "hidden_size": 64})";
    std::ofstream(root_ / "src" / "tokenizer.json") << R"({"t": 1})";
  }
  void TearDown() override { fs::remove_all(root_); }

  // A part holding one quantized Linear [4, 64] (blocks of 32) and a float tensor.
  static Graph part(const std::string& module) {
    Graph g;
    g.set_initializer(module + ".weight", Tensor(DType::BF16, {4, 64}));
    std::vector<int8_t> q(4 * 64);
    for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<int8_t>(static_cast<int>(i % 16) - 8);
    store_quantized_linear(g, module + ".weight", int4_values(q, {4, 64}),
                           Tensor(DType::BF16, {4, 2}), 32);
    g.set_initializer(module + ".bias", Tensor(DType::BF16, {4}));
    return g;
  }
  fs::path root_;
};

TEST_F(CompressedTensorsWriterTest, WritesPackedScaleShapeAndConfigFromRecords) {
  CompressedTensorsOptions o;
  o.source_dir = root_ / "src";
  o.ignore = {"lm_head"};
  CompressedTensorsWriter w(root_ / "out/", o);
  w.add(part("model.layers.0.mlp.down_proj"));
  w.add(part("model.layers.1.mlp.down_proj"));  // a second part, written after the first
  w.finish();
  EXPECT_EQ(w.quantized_linears(), 2);
  const Graph back = import_safetensors(root_ / "out" / "model.safetensors");
  for (const char* m : {"model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"}) {
    const std::string p = m;
    ASSERT_NE(back.find_initializer(p + ".weight_packed"), nullptr);
    EXPECT_EQ(back.find_initializer(p + ".weight_packed")->shape(), (Shape{4, 8}));
    EXPECT_EQ(back.find_initializer(p + ".weight_packed")->data<uint32_t>()[0], 0x76543210u);
    EXPECT_EQ(back.find_initializer(p + ".weight_scale")->shape(), (Shape{4, 2}));
    EXPECT_EQ(back.find_initializer(p + ".weight_scale")->dtype(), DType::BF16);
    EXPECT_EQ(back.find_initializer(p + ".weight_shape")->data<int64_t>()[1], 64);
    EXPECT_EQ(back.find_initializer(p + ".weight"), nullptr);
    EXPECT_EQ(back.find_initializer(p + ".weight_scale_scale"), nullptr);
    EXPECT_NE(back.find_initializer(p + ".bias"), nullptr);
  }
  EXPECT_EQ(back.initializers().size(), 8u);
  const auto cfg = nlohmann::json::parse(read_text(root_ / "out" / "config.json"));
  EXPECT_EQ(cfg["model_type"], "llama");
  const auto& qc = cfg["quantization_config"];
  EXPECT_EQ(qc["quant_method"], "compressed-tensors");
  EXPECT_EQ(qc["format"], "pack-quantized");
  EXPECT_EQ(qc["ignore"], nlohmann::json::array({"lm_head"}));
  EXPECT_EQ(qc["config_groups"]["group_0"]["weights"]["group_size"], 32);
  EXPECT_EQ(qc["config_groups"]["group_0"]["weights"]["strategy"], "group");
  EXPECT_EQ(read_text(root_ / "out" / "tokenizer.json"), R"({"t": 1})");
}

TEST_F(CompressedTensorsWriterTest, PerChannelScaleBecomesNBy1AndShardsGetAnIndex) {
  Graph g;
  Tensor q(DType::I8, {4, 16});
  store_quantized_linear(g, "model.layers.0.self_attn.o_proj.weight", q, Tensor(DType::F32, {4}),
                         0);
  g.set_initializer("model.norm.weight", Tensor(DType::F32, {64}));
  CompressedTensorsOptions o;
  o.max_shard_size = 100;  // the norm (256 bytes) gets a shard of its own
  write_compressed_tensors(g, root_ / "out", o);
  EXPECT_TRUE(fs::exists(root_ / "out" / "model.safetensors.index.json"));
  const Graph back = load_model(root_ / "out" / "model.safetensors.index.json").graph;
  EXPECT_EQ(back.find_initializer("model.layers.0.self_attn.o_proj.weight_scale")->shape(),
            (Shape{4, 1}));
  EXPECT_EQ(back.find_initializer("model.layers.0.self_attn.o_proj.weight_packed")->shape(),
            (Shape{4, 4}));
  EXPECT_NE(back.find_initializer("model.norm.weight"), nullptr);
}

TEST_F(CompressedTensorsWriterTest, AFailureLeavesNothingBehind) {
  Graph g = part("model.layers.0.mlp.up_proj");
  Graph bad;
  store_quantized_linear(bad, "not_a_module", Tensor(DType::I8, {2, 4}), Tensor(DType::F32, {2}),
                         0);
  {
    CompressedTensorsOptions o;
    CompressedTensorsWriter w(root_ / "out", o);
    w.add(g);
    EXPECT_THROW(w.add(bad), Error);
  }
  EXPECT_FALSE(fs::exists(root_ / "out"));
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(root_)) left.push_back(e.path().filename().string());
  EXPECT_EQ(left, (std::vector<std::string>{"src"}));
}

TEST_F(CompressedTensorsWriterTest, RecordsOfAGraphNodeAreRefused) {
  Graph g = part("model.layers.0.mlp.up_proj");
  QuantRecord r = *g.find_quant_record("model.layers.0.mlp.up_proj.weight");
  r.reader = "dq_out";
  g.add_quant_record(r);
  CompressedTensorsWriter w(root_ / "out", {});
  EXPECT_THROW(w.add(g), Error);
}

}  // namespace
