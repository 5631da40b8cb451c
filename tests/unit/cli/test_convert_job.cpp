// The convert driver (cli/convert_job.h) called as a library: the passes it assembles for each
// scheme, what it returns, and option errors raised before any file is read.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "cli/convert_job.h"
#include "importers/load_model.h"
#include "ir/error.h"

namespace qforge::cli {
namespace {

namespace fs = std::filesystem;

const fs::path kSample = fs::path(QFORGE_SOURCE_DIR) / "calib_data" / "sample_cnn.onnx";
const fs::path kCalib = fs::path(QFORGE_SOURCE_DIR) / "calib_data" / "calib.npz";

class ConvertJob : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("qforge_convert_job_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static std::vector<std::string> pass_names(const ConvertResult& r) {
    std::vector<std::string> names;
    for (const auto& pass : r.report.passes) names.push_back(pass.pass);
    return names;
  }

  // The category of the Error `opts` throws; fails the test when none is thrown.
  static ErrorCategory thrown(const ConvertOptions& opts, std::string& message) {
    try {
      convert_model(opts);
    } catch (const Error& e) {
      message = e.what();
      return e.category();
    }
    ADD_FAILURE() << "convert_model did not throw";
    return ErrorCategory::Internal;
  }

  fs::path dir_;
};

TEST_F(ConvertJob, Int8WeightsRunsOnePassAndWritesTheModel) {
  ConvertOptions opts;
  opts.input = kSample.string();
  opts.output = (dir_ / "w8.onnx").string();
  opts.quant = "int8-weights";
  const ConvertResult r = convert_model(opts);
  EXPECT_EQ(pass_names(r), std::vector<std::string>{"weight-int8"});
  EXPECT_EQ(r.act_dtype, DType::F32);
  EXPECT_GT(r.weights_bytes_in, 0u);
  // int8 weights and f32 scales: well under half of the f32 bytes.
  EXPECT_LT(r.weights_bytes_out * 2, r.weights_bytes_in);
  const LoadedModel back = load_model(opts.output);
  EXPECT_EQ(back.graph.parameter_bytes(), r.weights_bytes_out);
}

TEST_F(ConvertJob, StaticInt8FoldsCalibratesThenQuantizes) {
  ConvertOptions opts;
  opts.input = kSample.string();
  opts.output = (dir_ / "int8.qfb").string();
  opts.quant = "int8";
  opts.calib.data = kCalib.string();
  opts.calib.method = "minmax";
  opts.calib.calib_size = 16;
  const ConvertResult r = convert_model(opts);
  const auto names = pass_names(r);
  ASSERT_GE(names.size(), 3u);
  EXPECT_EQ(names[names.size() - 2], "calibrate");
  EXPECT_EQ(names.back(), "static-int8");
  EXPECT_TRUE(fs::exists(dir_ / "int8.qfb" / "manifest.json"));
  EXPECT_TRUE(fs::exists(dir_ / "int8.qfb" / "calibration.cache"));
}

TEST_F(ConvertJob, W4A16AddsTheFp16ActivationPass) {
  ConvertOptions opts;
  opts.input = kSample.string();
  opts.output = (dir_ / "w4.onnx").string();
  opts.quant = "w4a16";
  const ConvertResult r = convert_model(opts);
  EXPECT_EQ(pass_names(r), (std::vector<std::string>{"w4a16", "float16"}));
  EXPECT_EQ(r.act_dtype, DType::F16);
}

// A flag of another scheme is refused even at its default value, and before the input is read:
// the input here does not exist, so reading it would have raised IO.
TEST_F(ConvertJob, SchemeFlagsAreCheckedBeforeAnyReading) {
  ConvertOptions opts;
  opts.input = (dir_ / "missing.onnx").string();
  opts.output = (dir_ / "out.onnx").string();
  opts.quant = "int8-weights";
  opts.given = {"--w4-method"};
  std::string message;
  EXPECT_EQ(thrown(opts, message), ErrorCategory::Usage);
  EXPECT_NE(message.find("--w4-method needs --quant w4a16"), std::string::npos) << message;

  opts.given = {"--method"};
  EXPECT_EQ(thrown(opts, message), ErrorCategory::Usage);
  EXPECT_NE(message.find("need --quant int8"), std::string::npos) << message;

  opts.given.clear();
  opts.quant = "w4a16";
  opts.w4_method = "awq";  // without --calib
  EXPECT_EQ(thrown(opts, message), ErrorCategory::Usage);
  EXPECT_NE(message.find("--calib"), std::string::npos) << message;

  opts.w4_method = "rtn";  // every option valid: now the missing input is reported
  EXPECT_EQ(thrown(opts, message), ErrorCategory::IO) << message;
  EXPECT_FALSE(fs::exists(dir_ / "out.onnx"));
}

}  // namespace
}  // namespace qforge::cli
