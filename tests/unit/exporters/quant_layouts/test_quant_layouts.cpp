// The GPTQ, AWQ and ModelOpt layouts: their packers on known values (word by word, as the
// loaders' sources unpack them), the fp16 scale conversion, the configuration and side files,
// and the refusals (AWQ with 8 bits or N not a multiple of 8, ModelOpt with an odd N, a scale
// over fp16's range), each leaving nothing behind.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "exporters/awq/awq_writer.h"
#include "exporters/gptq/gptq_writer.h"
#include "exporters/modelopt/modelopt_writer.h"
#include "exporters/quant_checkpoint/linear_values.h"
#include "importers/safetensors/safetensors_reader.h"
#include "ir/error.h"
#include "ir/half.h"
#include "ir/quantized_linear.h"

using namespace qforge;

namespace {

namespace fs = std::filesystem;

Tensor int4_values(const std::vector<int8_t>& q, Shape shape) {
  Tensor t(DType::I4, std::move(shape));
  auto b = t.mutable_data<uint8_t>();
  for (size_t i = 0; i < q.size(); ++i) {
    b[i / 2] = static_cast<uint8_t>(b[i / 2] | ((q[i] & 0x0f) << (4 * (i % 2))));
  }
  return t;
}

// q[r][c] = ((r * 3 + c * 5) % 16) - 8: every value in -8..7, distinct along both axes.
std::vector<int8_t> pattern(int64_t n, int64_t k) {
  std::vector<int8_t> q(static_cast<size_t>(n * k));
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      q[static_cast<size_t>(r * k + c)] = static_cast<int8_t>((r * 3 + c * 5) % 16 - 8);
    }
  }
  return q;
}

