#pragma once
// A pass transforms a Graph and says what it did. The pipeline times each pass and gathers
// the reports, which the CLI prints as text or JSON.
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "ir/graph.h"

namespace qforge {

struct PassReport {
  std::string pass;
  double seconds = 0.0;
  nlohmann::ordered_json stats = nlohmann::ordered_json::object();  // counts, bytes, per-tensor rows
  std::vector<std::string> warnings;

  void count(const std::string& key, int64_t delta = 1);
  void warn(std::string message) { warnings.push_back(std::move(message)); }
};

class Pass {
 public:
  virtual ~Pass() = default;
  virtual std::string_view name() const = 0;
  virtual void run(Graph& graph, PassReport& report) = 0;
};

// A pass made from a function, for steps that need no state of their own.
std::unique_ptr<Pass> make_function_pass(std::string name,
                                         std::function<void(Graph&, PassReport&)> run);

struct PipelineReport {
  std::vector<PassReport> passes;
  // with_timings false leaves out each pass's wall time: for artifacts (a bundle's report.json)
  // that must be byte-identical for the same inputs and flags.
  nlohmann::ordered_json to_json(bool with_timings = true) const;
};

class Pipeline {
 public:
  Pipeline& add(std::unique_ptr<Pass> pass);
  bool empty() const { return passes_.empty(); }
  // Runs every pass in order; a pass that throws stops the pipeline (the error propagates).
  PipelineReport run(Graph& graph) const;

 private:
  std::vector<std::unique_ptr<Pass>> passes_;
};

}  // namespace qforge
