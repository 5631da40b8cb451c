// qforge: fills the global options, lets CLI11 pick the subcommand, runs it, and maps any
// error to one line on stderr and an exit code by category.
#include <cstdio>
#include <exception>
#include <filesystem>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "cli/app.h"
#include "ir/error.h"
#include "qforge/version.h"

namespace {

constexpr const char* kExitCodes =
    "Exit codes: 0 success, 2 usage, 3 invalid input, 4 unsupported, 5 I/O, 6 accuracy gate "
    "failed, 7 accuracy budget out of reach, 70 internal error.";

void setup_logging(const qforge::cli::GlobalOptions& global) {
  auto logger = spdlog::stderr_color_mt("qforge");
  logger->set_pattern("qforge: %^%l%$: %v");
  spdlog::set_default_logger(logger);
  if (global.quiet) {
    spdlog::set_level(spdlog::level::err);
  } else if (global.verbose >= 2) {
    spdlog::set_level(spdlog::level::trace);
  } else if (global.verbose == 1) {
    spdlog::set_level(spdlog::level::debug);
  } else {
    spdlog::set_level(spdlog::level::warn);
  }
}

int report_error(const qforge::cli::GlobalOptions& global, qforge::ErrorCategory category,
                 const std::string& message) {
  std::fprintf(stderr, "qforge: error: %s\n", message.c_str());
  if (global.json) {
    qforge::cli::print_json({{"ok", false},
                             {"error", message},
                             {"category", std::string(qforge::category_name(category))},
                             {"exit_code", qforge::exit_code(category)}});
  }
  return qforge::exit_code(category);
}

}  // namespace

int main(int argc, char** argv) {
  qforge::cli::GlobalOptions global;
  CLI::App app{"qforge: turns trained models into quantized, deployable artifacts.", "qforge"};
  app.footer(kExitCodes);
  app.set_version_flag("--version", std::string("qforge ") + qforge::kVersion);
  app.add_flag("-v,--verbose", global.verbose, "More log output on stderr (-vv for trace)");
  app.add_flag("-q,--quiet", global.quiet, "Only errors on stderr");
  app.add_flag("--json", global.json, "Print one JSON result object on stdout");
  app.require_subcommand(1);
  app.fallthrough();

  qforge::cli::RunFn run;
  qforge::cli::register_inspect(app, global, run);
  qforge::cli::register_convert(app, global, run);
  qforge::cli::register_run(app, global, run);
  qforge::cli::register_verify(app, global, run);
  qforge::cli::register_calibrate(app, global, run);
  qforge::cli::register_compare(app, global, run);
  qforge::cli::register_batch(app, global, run);
  qforge::cli::register_report(app, global, run);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return report_error(global, qforge::ErrorCategory::Usage,
                        std::string(e.what()) + " (see 'qforge --help')");
  }

  setup_logging(global);
  try {
    return run();
  } catch (const qforge::Error& e) {
    return report_error(global, e.category(), e.what());
  } catch (const std::filesystem::filesystem_error& e) {
    return report_error(global, qforge::ErrorCategory::IO, e.what());
  } catch (const std::bad_alloc&) {
    return report_error(global, qforge::ErrorCategory::IO,
                        "out of memory; try a smaller model or batch, or free memory");
  } catch (const std::exception& e) {
    return report_error(global, qforge::ErrorCategory::Internal,
                        std::string(e.what()) + " (this is a bug in qforge; please report it)");
  }
}
