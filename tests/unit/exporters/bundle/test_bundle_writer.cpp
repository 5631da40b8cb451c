#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "exporters/calib_table_writer.h"
#include "ir/sha256.h"
#include "importers/onnx/onnx_importer.h"
#include "importers/safetensors/safetensors_reader.h"
#include "qforge/version.h"
#include "tests/unit/exporters/bundle/bundle_test_util.h"

namespace qforge::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string file_digest(const fs::path& p) {
  const std::string bytes = read_bytes(p);
  return sha256_hex(std::as_bytes(std::span(bytes.data(), bytes.size())));
}

TEST(BundleWriter, WritesEveryFile) {
  TempDir tmp;
  write_bundle(qdq_graph(), tmp / "m.qfb", sample_info(tmp));
  EXPECT_EQ(list_dir(tmp / "m.qfb"),
            (std::vector<std::string>{"calibration.cache", "manifest.json", "model.onnx",
                                      "report.json", "weights.safetensors"}));
  // Nothing but the bundle and the source beside it: no temporary folder left.
  EXPECT_EQ(list_dir(tmp.path()), (std::vector<std::string>{"m.qfb", "source.onnx"}));
}

TEST(BundleWriter, ManifestDescribesModelQuantizationAndFiles) {
  TempDir tmp;
  const BundleInfo info = sample_info(tmp);
  write_bundle(qdq_graph(), tmp / "m.qfb", info);
  const json m = read_json(tmp / "m.qfb" / "manifest.json");
  EXPECT_EQ(m["format"], "qforge-bundle");
  EXPECT_EQ(m["version"], 1);
  EXPECT_EQ(m["producer"], std::string("qforge ") + kVersion);
  EXPECT_EQ(m["source"]["sha256"], file_digest(info.source_path));
  EXPECT_EQ(m["inputs"], json::parse(R"([{"name":"x","dtype":"f32","shape":["batch",4]}])"));
  EXPECT_EQ(m["outputs"], json::parse(R"([{"name":"z","dtype":"f32","shape":["batch",3]}])"));
  EXPECT_EQ(m["quantization"]["scheme"], "int8-weights");
  EXPECT_EQ(m["quantization"]["tensors"], json::parse(R"([
    {"name":"W","kind":"weight","dtype":"i8","granularity":"per-channel","axis":1,
     "scale":"ws","zero_point":"wz"},
    {"name":"B","kind":"weight","dtype":"i4","granularity":"per-tensor","scale":"bs",
     "zero_point":null}])"));
  EXPECT_EQ(m["calibration"],
            json({{"method", "entropy"}, {"dataset_digest", std::string(64, 'a')}}));
  EXPECT_EQ(m["accuracy"]["top1"], 0.91);
  ASSERT_EQ(m["files"].size(), 4u);
  for (const auto& f : m["files"]) {
    const fs::path p = tmp / "m.qfb" / f["name"].get<std::string>();
    EXPECT_EQ(f["size"].get<uint64_t>(), fs::file_size(p)) << f;
    EXPECT_EQ(f["sha256"], file_digest(p)) << f;
  }
  EXPECT_EQ(m["files"][0]["name"], "calibration.cache");  // sorted by name
  EXPECT_EQ(m["files"][3]["name"], "weights.safetensors");
}

TEST(BundleWriter, NoCalibrationMeansNullAndNoCache) {
  TempDir tmp;
  BundleInfo info = sample_info(tmp);
  info.calibration.reset();
  info.accuracy = nullptr;
  info.source_path.clear();
  write_bundle(qdq_graph(), tmp / "m.qfb", info);
  const json m = read_json(tmp / "m.qfb" / "manifest.json");
  EXPECT_TRUE(m["calibration"].is_null());
  EXPECT_TRUE(m["accuracy"].is_null());
  EXPECT_TRUE(m["source"].is_null());
  EXPECT_FALSE(fs::exists(tmp / "m.qfb" / "calibration.cache"));
}

