// qforge verify BUNDLE: checks every file of an engine bundle against its manifest.
#include <cstdio>

#include <spdlog/spdlog.h>

#include "cli/app.h"
#include "importers/bundle/bundle_reader.h"
#include "ir/error.h"

namespace qforge::cli {

namespace {

// The JSON object main prints for an error under the global --json, for this command's own
// --json flag.
void print_error_json(const Error& e) {
  print_json({{"ok", false},
              {"error", e.what()},
              {"category", std::string(category_name(e.category()))},
              {"exit_code", exit_code(e.category())}});
}

}  // namespace

void register_verify(CLI::App& app, const GlobalOptions& global, RunFn& run) {
  auto* cmd = app.add_subcommand(
      "verify", "Check every file of an engine bundle (NAME.qfb) against its manifest's digests");
  auto bundle = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  cmd->add_option("BUNDLE", *bundle, "Bundle folder written by convert -o NAME.qfb")->required();
  cmd->add_flag("--json", *json, "Print one JSON object on stdout");
  cmd->footer(
      "Exit 0 when every listed file has its size and SHA-256, 3 when one is missing or "
      "modified (named on stderr).\n"
      "Example: qforge convert calib_data/sample_cnn.onnx -o sample.qfb --quant int8-weights && "
      "qforge verify sample.qfb");
  cmd->callback([&global, &run, bundle, json] {
    run = [&global, bundle, json] {
      VerifyResult result;
      try {
        result = verify_bundle(*bundle);
      } catch (const Error& e) {
        // main prints the error line (and the JSON object for the global --json).
        if (*json && !global.json) print_error_json(e);
        throw;
      }
      const bool ok = result.ok();
      if (global.json || *json) {
        Json files = Json::array();
        for (const auto& f : result.files) {
          files.push_back({{"name", f.name},
                           {"status", std::string(bundle_file_state_name(f.state))},
                           {"size", f.size},
                           {"sha256", f.sha256}});
        }
        Json out = {{"ok", ok}, {"bundle", result.dir.string()}, {"files", files}};
        if (!ok) {
          out["error"] = result.first_problem();
          out["category"] = std::string(category_name(ErrorCategory::InvalidInput));
          out["exit_code"] = exit_code(ErrorCategory::InvalidInput);
        }
        print_json(out);
      } else {
        for (const auto& f : result.files) {
          std::printf("%-8s %s %s\n", std::string(bundle_file_state_name(f.state)).c_str(),
                      f.name.c_str(), human_bytes(f.size).c_str());
        }
      }
      for (const auto& f : result.files) {
        if (f.state == BundleFileState::Unlisted) spdlog::warn("{}", f.message);
      }
      if (!ok) {
        std::fprintf(stderr, "qforge: error: %s\n", result.first_problem().c_str());
        return exit_code(ErrorCategory::InvalidInput);
      }
      return 0;
    };
  });
}

}  // namespace qforge::cli
