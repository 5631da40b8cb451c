// Data that a model rejects while calibrating: the error keeps the runtime's words and
// category, prefixed with the data set's file and the sample that caused it.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "importers/dataset/dataset.h"
#include "ir/error.h"
#include "quant/calib/calibration.h"
#include "quant/calib/sample_context.h"
#include "tests/unit/importers/dataset/dataset_test_util.h"
#include "tests/unit/runtime/runtime_test_util.h"

using namespace qforge;
using namespace qforge::test;
using namespace qforge::rt_test;

namespace {

// ids [N, 4] (int64) -> Gather over a 10-row table -> y [N, 4, 2].
Graph embedding_graph() {
  Graph g;
  g.inputs.push_back({"ids", DType::I64, std::vector<Dim>{Dim{std::nullopt, "N"}, Dim{4, ""}}, ""});
  g.outputs.push_back({"y", DType::F32, std::nullopt, ""});
  g.set_initializer("table", random_f32({10, 2}, 1));
  g.nodes.push_back(Node{"embed", "Gather", "", {"table", "ids"}, {"y"}, {}, ""});
  g.set_opset("", 17);
  return g;
}

// x [N, S] + mask [N, M]: S and M are both symbolic, so only the runtime sees that they differ.
Graph masked_graph() {
  Graph g;
  const auto dims = [](const char* width) {
    return std::vector<Dim>{Dim{std::nullopt, "N"}, Dim{std::nullopt, width}};
  };
  g.inputs.push_back({"x", DType::F32, dims("S"), ""});
  g.inputs.push_back({"mask", DType::F32, dims("M"), ""});
  g.outputs.push_back({"y", DType::F32, std::nullopt, ""});
  g.nodes.push_back(Node{"add", "Add", "", {"x", "mask"}, {"y"}, {}, ""});
  g.set_opset("", 17);
  return g;
}

std::string calibration_error(const Graph& g, const std::filesystem::path& data, int64_t batch) {
  Dataset d(data, calibration_inputs(g), 0, batch);
  CalibOptions o;
  o.method = CalibMethod::MinMax;
  o.device = Device::Cpu;
  PassReport report;
  try {
    calibrate(g, d, o, report);
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::InvalidInput) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "calibrated on data the model rejects";
  return "";
}

}  // namespace

TEST(SampleContext, TokenIdPastTheVocabularyNamesFileAndSample) {
  ScratchDir dir("ctx_gather");
  std::vector<int64_t> ids(8 * 4, 3);
  ids[5 * 4 + 2] = 99999;  // sample 5
  write_file(dir / "ids.npz", zip({{"ids.npy", npy("<i8", {8, 4}, raw_bytes(ids))}}, false));
  for (int64_t batch : {1, 4, 8}) {
    const std::string msg = calibration_error(embedding_graph(), dir / "ids.npz", batch);
    const std::string prefix = "calibration data '" + (dir / "ids.npz").string() + "' sample 5: ";
    EXPECT_EQ(msg.rfind(prefix, 0), 0u) << "batch " << batch << ": " << msg;
    EXPECT_NE(msg.find("Gather"), std::string::npos) << msg;
    EXPECT_NE(msg.find("99999"), std::string::npos) << msg;
  }
}

TEST(SampleContext, MaskShorterThanTheIdsNamesTheFirstSample) {
  ScratchDir dir("ctx_mask");
  write_file(dir / "d.npz",
             zip({{"x.npy", npy("<f4", {3, 4}, raw_bytes(std::vector<float>(12, 1.0f)))},
                  {"mask.npy", npy("<f4", {3, 3}, raw_bytes(std::vector<float>(9, 0.0f)))}},
                 false));
  const std::string msg = calibration_error(masked_graph(), dir / "d.npz", 2);
  EXPECT_EQ(msg.rfind("calibration data '" + (dir / "d.npz").string() + "' sample 0: ", 0), 0u)
      << msg;
  EXPECT_NE(msg.find("do not broadcast"), std::string::npos) << msg;
}

TEST(SampleContext, MemoryBatchesCountSamplesAcrossBatches) {
  const Graph g = embedding_graph();
  MemoryBatches data({{{"ids", i64({2, 4}, {0, 1, 2, 3, 4, 5, 6, 7})}},
                      {{"ids", i64({2, 4}, {1, 1, 1, 1, 1, 10, 1, 1})}}},
                     "token batches");
  CalibOptions o;
  o.method = CalibMethod::MinMax;
  o.device = Device::Cpu;
  PassReport report;
  try {
    calibrate(g, data, o, report);
    FAIL() << "accepted id 10 in a 10-row table";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("token batches sample 3: ", 0), 0u) << e.what();
  }
}
