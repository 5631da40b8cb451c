#pragma once
// Shared state of one qforge invocation: global flags and how results are printed. Each
// subcommand registers itself on the CLI11 app and returns an exit code from its run function.
#include <functional>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

namespace qforge::cli {

struct GlobalOptions {
  int verbose = 0;
  bool quiet = false;
  bool json = false;  // one machine-readable result object on stdout
};

using Json = nlohmann::ordered_json;
using RunFn = std::function<int()>;

// Each subcommand adds itself to `app` and sets `run` to be called when it is chosen.
void register_inspect(CLI::App& app, const GlobalOptions& global, RunFn& run);
void register_convert(CLI::App& app, const GlobalOptions& global, RunFn& run);
void register_run(CLI::App& app, const GlobalOptions& global, RunFn& run);
void register_verify(CLI::App& app, const GlobalOptions& global, RunFn& run);
void register_calibrate(CLI::App& app, const GlobalOptions& global, RunFn& run);
void register_compare(CLI::App& app, const GlobalOptions& global, RunFn& run);
void register_batch(CLI::App& app, const GlobalOptions& global, RunFn& run);
void register_report(CLI::App& app, const GlobalOptions& global, RunFn& run);

// Prints `result` as one JSON line on stdout.
void print_json(const Json& result);
// "12.3 MiB" style sizes for text output.
std::string human_bytes(uint64_t bytes);

}  // namespace qforge::cli
