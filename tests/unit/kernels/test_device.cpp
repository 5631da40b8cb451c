#include <gtest/gtest.h>
#include <omp.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <sstream>
#include <string>

#include "cli/option_parsers.h"
#include "ir/error.h"
#include "kernels/device.h"

using namespace qforge;

namespace {

ErrorCategory category_of(auto&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.category();
  }
  ADD_FAILURE() << "no qforge::Error thrown";
  return ErrorCategory::Internal;
}

// Routes spdlog's default logger into a string for the life of the object.
class CapturedLog {
 public:
  CapturedLog() : previous_(spdlog::default_logger()) {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(stream_);
    auto logger = std::make_shared<spdlog::logger>("captured", sink);
    logger->set_level(spdlog::level::info);
    spdlog::set_default_logger(logger);
  }
  ~CapturedLog() { spdlog::set_default_logger(previous_); }
  std::string text() const { return stream_.str(); }

 private:
  std::ostringstream stream_;
  std::shared_ptr<spdlog::logger> previous_;
};

}  // namespace

TEST(Device, ParsesNamesAndRejectsOthers) {
  EXPECT_EQ(parse_device("auto"), Device::Auto);
  EXPECT_EQ(parse_device("cpu"), Device::Cpu);
  EXPECT_EQ(parse_device("cuda"), Device::Cuda);
  for (Device d : {Device::Auto, Device::Cpu, Device::Cuda}) {
    EXPECT_EQ(parse_device(device_name(d)), d);
  }
  EXPECT_EQ(category_of([] { parse_device("gpu"); }), ErrorCategory::Usage);
  EXPECT_EQ(category_of([] { parse_device("CPU"); }), ErrorCategory::Usage);
}

TEST(Device, BuiltFlagMatchesCompileDefinition) {
#ifdef QFORGE_HAVE_CUDA
  EXPECT_TRUE(cuda_built());
#else
  EXPECT_FALSE(cuda_built());
  EXPECT_FALSE(cuda_available());
#endif
}

TEST(Device, AutoPicksCudaExactlyWhenUsableAndLogsWhyInOneLine) {
  CapturedLog log;
  const Device chosen = resolve_device(Device::Auto);
  EXPECT_EQ(chosen, auto_uses_cuda() ? Device::Cuda : Device::Cpu);
  EXPECT_TRUE(cuda_available() || !auto_uses_cuda()) << "Auto picks CUDA only with a device";
  EXPECT_EQ(kernel_uses_cuda(Device::Auto), auto_uses_cuda());
  const std::string text = log.text();
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1) << text;
  if (!cuda_built()) {
    EXPECT_NE(text.find("CUDA not built in"), std::string::npos) << text;
  } else if (!cuda_available()) {
    EXPECT_NE(text.find("no CUDA device: "), std::string::npos) << text;
  } else if (!auto_uses_cuda()) {  // a device, but cuBLAS does not load
    EXPECT_NE(text.find("using CPU"), std::string::npos) << text;
    EXPECT_NE(text.find("cuBLAS"), std::string::npos) << text;
  } else {
    EXPECT_NE(text.find("using CUDA"), std::string::npos) << text;
  }
}

TEST(Device, CpuResolvesToCpu) { EXPECT_EQ(resolve_device(Device::Cpu), Device::Cpu); }

TEST(Device, CudaWithoutDeviceIsUnsupportedWithReason) {
  if (cuda_available()) {
    EXPECT_EQ(resolve_device(Device::Cuda), Device::Cuda);
    return;
  }
  try {
    resolve_device(Device::Cuda);
    FAIL() << "resolve_device(Cuda) returned without a CUDA device";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::Unsupported);
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("--device cuda: ", 0), 0u) << msg;
    EXPECT_NE(msg.find(cuda_built() ? "no CUDA device: " : "CUDA not built in"), std::string::npos)
        << msg;
    EXPECT_NE(msg.find("; use --device cpu or auto"), std::string::npos) << msg;
  }
}

TEST(Device, CpuThreadsSetAndDefault) {
  set_cpu_threads(3);
  EXPECT_EQ(cpu_threads(), 3);
  set_cpu_threads(0);
  EXPECT_EQ(cpu_threads(), omp_get_max_threads());
  EXPECT_EQ(category_of([] { set_cpu_threads(-1); }), ErrorCategory::Usage);
  EXPECT_EQ(cpu_threads(), omp_get_max_threads());
}
