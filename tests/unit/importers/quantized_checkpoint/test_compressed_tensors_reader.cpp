// compressed-tensors pack-quantized read back: the integers and scales of known values, the
// round trip through qforge's writer and load_model, and hand-made corrupt checkpoints (config
// and tensors disagreeing) refused naming the tensor.
#include "importers/quantized_checkpoint/compressed_tensors_reader.h"

#include <gtest/gtest.h>

#include <fstream>

#include "exporters/compressed_tensors/compressed_tensors_writer.h"
#include "importers/load_model.h"
#include "ir/error.h"
#include "ir/quantized_linear.h"
#include "../../temp_dir.h"

using namespace qforge;

namespace {

namespace fs = std::filesystem;

const std::string kModule = "model.layers.0.mlp.down_proj";

// q[r][c] = ((r * 7 + c) % 2^bits) - 2^(bits-1): every value of the range appears.
int q_at(int bits, int64_t r, int64_t c) {
  const int span = 1 << bits;
  return static_cast<int>((r * 7 + c) % span) - span / 2;
}

Tensor values(int bits, int64_t n, int64_t k) {
  Tensor t(bits == 4 ? DType::I4 : DType::I8, {n, k});
  auto b = t.mutable_data<uint8_t>();
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      const int64_t e = r * k + c;
      const int q = q_at(bits, r, c);
      if (bits == 4) {
        b[static_cast<size_t>(e / 2)] |= static_cast<uint8_t>((q & 0x0f) << (4 * (e % 2)));
      } else {
        b[static_cast<size_t>(e)] = static_cast<uint8_t>(static_cast<int8_t>(q));
      }
    }
  }
  return t;
}

Tensor scales(Shape shape) {
  std::vector<float> v(static_cast<size_t>(shape[0] * (shape.size() > 1 ? shape[1] : 1)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.01f * static_cast<float>(i + 1);
  return Tensor::from_f32(v, std::move(shape));
}

// The tensors a compressed-tensors writer stores for one Linear [n, k].
Graph raw(int bits, int64_t group, int64_t n = 4, int64_t k = 64) {
  Graph g;
  g.set_initializer(kModule + ".weight_packed", pack_quantized_int32(values(bits, n, k)));
  g.set_initializer(kModule + ".weight_scale", scales(group > 0 ? Shape{n, k / group}
                                                                : Shape{n, 1}));
  Tensor shape(DType::I64, {2});
  shape.mutable_data<int64_t>()[0] = n;
  shape.mutable_data<int64_t>()[1] = k;
  g.set_initializer(kModule + ".weight_shape", shape);
  g.set_initializer("model.norm.weight", Tensor(DType::F32, {64}));
  return g;
}

std::string config(int bits, int64_t group, const std::string& extra_weights = "",
                   const std::string& ignore = R"(["lm_head"])") {
  const std::string strategy = group > 0 ? "group" : "channel";
  const std::string gs = group > 0 ? std::to_string(group) : "null";
  return R"({"model_type": "llama", "quantization_config": {"quant_method": "compressed-tensors",
    "format": "pack-quantized", "quantization_status": "compressed", "ignore": )" + ignore +
         R"(, "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": null,
    "weights": {"num_bits": )" + std::to_string(bits) + R"(, "type": "int", "symmetric": true,
    "strategy": ")" + strategy + R"(", "group_size": )" + gs + extra_weights + "}}}}}";
}

// The InvalidInput message of reading `g` with `cfg`; "" when it reads.
std::string invalid_message(Graph g, const std::string& cfg,
                            ErrorCategory want = ErrorCategory::InvalidInput) {
  try {
    read_compressed_tensors(cfg, "q/config.json", g);
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), want) << e.what();
    return e.what();
  }
  return "";
}