std::string read_text(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(GptqPacking, QweightPacksEightRowsOfKPerWordLowFirstOffsetBy8) {
  const int64_t n = 3, k = 16;
  const std::vector<int8_t> q = pattern(n, k);
  const Tensor packed = pack_gptq_qweight(int4_values(q, {n, k}));
  ASSERT_EQ(packed.shape(), (Shape{2, 3}));
  const auto w = packed.data<uint32_t>();
  // GPTQModel's unpack: (qweight[r, col] >> 4j) & 15 is element (col, 8r + j), minus the zero.
  for (int64_t r = 0; r < 2; ++r) {
    for (int64_t col = 0; col < n; ++col) {
      for (int j = 0; j < 8; ++j) {
        const int u = static_cast<int>((w[static_cast<size_t>(r * n + col)] >> (4 * j)) & 0xf);
        EXPECT_EQ(u - 8, q[static_cast<size_t>(col * k + 8 * r + j)]) << r << " " << col;
      }
    }
  }
}

TEST(GptqPacking, Int8QweightFourPerWord) {
  Tensor q(DType::I8, {2, 4});
  const int8_t v[8] = {-128, -1, 0, 127, 1, 2, 3, 4};
  std::copy(v, v + 8, q.mutable_data<int8_t>().begin());
  const Tensor packed = pack_gptq_qweight(q);
  ASSERT_EQ(packed.shape(), (Shape{1, 2}));
  EXPECT_EQ(packed.data<uint32_t>()[0], 0xff807f00u);  // 0, 127, 128, 255 low byte first
  EXPECT_EQ(packed.data<uint32_t>()[1], 0x84838281u);
}

TEST(GptqPacking, ZerosV1AreZeroMinusOneV2TheZeroAndPaddingStaysZero) {
  const Tensor v1 = pack_gptq_qzeros(2, 8, 4, 7);
  ASSERT_EQ(v1.shape(), (Shape{2, 1}));
  EXPECT_EQ(v1.data<uint32_t>()[0], 0x77777777u);
  EXPECT_EQ(v1.data<uint32_t>()[1], 0x77777777u);
  EXPECT_EQ(pack_gptq_qzeros(1, 8, 4, 8).data<uint32_t>()[0], 0x88888888u);
  const Tensor partial = pack_gptq_qzeros(1, 10, 4, 8);  // 10 columns: 2 words, 2 fields used
  ASSERT_EQ(partial.shape(), (Shape{1, 2}));
  EXPECT_EQ(partial.data<uint32_t>()[1], 0x00000088u);
  EXPECT_EQ(pack_gptq_qzeros(1, 4, 8, 127).data<uint32_t>()[0], 0x7f7f7f7fu);
  const Tensor g = gptq_g_idx(8, 4);
  EXPECT_EQ(std::vector<int32_t>(g.data<int32_t>().begin(), g.data<int32_t>().end()),
            (std::vector<int32_t>{0, 0, 0, 0, 1, 1, 1, 1}));
}

// K odd (columns read nibble by nibble) and even (two columns a byte at a time, with an odd
// number of columns left in the last block of 128).
TEST(AwqPacking, QweightPacksEightColumnsOfNInterleaved) {
  for (const int64_t k : {3, 6, 130, 259}) {
    const int64_t n = 16;
    const std::vector<int8_t> q = pattern(n, k);
    const Tensor packed = pack_awq_qweight(int4_values(q, {n, k}));
    ASSERT_EQ(packed.shape(), (Shape{k, 2}));
    const auto w = packed.data<uint32_t>();
    // AutoAWQ's unpack: field i of word (row, c) is output column 8c + [0,2,4,6,1,3,5,7][i].
    const int order[8] = {0, 2, 4, 6, 1, 3, 5, 7};
    for (int64_t row = 0; row < k; ++row) {
      for (int64_t c = 0; c < 2; ++c) {
        for (int i = 0; i < 8; ++i) {
          const int u = static_cast<int>((w[static_cast<size_t>(row * 2 + c)] >> (4 * i)) & 0xf);
          ASSERT_EQ(u - 8, q[static_cast<size_t>((8 * c + order[i]) * k + row)])
              << "k " << k << " row " << row << " word " << c << " field " << i;
        }
      }
    }
    // Rows 0..7 of input 0 store 0, 3, 6, 9, 12, 15, 2, 5; fields take rows 0, 2, 4, 6, 1, 3,
    // 5, 7.
    if (k == 3) {
      EXPECT_EQ(w[0], 0x5f932c60u);
    }
  }
  EXPECT_EQ(pack_awq_qzeros(2, 16, 8).data<uint32_t>()[3], 0x88888888u);
}

TEST(ModeloptPacking, TwoAdjacentOutputRowsPerByteLowNibbleEven) {
  const int64_t n = 4, k = 3;
  const std::vector<int8_t> q = pattern(n, k);
  const Tensor packed = pack_modelopt_int4(int4_values(q, {n, k}));
  ASSERT_EQ(packed.dtype(), DType::U8);
  ASSERT_EQ(packed.shape(), (Shape{2, 3}));
  const auto b = packed.data<uint8_t>();
  for (int64_t r = 0; r < 2; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      const auto sx = [](int nib) { return nib >= 8 ? nib - 16 : nib; };
      EXPECT_EQ(sx(b[static_cast<size_t>(r * k + c)] & 0xf), q[static_cast<size_t>(2 * r * k + c)]);
      EXPECT_EQ(sx(b[static_cast<size_t>(r * k + c)] >> 4),
                q[static_cast<size_t>((2 * r + 1) * k + c)]);
    }
  }
  EXPECT_EQ(b[0], 0xb8u);  // rows 0 and 1 of column 0: -8 (0x8) and -5 (0xb)
}

