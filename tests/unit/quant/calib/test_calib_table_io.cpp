// Calibration tables written as qforge JSON and as TensorRT caches, read back, and refused when
// corrupt.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "exporters/calib_table_writer.h"
#include "importers/calib_table_reader.h"
#include "ir/error.h"
#include "ir/calibration_table.h"

using namespace qforge;

namespace {

CalibrationTable sample_table() {
  CalibrationTable t;
  t.method = "entropy";
  t.dataset_digest = "b0f66d040db118226a0246f10d863daac72bfb77f05635d47c3536c0bd0c092b";
  t.samples = 200;
  t.ranges["input"] = {1.0f, 0.0f, 1.0f};
  t.ranges["onnx::MatMul_7"] = {127.0f, -130.5f, 12.25f};
  t.ranges["/conv1/Conv_output_0"] = {0.1f, -0.25f, 0.3f};
  return t;
}

void expect_same(const CalibrationTable& a, const CalibrationTable& b) {
  EXPECT_EQ(a.method, b.method);
  EXPECT_EQ(a.dataset_digest, b.dataset_digest);
  EXPECT_EQ(a.samples, b.samples);
  ASSERT_EQ(a.ranges.size(), b.ranges.size());
  for (auto ia = a.ranges.begin(), ib = b.ranges.begin(); ia != a.ranges.end(); ++ia, ++ib) {
    EXPECT_EQ(ia->first, ib->first);
    EXPECT_EQ(std::bit_cast<uint32_t>(ia->second.amax), std::bit_cast<uint32_t>(ib->second.amax))
        << ia->first;
    EXPECT_EQ(std::bit_cast<uint32_t>(ia->second.min), std::bit_cast<uint32_t>(ib->second.min));
    EXPECT_EQ(std::bit_cast<uint32_t>(ia->second.max), std::bit_cast<uint32_t>(ib->second.max));
  }
}

void expect_invalid(const std::string& text, const std::string& part,
                    ErrorCategory category = ErrorCategory::InvalidInput) {
  try {
    parse_calibration_table(text, "t.cache");
    ADD_FAILURE() << "accepted:\n" << text;
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), category) << e.what();
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
  }
}

std::string read_text(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

}  // namespace

TEST(CalibTableJson, GoldenTextSortedWithShortestFloats) {
  const std::string want = R"({
  "format": "qforge-calibration",
  "version": 1,
  "method": "entropy",
  "dataset_digest": "b0f66d040db118226a0246f10d863daac72bfb77f05635d47c3536c0bd0c092b",
  "samples": 200,
  "tensors": {
    "/conv1/Conv_output_0": {
      "amax": 0.1,
      "min": -0.25,
      "max": 0.3
    },
    "input": {
      "amax": 1.0,
      "min": 0.0,
      "max": 1.0
    },
    "onnx::MatMul_7": {
      "amax": 127.0,
      "min": -130.5,
      "max": 12.25
    }
  }
}
)";
  EXPECT_EQ(calibration_table_json(sample_table()), want);
}

TEST(CalibTableJson, RoundTripsEveryFloatExactly) {
  CalibrationTable t = sample_table();
  std::mt19937 rng(3);
  for (int i = 0; i < 3000; ++i) {
    auto f = std::bit_cast<float>(static_cast<uint32_t>(rng() & 0x7fffffffu));
    if (!std::isfinite(f)) f = 1.0f;
    std::string name = "t";  // built by appending: GCC 12 warns falsely on "t" + std::string
    name += std::to_string(i);
    t.ranges[name] = {f, -f, std::nextafter(f, 0.0f)};
  }
  t.ranges["tiny"] = {std::numeric_limits<float>::denorm_min(), -0.0f, 0.0f};
  t.ranges["huge"] = {std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(), 0.0f};
  t.ranges["naïve ✓"] = {2.0f, -1.0f, 2.0f};
  expect_same(parse_calibration_table(calibration_table_json(t), "t.json"), t);
}

TEST(CalibTableCache, GoldenText) {
  EXPECT_EQ(tensorrt_calibration_cache(sample_table()),
            "TRT-8601-EntropyCalibration2\n"
            "/conv1/Conv_output_0: 3a4e69a0\n"  // 0.1f / 127
            "input: 3c010204\n"                 // 1 / 127
            "onnx::MatMul_7: 3f800000\n");      // 127 / 127
  CalibrationTable minmax = sample_table();
  minmax.method = "percentile";
  EXPECT_EQ(tensorrt_calibration_cache(minmax, "100300").substr(0, 28),
            "TRT-100300-MinMaxCalibration");
}