TEST(CompressedTensorsReader, Int4GroupsUnpackToTheIntegersAndKeepTheScale) {
  Graph g = raw(4, 32);
  const QuantizedCheckpoint q = read_compressed_tensors(config(4, 32), "q/config.json", g);
  EXPECT_EQ(q.quant_method, "compressed-tensors");
  EXPECT_EQ(q.format, "pack-quantized");
  EXPECT_EQ(q.quantized_linears, 1);
  ASSERT_EQ(q.schemes.size(), 1u);
  EXPECT_EQ(q.schemes[0].bits, 4);
  EXPECT_EQ(q.schemes[0].group_size, 32);
  EXPECT_EQ(q.ignore, (std::vector<std::string>{"lm_head"}));
  const Tensor* w = g.find_initializer(kModule + ".weight");
  ASSERT_NE(w, nullptr);
  EXPECT_TRUE(w->equals(values(4, 4, 64)));
  const QuantRecord* r = g.find_quant_record(kModule + ".weight");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->bits, 4);
  EXPECT_EQ(r->block_size, 32);
  EXPECT_EQ(r->scale, quantized_linear_scale_name(kModule + ".weight"));
  EXPECT_TRUE(g.find_initializer(r->scale)->equals(scales({4, 2})));
  EXPECT_FALSE(g.has_initializer(kModule + ".weight_packed"));
  EXPECT_FALSE(g.has_initializer(kModule + ".weight_shape"));
  EXPECT_TRUE(g.has_initializer("model.norm.weight"));
  EXPECT_EQ(g.initializers().size(), 3u);
}

TEST(CompressedTensorsReader, Int8PerChannelScaleBecomesN) {
  Graph g = raw(8, 0, 3, 20);  // 20 int8 per row: 5 words, none padded
  read_compressed_tensors(config(8, 0), "q/config.json", g);
  EXPECT_TRUE(g.find_initializer(kModule + ".weight")->equals(values(8, 3, 20)));
  const Tensor* s = g.find_initializer(kModule + ".weight_scale");
  EXPECT_EQ(s->shape(), (Shape{3}));
  EXPECT_EQ(s->to_f32()[2], 0.03f);
  EXPECT_EQ(g.find_quant_record(kModule + ".weight")->block_size, 0);
}

TEST(CompressedTensorsReader, RegexTargetsOutrankLinearInMixedPrecision) {
  Graph g = raw(4, 32);
  Graph other = raw(8, 0);
  const std::string m2 = "model.layers.0.self_attn.o_proj";
  for (const char* s : {".weight_packed", ".weight_scale", ".weight_shape"}) {
    g.set_initializer(m2 + s, *other.find_initializer(kModule + s));
  }
  const std::string cfg = R"({"quantization_config": {"quant_method": "compressed-tensors",
    "format": "mixed-precision", "config_groups": {
    "group_0": {"targets": ["Linear"], "format": "pack-quantized",
                "weights": {"num_bits": 4, "strategy": "group", "group_size": 32}},
    "group_1": {"targets": ["re:.*o_proj$"], "format": "pack-quantized",
                "weights": {"num_bits": 8, "strategy": "channel"}}}}})";
  const QuantizedCheckpoint q = read_compressed_tensors(cfg, "q/config.json", g);
  EXPECT_EQ(q.schemes[0].linears, 1);
  EXPECT_EQ(q.schemes[1].linears, 1);
  EXPECT_EQ(g.find_quant_record(m2 + ".weight")->bits, 8);
  EXPECT_EQ(g.find_quant_record(kModule + ".weight")->bits, 4);
}

TEST(CompressedTensorsReader, ActOrderWeightKeepsTheStoredLayout) {
  Graph g = raw(4, 32);
  read_compressed_tensors(config(4, 32, R"(, "actorder": "weight")"), "q/config.json", g);
  EXPECT_TRUE(g.find_initializer(kModule + ".weight")->equals(values(4, 4, 64)));
}

TEST(CompressedTensorsReader, BitsThatDisagreeWithThePackedWidthNameTheTensor) {
  const std::string m = invalid_message(raw(4, 32), config(8, 32));
  EXPECT_NE(m.find(kModule + ".weight_packed"), std::string::npos) << m;
  EXPECT_NE(m.find("8 bits"), std::string::npos) << m;
}