TEST(LinearScaleF16, GroupMajorConvertsExactScalesAndRefusesOthers) {
  Tensor values(DType::I4, {2, 64});
  // bf16 scales fp16 holds: 0.5, 3.0, 0.25, and 2^-20 (below fp16's normal range, on its grid).
  const std::vector<float> s = {0.5f, 3.0f, std::ldexp(1.0f, -20), 0.25f};
  const Tensor scale = Tensor::from_f32(s, {2, 2}, DType::BF16);
  const Tensor f16 = linear_scale_f16_group_major({"m", values, scale, 4, 32}, "gptq");
  ASSERT_EQ(f16.shape(), (Shape{2, 2}));
  const auto h = f16.data<uint16_t>();
  EXPECT_EQ(f16_to_f32(h[0]), 0.5f);                   // (group 0, row 0)
  EXPECT_EQ(f16_to_f32(h[1]), std::ldexp(1.0f, -20));  // (group 0, row 1)
  EXPECT_EQ(f16_to_f32(h[2]), 3.0f);                   // (group 1, row 0)
  EXPECT_EQ(f16_to_f32(h[3]), 0.25f);                  // (group 1, row 1)
  // 1e-6 in bf16 is off fp16's subnormal grid; a float32 scale with 24 significant bits is off
  // its normal one; 1e5 is over its range: each refused, naming the module.
  for (const auto& [v, dt] : std::vector<std::pair<float, DType>>{
           {1e-6f, DType::BF16}, {0.1f, DType::F32}, {1e5f, DType::F32}}) {
    const Tensor bad = Tensor::from_f32(std::vector<float>{1.f, v, 1.f, 1.f}, {2, 2}, dt);
    try {
      linear_scale_f16_group_major({"model.x", values, bad, 4, 32}, "awq");
      ADD_FAILURE() << "scale " << v << " was not refused";
    } catch (const Error& e) {
      EXPECT_EQ(e.category(), ErrorCategory::Unsupported) << e.what();
      EXPECT_NE(std::string(e.what()).find("'model.x'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("--requantize"), std::string::npos) << e.what();
    }
  }
}

class QuantLayoutWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("qforge_qlw_" +
             std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "src");
    std::ofstream(root_ / "src" / "config.json") << R"({"model_type": "llama"})";
  }
  void TearDown() override { fs::remove_all(root_); }

  // One quantized Linear [n, 64] in blocks of 32 with bf16 scales, and a bias.
  static Graph part(const std::string& module, int64_t n) {
    Graph g;
    g.set_initializer(module + ".weight", Tensor(DType::BF16, {n, 64}));
    store_quantized_linear(g, module + ".weight", int4_values(pattern(n, 64), {n, 64}),
                           Tensor::from_f32(std::vector<float>(static_cast<size_t>(n * 2), 0.5f),
                                            {n, 2}, DType::BF16),
                           32);
    g.set_initializer(module + ".bias", Tensor(DType::BF16, {n}));
    return g;
  }
  QuantCheckpointOptions options() const {
    QuantCheckpointOptions o;
    o.source_dir = root_ / "src";
    o.ignore = {"lm_head", "model.layers.1.mlp.down_proj"};
    return o;
  }
  static nlohmann::json config(const fs::path& out) {
    return nlohmann::json::parse(read_text(out / "config.json"))["quantization_config"];
  }
  fs::path root_;
};

TEST_F(QuantLayoutWriterTest, GptqWritesItsTensorsAndConfig) {
  GptqWriter w(root_ / "out", options(), /*v2=*/false);
  w.add(part("model.layers.0.mlp.up_proj", 16));
  w.finish();
  const Graph back = import_safetensors(root_ / "out" / "model.safetensors");
  const std::string m = "model.layers.0.mlp.up_proj";
  EXPECT_EQ(back.find_initializer(m + ".qweight")->shape(), (Shape{8, 16}));
  EXPECT_EQ(back.find_initializer(m + ".qzeros")->shape(), (Shape{2, 2}));
  EXPECT_EQ(back.find_initializer(m + ".qzeros")->data<uint32_t>()[0], 0x77777777u);
  EXPECT_EQ(back.find_initializer(m + ".scales")->dtype(), DType::F16);
  EXPECT_EQ(back.find_initializer(m + ".scales")->shape(), (Shape{2, 16}));
  EXPECT_EQ(back.find_initializer(m + ".g_idx")->shape(), (Shape{64}));
  EXPECT_NE(back.find_initializer(m + ".bias"), nullptr);
  EXPECT_EQ(back.find_initializer(m + ".weight"), nullptr);
  const auto qc = config(root_ / "out");
  EXPECT_EQ(qc["quant_method"], "gptq");
  EXPECT_EQ(qc["bits"], 4);
  EXPECT_EQ(qc["group_size"], 32);
  EXPECT_EQ(qc["desc_act"], false);
  EXPECT_EQ(qc["sym"], true);
  EXPECT_EQ(qc["checkpoint_format"], "gptq");
  // A decoder Linear left float is skipped through GPTQModel's `dynamic` negative rule.
  EXPECT_TRUE(qc["dynamic"].contains(R"(-:^model\.layers\.1\.mlp\.down_proj$)")) << qc.dump();
}