TEST(CalibTableCache, VersionTags) {
  EXPECT_EQ(trt_version_tag(8, 6, 1), "8601");
  EXPECT_EQ(trt_version_tag(7, 2, 2), "7202");
  EXPECT_EQ(trt_version_tag(10, 3, 0), "100300");
  EXPECT_THROW(trt_version_tag(10, 100, 0), Error);
  EXPECT_THROW(tensorrt_calibration_cache(sample_table(), "8.6.1"), Error);
}

TEST(CalibTableCache, RoundTripsThroughTheScale) {
  const CalibrationTable t = sample_table();
  const CalibrationTable back = parse_calibration_table(tensorrt_calibration_cache(t), "t.cache");
  EXPECT_EQ(back.method, "entropy");
  EXPECT_EQ(back.samples, 0);
  EXPECT_EQ(back.dataset_digest, "");
  ASSERT_EQ(back.ranges.size(), t.ranges.size());
  for (const auto& [name, r] : t.ranges) {
    const float amax = (r.amax / 127.0f) * 127.0f;  // what the cache can carry
    EXPECT_EQ(back.ranges.at(name).amax, amax) << name;
    EXPECT_NEAR(back.ranges.at(name).amax, r.amax, 2e-7f * r.amax) << name;
    EXPECT_EQ(back.ranges.at(name).min, -amax);
    EXPECT_EQ(back.ranges.at(name).max, amax);
  }
}

TEST(CalibTableCache, ReadsWhatTensorRtWrites) {
  // Unpadded and uppercase hex, CRLF line ends, a name holding ": ", no final newline.
  const auto t = parse_calibration_table(
      "TRT-7202-EntropyCalibration2\r\ndata: 3C008912\r\n(Unnamed Layer* 4) [Fully "
      "Connected]_output: "
      "3d65992f\r\nweird: name: 0\r\ntiny: 1",
      "mnist.cache");
  ASSERT_EQ(t.ranges.size(), 4u);
  EXPECT_EQ(t.ranges.at("data").amax, std::bit_cast<float>(0x3c008912u) * 127.0f);
  EXPECT_EQ(t.ranges.count("(Unnamed Layer* 4) [Fully Connected]_output"), 1u);
  EXPECT_EQ(t.ranges.at("weird: name").amax, 0.0f);
  EXPECT_EQ(t.ranges.at("tiny").amax, std::bit_cast<float>(1u) * 127.0f);
  EXPECT_EQ(parse_calibration_table("TRT-8601-MinMaxCalibration\n", "x").method, "minmax");
  EXPECT_EQ(parse_calibration_table("TRT-8601-LegacyCalibration\n", "x").method, "percentile");
}

TEST(CalibTableCache, CorruptCachesNameTheLine) {
  expect_invalid("", "neither a qforge calibration table");
  expect_invalid("TRT--EntropyCalibration2\n", "line 1: expected a 'TRT-<version>-<calibrator>'");
  expect_invalid("TRT-8601-Magic\n", "line 1: calibrator 'Magic' is not one TensorRT writes");
  expect_invalid("TRT-8601-EntropyCalibration2\na 3f800000\n", "line 2: expected 'tensor: hex'");
  expect_invalid("TRT-8601-EntropyCalibration2\na: 3f800000\n\nb: 1\n", "line 3: is empty");
  expect_invalid("TRT-8601-EntropyCalibration2\n: 3f800000\n", "line 2: has no tensor name");
  expect_invalid("TRT-8601-EntropyCalibration2\na: \n", "line 2: '' is not 1 to 8 hex digits");
  expect_invalid("TRT-8601-EntropyCalibration2\na: 13f800000\n", "is not 1 to 8 hex digits");
  expect_invalid("TRT-8601-EntropyCalibration2\na: 3g800000\n", "'3g800000' is not 1 to 8 hex");
  expect_invalid("TRT-8601-EntropyCalibration2\na: -3f80000\n", "is not 1 to 8 hex digits");
  expect_invalid("TRT-8601-EntropyCalibration2\na: bf800000\n", "not a finite float >= 0");
  expect_invalid("TRT-8601-EntropyCalibration2\na: 7fc00000\n", "not a finite float >= 0");
  expect_invalid("TRT-8601-EntropyCalibration2\na: 7f7fffff\n", "overflows float32");
  expect_invalid("TRT-8601-EntropyCalibration2\na: 1\nb: 2\na: 3\n",
                 "line 4: tensor 'a' appears again (first on line 2)");
}