TEST(CompressedTensorsReader, GroupSizeThatDisagreesWithTheScaleNamesIt) {
  const std::string m = invalid_message(raw(4, 32), config(4, 16));
  EXPECT_NE(m.find(kModule + ".weight_scale"), std::string::npos) << m;
  EXPECT_NE(m.find("[4, 4]"), std::string::npos) << m;
}

TEST(CompressedTensorsReader, MissingScaleOrShapeIsNamed) {
  for (const char* side : {".weight_scale", ".weight_shape"}) {
    Graph g = raw(4, 32);
    g.remove_initializer(kModule + side);
    const std::string m = invalid_message(std::move(g), config(4, 32));
    EXPECT_NE(m.find(kModule + side), std::string::npos) << m;
  }
}

TEST(CompressedTensorsReader, ShapeTensorThatDisagreesWithThePackedRowsIsNamed) {
  Graph g = raw(4, 32);
  g.find_initializer(kModule + ".weight_shape")->mutable_data<int64_t>()[0] = 5;
  const std::string m = invalid_message(std::move(g), config(4, 32));
  EXPECT_NE(m.find(kModule + ".weight_packed"), std::string::npos) << m;
  Graph h = raw(4, 32);
  h.find_initializer(kModule + ".weight_shape")->mutable_data<int64_t>()[1] = -64;
  EXPECT_NE(invalid_message(std::move(h), config(4, 32)).find(".weight_shape"), std::string::npos);
}

TEST(CompressedTensorsReader, PackingOtherThanInt32IsRefused) {
  Graph g = raw(4, 32);
  g.set_initializer(kModule + ".weight_packed", Tensor(DType::I64, {4, 8}));
  EXPECT_NE(invalid_message(std::move(g), config(4, 32)).find("i32 [4, 8]"), std::string::npos);
}

TEST(CompressedTensorsReader, ZeroPointUnderASymmetricConfigIsNamed) {
  Graph g = raw(4, 32);
  g.set_initializer(kModule + ".weight_zero_point", Tensor(DType::I32, {1, 2}));
  const std::string m = invalid_message(std::move(g), config(4, 32));
  EXPECT_NE(m.find(kModule + ".weight_zero_point"), std::string::npos) << m;
}

TEST(CompressedTensorsReader, AsymmetricActOrderAndActivationSchemesAreUnsupported) {
  const auto unsupported = [](const std::string& cfg) {
    return invalid_message(raw(4, 32), cfg, ErrorCategory::Unsupported);
  };
  EXPECT_NE(unsupported(config(4, 32, R"(, "symmetric": false)")).find("asymmetric"),
            std::string::npos);
  EXPECT_NE(unsupported(config(4, 32, R"(, "actorder": "group")")).find("actorder"),
            std::string::npos);
  EXPECT_NE(unsupported(config(4, 32, R"(, "type": "float")")).find("float"), std::string::npos);
  EXPECT_NE(unsupported(config(3, 32)).find("num_bits 3"), std::string::npos);
  std::string cfg = config(4, 32);
  cfg.replace(cfg.find("\"input_activations\": null"), 25,
              R"("input_activations": {"num_bits": 8})");
  EXPECT_NE(unsupported(cfg).find("input_activations"), std::string::npos);
  cfg = config(4, 32);
  cfg.replace(cfg.find("pack-quantized"), 14, "int-quantized");
  EXPECT_NE(unsupported(cfg).find("int-quantized"), std::string::npos);
}

TEST(CompressedTensorsReader, IgnoredButPackedAndStrayFloatWeightAreNamed) {
  EXPECT_NE(invalid_message(raw(4, 32), config(4, 32, "", R"(["re:.*down_proj"])"))
                .find("ignore"),
            std::string::npos);
  Graph g = raw(4, 32);
  g.set_initializer(kModule + ".weight", Tensor(DType::F32, {4, 64}));
  EXPECT_NE(invalid_message(std::move(g), config(4, 32)).find(kModule + ".weight'"),
            std::string::npos);
}