TEST(BundleWriter, ModelAndWeightsHoldTheGraphAndItsQuantizedTensors) {
  TempDir tmp;
  const Graph g = qdq_graph();
  write_bundle(g, tmp / "m.qfb", sample_info(tmp));
  const Graph model = import_onnx(tmp / "m.qfb" / "model.onnx");
  EXPECT_EQ(model.nodes.size(), g.nodes.size());
  const Graph weights = import_safetensors(tmp / "m.qfb" / "weights.safetensors");
  std::vector<std::string> names;
  for (const auto& [name, t] : weights.initializers()) names.push_back(name);
  std::sort(names.begin(), names.end());
  // Quantized weights, their scales and zero points; not the float initializer c.
  EXPECT_EQ(names, (std::vector<std::string>{"B", "W", "bs", "ws", "wz"}));
  for (const auto& name : names) {
    EXPECT_TRUE(weights.find_initializer(name)->equals(*g.find_initializer(name))) << name;
  }
  EXPECT_EQ(weights.find_initializer("B")->dtype(), DType::I4);
}

TEST(BundleWriter, CalibrationCacheIsTensorRtText) {
  TempDir tmp;
  write_bundle(qdq_graph(), tmp / "m.qfb", sample_info(tmp));
  const std::string cache = read_bytes(tmp / "m.qfb" / "calibration.cache");
  EXPECT_EQ(cache, tensorrt_calibration_cache(sample_table()));
  EXPECT_EQ(cache.rfind("TRT-8601-EntropyCalibration2\n", 0), 0u) << cache;
  EXPECT_EQ(read_json(tmp / "m.qfb" / "report.json")["layers"][0]["sqnr_db"], 31.5);
}

TEST(BundleWriter, SameInputsGiveIdenticalBundles) {
  TempDir tmp;
  const BundleInfo info = sample_info(tmp);
  write_bundle(qdq_graph(), tmp / "a.qfb", info);
  write_bundle(qdq_graph(), tmp / "b.qfb", info);
  for (const auto& name : list_dir(tmp / "a.qfb")) {
    EXPECT_EQ(read_bytes(tmp / "a.qfb" / name), read_bytes(tmp / "b.qfb" / name)) << name;
  }
}

TEST(BundleWriter, RefusesExistingTargetUnlessOverwrite) {
  TempDir tmp;
  BundleInfo info = sample_info(tmp);
  write_bundle(qdq_graph(), tmp / "m.qfb", info);
  const std::string before = read_bytes(tmp / "m.qfb" / "manifest.json");
  info.scheme = "other";
  expect_error([&] { write_bundle(qdq_graph(), tmp / "m.qfb", info); }, ErrorCategory::Usage,
               {"m.qfb", "already exists"});
  EXPECT_EQ(read_bytes(tmp / "m.qfb" / "manifest.json"), before);

  info.overwrite = true;
  write_bundle(qdq_graph(), tmp / "m.qfb", info);
  EXPECT_EQ(read_json(tmp / "m.qfb" / "manifest.json")["quantization"]["scheme"], "other");
  EXPECT_EQ(list_dir(tmp.path()), (std::vector<std::string>{"m.qfb", "source.onnx"}));
}

TEST(BundleWriter, FailureMidwayLeavesNoFolderAndNoTemporaryFolder) {
  TempDir tmp;
  BundleInfo info = sample_info(tmp);
  // The cache is written after model.onnx and weights.safetensors; a NaN amax stops it there.
  info.calibration->ranges["bad"] = {std::numeric_limits<float>::quiet_NaN(), 0.0f, 1.0f};
  expect_error([&] { write_bundle(qdq_graph(), tmp / "m.qfb", info); }, ErrorCategory::InvalidInput,
               {"bad"});
  EXPECT_EQ(list_dir(tmp.path()), (std::vector<std::string>{"source.onnx"}));
}