TEST(CalibTableJson, CorruptTablesNameTheField) {
  const std::string head =
      R"({"format": "qforge-calibration", "version": 1, "method": "mse", "dataset_digest": "", )";
  expect_invalid(head + R"("samples": 3, "tensors": {"a": {"amax": 1, "min": 0, "max": 1}}})"
                        R"( trailing)",
                 "is not valid JSON");
  expect_invalid(head + R"("samples": 3})", "the document lacks 'tensors'");
  expect_invalid(head + R"("samples": 1e999, "tensors": {}})", "number overflow");
  expect_invalid(head + R"("samples": 3, "tensors": {}, "extra": 1})", "unknown key 'extra'");
  expect_invalid(R"({"format": "other", "version": 1, "method": "mse", "dataset_digest": "", )"
                 R"("samples": 0, "tensors": {}})",
                 "'format' is not \"qforge-calibration\"");
  expect_invalid(R"({"format": "qforge-calibration", "version": 2, "method": "mse", )"
                 R"("dataset_digest": "", "samples": 0, "tensors": {}})",
                 "has version 2; this qforge reads version 1", ErrorCategory::Unsupported);
  expect_invalid(R"({"format": "qforge-calibration", "version": 1, "method": "kl", )"
                 R"("dataset_digest": "", "samples": 0, "tensors": {}})",
                 "not minmax, percentile, entropy or mse");
  expect_invalid(R"({"format": "qforge-calibration", "version": 1, "method": "mse", )"
                 R"("dataset_digest": "ABC", "samples": 0, "tensors": {}})",
                 "'dataset_digest' is not empty or 64 lowercase hex digits");
  expect_invalid(head + R"("samples": -1, "tensors": {}})", "'samples' is -1");
  expect_invalid(head + R"("samples": 1, "tensors": {"a": {"amax": -1, "min": 0, "max": 1}}})",
                 "tensor 'a' has amax -1");
  expect_invalid(head + R"("samples": 1, "tensors": {"a": {"amax": 1, "min": 2, "max": 1}}})",
                 "tensor 'a' has min above max");
  expect_invalid(head + R"("samples": 1, "tensors": {"a": {"amax": "1", "min": 0, "max": 1}}})",
                 "tensor 'a': 'amax' is not a number");
  expect_invalid(head + R"("samples": 1, "tensors": {"a": {"amax": 1e39, "min": 0, "max": 1}}})",
                 "beyond float32");
  expect_invalid(head + R"("samples": 1, "tensors": {"a": {"amax": 1, "min": 0}}})",
                 "tensor 'a' lacks 'max'");
  expect_invalid(head + R"("samples": 1, "tensors": {"a": {"amax": 1, "min": 0, "max": 1}, )"
                        R"("a": {"amax": 1, "min": 0, "max": 1}}})",
                 "duplicate key 'a' inside 'tensors'");
}

TEST(CalibTableWriters, RefuseRangesTheyCannotWrite) {
  CalibrationTable t = sample_table();
  t.ranges["bad"] = {std::numeric_limits<float>::quiet_NaN(), 0.0f, 0.0f};
  EXPECT_THROW(calibration_table_json(t), Error);
  EXPECT_THROW(tensorrt_calibration_cache(t), Error);
  t = sample_table();
  t.ranges["two\nlines"] = {1.0f, 0.0f, 1.0f};
  EXPECT_NO_THROW(calibration_table_json(t));  // JSON escapes it
  EXPECT_THROW(tensorrt_calibration_cache(t), Error);
  t = sample_table();
  t.ranges["\xff"] = {1.0f, 0.0f, 1.0f};
  EXPECT_THROW(calibration_table_json(t), Error);
}

TEST(CalibTableWriters, WriteFilesAtomically) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("qforge_calib_io_" + std::to_string(std::random_device{}()));
  std::filesystem::create_directories(dir);
  write_calibration_table_json(sample_table(), dir / "t.json");
  write_tensorrt_calibration_cache(sample_table(), dir / "t.cache");
  EXPECT_EQ(read_text(dir / "t.json"), calibration_table_json(sample_table()));
  EXPECT_EQ(read_text(dir / "t.cache"), tensorrt_calibration_cache(sample_table()));
  expect_same(read_calibration_table(dir / "t.json"), sample_table());
  EXPECT_EQ(read_calibration_table(dir / "t.cache").ranges.size(), 3u);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir),
                          std::filesystem::directory_iterator()),
            2);  // no temporary files left
  CalibrationTable bad = sample_table();
  bad.ranges["x"] = {-1.0f, 0.0f, 0.0f};
  EXPECT_THROW(write_calibration_table_json(bad, dir / "bad.json"), Error);
  EXPECT_FALSE(std::filesystem::exists(dir / "bad.json"));
  EXPECT_THROW(write_calibration_table_json(sample_table(), dir / "missing" / "t.json"), Error);
  std::filesystem::remove_all(dir);
}
