#include "ir/pass.h"

namespace qforge {

void PassReport::count(const std::string& key, int64_t delta) {
  if (!stats.contains(key)) stats[key] = 0;
  stats[key] = stats[key].get<int64_t>() + delta;
}

nlohmann::ordered_json PipelineReport::to_json(bool with_timings) const {
  auto arr = nlohmann::ordered_json::array();
  for (const auto& p : passes) {
    nlohmann::ordered_json j;
    j["pass"] = p.pass;
    if (with_timings) j["seconds"] = p.seconds;
    j["stats"] = p.stats;
    j["warnings"] = p.warnings;
    arr.push_back(std::move(j));
  }
  return arr;
}

namespace {
class FunctionPass final : public Pass {
 public:
  FunctionPass(std::string name, std::function<void(Graph&, PassReport&)> run)
      : name_(std::move(name)), run_(std::move(run)) {}
  std::string_view name() const override { return name_; }
  void run(Graph& graph, PassReport& report) override { run_(graph, report); }

 private:
  std::string name_;
  std::function<void(Graph&, PassReport&)> run_;
};
}  // namespace

std::unique_ptr<Pass> make_function_pass(std::string name,
                                         std::function<void(Graph&, PassReport&)> run) {
  return std::make_unique<FunctionPass>(std::move(name), std::move(run));
}

Pipeline& Pipeline::add(std::unique_ptr<Pass> pass) {
  passes_.push_back(std::move(pass));
  return *this;
}

PipelineReport Pipeline::run(Graph& graph) const {
  PipelineReport report;
  for (const auto& pass : passes_) {
    PassReport r;
    r.pass = std::string(pass->name());
    const auto start = std::chrono::steady_clock::now();
    pass->run(graph, r);
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    report.passes.push_back(std::move(r));
  }
  return report;
}

}  // namespace qforge