TEST(BundleWriter, FailedOverwriteKeepsTheOldBundle) {
  TempDir tmp;
  BundleInfo info = sample_info(tmp);
  write_bundle(qdq_graph(), tmp / "m.qfb", info);
  const std::string before = read_bytes(tmp / "m.qfb" / "manifest.json");
  info.overwrite = true;
  info.calibration->ranges["bad"] = {-1.0f, 0.0f, 1.0f};
  expect_error([&] { write_bundle(qdq_graph(), tmp / "m.qfb", info); }, ErrorCategory::InvalidInput,
               {"bad"});
  EXPECT_EQ(read_bytes(tmp / "m.qfb" / "manifest.json"), before);
  EXPECT_EQ(list_dir(tmp.path()), (std::vector<std::string>{"m.qfb", "source.onnx"}));
}

TEST(BundleWriter, RejectsPathWithoutQfbAndMissingFolder) {
  TempDir tmp;
  expect_error([&] { write_bundle(qdq_graph(), tmp / "m.bundle", sample_info(tmp)); },
               ErrorCategory::Usage, {"m.bundle", ".qfb"});
  expect_error([&] { write_bundle(qdq_graph(), tmp / "no" / "m.qfb", sample_info(tmp)); },
               ErrorCategory::IO, {"does not exist"});
}

TEST(BundleWriter, GivenSourceDigestIsUsedAsIs) {
  TempDir tmp;
  BundleInfo info = sample_info(tmp);
  info.source_path = tmp / "gone.onnx";  // not read when the digest is given
  info.source_sha256 = std::string(64, 'b');
  write_bundle(qdq_graph(), tmp / "m.qfb", info);
  EXPECT_EQ(read_json(tmp / "m.qfb" / "manifest.json")["source"]["sha256"], std::string(64, 'b'));
}

TEST(BundleQuantizedTensors, BlockedAndActivationEntries) {
  Graph g = qdq_graph();
  g.nodes[0].set_attr(Attribute::make_int("block_size", 2));
  g.nodes[0].set_attr(Attribute::make_int("axis", -2));
  g.nodes.push_back(make_node("q_z", "QuantizeLinear", {"z", "zs", "zz"}, {"zq"}));
  g.nodes.push_back(make_node("dq_z", "DequantizeLinear", {"zq", "zs", "zz"}, {"zf"}));
  g.set_initializer("zs", f32_tensor({0.1f}, {}));
  g.set_initializer("zz", Tensor(DType::U8, {}));
  describe_quantized(g);
  const json t = bundle_quantized_tensors(g);
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[0]["granularity"], "blocked");
  EXPECT_EQ(t[0]["axis"], 0);  // -2 of a rank-2 weight
  EXPECT_EQ(t[0]["block_size"], 2);
  EXPECT_EQ(t[2], json::parse(R"({"name":"zq","kind":"activation","dtype":"u8",
    "granularity":"per-tensor","scale":"zs","zero_point":"zz"})"));
}

TEST(BundleQuantizedTensors, ListedInTheOrderTheirReadersRunWhateverTheRecordOrder) {
  Graph g = qdq_graph(/*with_records=*/false);
  EXPECT_EQ(bundle_quantized_tensors(g), json::array()) << "no records, nothing listed";
  std::vector<QuantRecord> records = onnx_quant_records(g);
  ASSERT_EQ(records.size(), 2u);
  g.add_quant_record(records[1]);  // B first, W second
  g.add_quant_record(records[0]);
  const json t = bundle_quantized_tensors(g);
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0]["name"], "W");
  EXPECT_EQ(t[1]["name"], "B");
  EXPECT_EQ(t, bundle_quantized_tensors(qdq_graph()));
}

TEST(BundleWriter, RecordContradictingTheGraphIsAnInternalErrorAndWritesNothing) {
  TempDir tmp;
  Graph g = qdq_graph();
  QuantRecord stale = *g.find_quant_record("W");
  stale.scale = "gone_scale";
  g.add_quant_record(stale);
  expect_error([&] { write_bundle(g, tmp / "m.qfb", sample_info(tmp)); }, ErrorCategory::Internal,
               {"'W'", "gone_scale"});
  EXPECT_EQ(list_dir(tmp.path()), (std::vector<std::string>{"source.onnx"}));
}

}  // namespace
}  // namespace qforge::testing