TEST_F(QuantLayoutWriterTest, GptqV2StoresTheTrueZero) {
  GptqWriter w(root_ / "out", options(), /*v2=*/true);
  w.add(part("model.layers.0.mlp.up_proj", 8));
  w.finish();
  const Graph back = import_safetensors(root_ / "out" / "model.safetensors");
  EXPECT_EQ(back.find_initializer("model.layers.0.mlp.up_proj.qzeros")->data<uint32_t>()[0],
            0x88888888u);
  const auto qc = config(root_ / "out");
  EXPECT_EQ(qc["checkpoint_format"], "gptq_v2");
}

TEST_F(QuantLayoutWriterTest, AwqWritesItsTensorsAndConfig) {
  AwqWriter w(root_ / "out", options());
  w.add(part("model.layers.0.mlp.up_proj", 16));
  w.finish();
  const Graph back = import_safetensors(root_ / "out" / "model.safetensors");
  const std::string m = "model.layers.0.mlp.up_proj";
  EXPECT_EQ(back.find_initializer(m + ".qweight")->shape(), (Shape{64, 2}));
  EXPECT_EQ(back.find_initializer(m + ".qzeros")->shape(), (Shape{2, 2}));
  EXPECT_EQ(back.find_initializer(m + ".scales")->shape(), (Shape{2, 16}));
  EXPECT_EQ(back.find_initializer(m + ".g_idx"), nullptr);
  const auto qc = config(root_ / "out");
  EXPECT_EQ(qc["quant_method"], "awq");
  EXPECT_EQ(qc["version"], "gemm");
  EXPECT_EQ(qc["zero_point"], true);
  EXPECT_EQ(qc["modules_to_not_convert"],
            nlohmann::json::array({"lm_head", "model.layers.1.mlp.down_proj"}));
}

TEST_F(QuantLayoutWriterTest, AwqRefusesEightBitsAndNNotAMultipleOf8LeavingNothing) {
  {
    AwqWriter w(root_ / "out", options());
    EXPECT_THROW(
        {
          try {
            w.add(part("model.layers.0.self_attn.k_proj", 12));
          } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("model.layers.0.self_attn.k_proj"),
                      std::string::npos);
            EXPECT_NE(std::string(e.what()).find("multiple of 8"), std::string::npos);
            throw;
          }
        },
        Error);
  }
  {
    Graph g;
    store_quantized_linear(g, "model.layers.0.mlp.up_proj.weight", Tensor(DType::I8, {8, 64}),
                           Tensor(DType::BF16, {8}), 0);
    AwqWriter w(root_ / "out", options());
    try {
      w.add(g);
      ADD_FAILURE() << "8-bit accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("4-bit"), std::string::npos) << e.what();
    }
  }
  EXPECT_FALSE(fs::exists(root_ / "out"));
}

TEST_F(QuantLayoutWriterTest, ModeloptWritesWeightScalesPreQuantScaleAndHfQuantConfig) {
  ModeloptHfWriter w(root_ / "out", options());
  w.add(part("model.layers.0.mlp.up_proj", 6));
  w.finish();
  const Graph back = import_safetensors(root_ / "out" / "model.safetensors");
  const std::string m = "model.layers.0.mlp.up_proj";
  EXPECT_EQ(back.find_initializer(m + ".weight")->dtype(), DType::U8);
  EXPECT_EQ(back.find_initializer(m + ".weight")->shape(), (Shape{3, 64}));
  EXPECT_EQ(back.find_initializer(m + ".weight_scale")->dtype(), DType::F32);
  EXPECT_EQ(back.find_initializer(m + ".weight_scale")->shape(), (Shape{6, 2}));
  EXPECT_EQ(back.find_initializer(m + ".weight_scale")->data<float>()[0], 0.5f);
  const Tensor* pqs = back.find_initializer(m + ".pre_quant_scale");
  ASSERT_NE(pqs, nullptr);
  EXPECT_EQ(pqs->dtype(), DType::BF16);
  EXPECT_EQ(pqs->to_f32(), std::vector<float>(64, 1.0f));
  const auto hq = nlohmann::json::parse(read_text(root_ / "out" / "hf_quant_config.json"));
  EXPECT_EQ(hq["quantization"]["quant_algo"], "W4A16_AWQ");
  EXPECT_EQ(hq["quantization"]["group_size"], 32);
  EXPECT_EQ(hq["quantization"]["has_zero_point"], false);
  EXPECT_EQ(hq["quantization"]["pre_quant_scale"], true);
  EXPECT_EQ(hq["quantization"]["exclude_modules"],
            nlohmann::json::array({"lm_head", "model.layers.1.mlp.down_proj"}));
  const auto qc = config(root_ / "out");
  EXPECT_EQ(qc["quant_method"], "modelopt");
  EXPECT_EQ(qc["quant_algo"], "W4A16_AWQ");
}