// Patterns that take a backtracking matcher exponential time on a module name (nested
// quantifiers, as libFuzzer found) are matched at once; a back-reference is refused by name.
TEST(CompressedTensorsReader, RegexTargetsMatchInPolynomialTime) {
  EXPECT_NE(invalid_message(raw(4, 32), config(4, 32, "", R"(["re:(.*)*(.*)*down_proj"])"))
                .find("ignore"),
            std::string::npos);
  EXPECT_TRUE(invalid_message(raw(4, 32), config(4, 32, "", R"(["re:(.*)*(.*)*!"])")).empty());
  EXPECT_NE(invalid_message(raw(4, 32), config(4, 32, "", R"(["re:(a)\\1"])"))
                .find("back-reference"),
            std::string::npos);
}

TEST(CompressedTensorsReader, OrphanSideTensorAndNoPackedWeightAreRefused) {
  Graph g = raw(4, 32);
  g.set_initializer("model.layers.1.mlp.up_proj.weight_scale", scales({4, 2}));
  EXPECT_NE(invalid_message(std::move(g), config(4, 32)).find("up_proj.weight_scale"),
            std::string::npos);
  Graph none;
  none.set_initializer("model.norm.weight", Tensor(DType::F32, {64}));
  EXPECT_NE(invalid_message(std::move(none), config(4, 32)).find("weight_packed"),
            std::string::npos);
}

TEST(CompressedTensorsReader, MalformedConfigIsInvalidInput) {
  for (const std::string& cfg :
       {std::string("[]"), std::string(R"({"quantization_config": {"quant_method": 3}})"),
        std::string(R"({"quantization_config": {"quant_method": "compressed-tensors"}})"),
        config(4, 32, "", "7"), config(4, 32, "", R"(["re:("])"),
        std::string(R"({"quantization_config": {"quant_method": "compressed-tensors",
          "format": "pack-quantized", "config_groups": {"g": {"targets": ["Linear"],
          "weights": {"num_bits": "4"}}}}})")}) {
    EXPECT_FALSE(invalid_message(raw(4, 32), cfg).empty()) << cfg;
  }
}

TEST(CompressedTensorsReader, LoadModelReadsTheWritersFolderBackBitForBit) {
  test::TempDir dir;
  fs::create_directories(dir.path() / "src");
  std::ofstream(dir.path() / "src" / "config.json") << R"({"model_type": "llama"})";
  Graph q;
  store_quantized_linear(q, kModule + ".weight", values(4, 4, 64), scales({4, 2}), 32);
  store_quantized_linear(q, "model.layers.0.mlp.up_proj.weight", values(4, 4, 64),
                         scales({4, 2}), 32);
  q.set_initializer("model.norm.weight", scales({64}));
  CompressedTensorsOptions o;
  o.source_dir = dir.path() / "src";
  o.ignore = {"lm_head"};
  write_compressed_tensors(q, dir.path() / "out", o);
  const LoadedModel back = load_model(dir.path() / "out");
  ASSERT_TRUE(back.quantized.has_value());
  EXPECT_EQ(back.quantized->quantized_linears, 2);
  EXPECT_EQ(back.graph.initializers().size(), q.initializers().size());
  for (const auto& [name, t] : q.initializers()) {
    const Tensor* b = back.graph.find_initializer(name);
    ASSERT_NE(b, nullptr) << name;
    EXPECT_TRUE(b->equals(t)) << name;
  }
  EXPECT_EQ(back.graph.quant_records().size(), 2u);
}

TEST(CompressedTensorsReader, FloatFolderAndUnknownMethodLoadAsStored) {
  test::TempDir dir;
  Graph g = raw(4, 32);
  fs::create_directories(dir.path() / "f");
  std::ofstream(dir.path() / "f" / "config.json")
      << R"({"model_type": "llama", "quantization_config": {"quant_method": "bitsandbytes"}})";
  CompressedTensorsOptions o;
  o.folder = false;
  write_compressed_tensors(g, dir.path() / "f" / "model.safetensors", o);
  const LoadedModel loaded = load_model(dir.path() / "f");
  EXPECT_FALSE(loaded.quantized.has_value());
  EXPECT_TRUE(loaded.graph.has_initializer(kModule + ".weight_packed"));
}

}  // namespace