TEST_F(QuantLayoutWriterTest, ModeloptRefusesAnOddNumberOfOutputRows) {
  {
    ModeloptHfWriter w(root_ / "out", options());
    EXPECT_THROW(w.add(part("model.layers.0.mlp.up_proj", 5)), Error);
  }
  EXPECT_FALSE(fs::exists(root_ / "out"));
}

}  // namespace

// The packers read words and nibbles straight from the i4 bytes, in cache tiles: on shapes past
// a tile and with odd K they give what packing element by element gives.
TEST(QuantLayoutPacking, TiledPackersEqualElementByElementOnLargerShapes) {
  const auto signed_at = [](const std::vector<int8_t>& q, int64_t k, int64_t r, int64_t c) {
    return static_cast<uint32_t>(q[static_cast<size_t>(r * k + c)]);
  };
  {  // GPTQ, i4 and i8: 136 rows (two row tiles and a part), 8 * 70 columns (words past a tile)
    const int64_t n = 136, k = 560;
    const std::vector<int8_t> q = pattern(n, k);
    Tensor i8(DType::I8, {n, k});
    std::copy(q.begin(), q.end(), i8.mutable_data<int8_t>().begin());
    for (const Tensor& t : {int4_values(q, {n, k}), i8}) {
      const int bits = t.dtype() == DType::I4 ? 4 : 8, per = 32 / bits;
      const Tensor packed = pack_gptq_qweight(t);
      ASSERT_EQ(packed.shape(), (Shape{k / per, n}));
      const auto w = packed.data<uint32_t>();
      for (int64_t g = 0; g < k / per; ++g) {
        for (int64_t r = 0; r < n; ++r) {
          uint32_t want = 0;
          for (int j = 0; j < per; ++j) {
            want |= ((signed_at(q, k, r, g * per + j) + (1u << (bits - 1))) &
                     ((1u << bits) - 1)) << (bits * j);
          }
          ASSERT_EQ(w[static_cast<size_t>(g * n + r)], want) << bits << " " << g << " " << r;
        }
      }
    }
  }
  for (const int64_t k : {int64_t{301}, int64_t{300}}) {  // AWQ and ModelOpt, odd and even K
    const int64_t n = 24;
    const std::vector<int8_t> q = pattern(n, k);
    const Tensor t = int4_values(q, {n, k});
    const Tensor awq = pack_awq_qweight(t);
    const int order[8] = {0, 2, 4, 6, 1, 3, 5, 7};
    const auto aw = awq.data<uint32_t>();
    for (int64_t col = 0; col < k; ++col) {
      for (int64_t c = 0; c < n / 8; ++c) {
        uint32_t want = 0;
        for (int i = 0; i < 8; ++i) {
          want |= ((signed_at(q, k, 8 * c + order[i], col) + 8u) & 0xfu) << (4 * i);
        }
        ASSERT_EQ(aw[static_cast<size_t>(col * (n / 8) + c)], want) << k << " " << col;
      }
    }
    const Tensor mo = pack_modelopt_int4(t);
    const auto mb = mo.data<uint8_t>();
    for (int64_t r = 0; r < n / 2; ++r) {
      for (int64_t c = 0; c < k; ++c) {
        const uint32_t want = (signed_at(q, k, 2 * r, c) & 0xfu) |
                              ((signed_at(q, k, 2 * r + 1, c) & 0xfu) << 4);
        ASSERT_EQ(mb[static_cast<size_t>(r * k + c)], want) << k << " " << r << " " << c;
      }
    }
  }
}
