// qforge report IN -o OUT.html: the HTML report (cli/report_job.h) of a report document that
// qforge wrote: a bundle's report.json (or the bundle folder), or the --json result of convert,
// calibrate or compare saved to a file.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/app.h"
#include "cli/report_job.h"
#include "ir/error.h"

namespace qforge::cli {

namespace {

namespace fs = std::filesystem;

// Report documents are a few MB; a larger file is not one.
constexpr uintmax_t kMaxDocumentBytes = uintmax_t{1} << 30;

struct ReportParams {
  std::string input;
  std::string output;
};

std::string read_document(const fs::path& path) {
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) fail_io("cannot read '" + path.string() + "': " + ec.message());
  if (size > kMaxDocumentBytes) {
    fail_invalid("'" + path.string() + "' is " + std::to_string(size) +
                 " bytes, more than a report document holds (1 GiB); give a bundle's "
                 "report.json or the --json output of convert, calibrate or compare");
  }
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in && !in.eof()) fail_io("cannot read '" + path.string() + "'");
  return text.str();
}

int run_report(const GlobalOptions& global, const ReportParams& p) {
  fs::path input = p.input;
  std::error_code ec;
  if (fs::is_directory(input, ec)) input /= "report.json";  // a bundle folder
  if (!fs::is_regular_file(input, ec)) {
    fail_io("'" + input.string() + "' does not exist or is not a file; give a bundle's "
            "report.json (or the bundle folder) or a saved --json result");
  }
  check_report_path(p.output, {input.string()});
  const std::string text = read_document(input);
  Json document;
  try {
    document = Json::parse(text);
  } catch (const Json::parse_error& e) {
    fail_invalid("'" + input.string() + "' is not JSON (byte " + std::to_string(e.byte) +
                 "); give a bundle's report.json or the --json output of convert, calibrate "
                 "or compare");
  }
  write_report(document, p.output, "'" + input.string() + "'", /*require_content=*/true);
  if (global.json) {
    print_json({{"ok", true}, {"command", "report"}, {"input", input.string()},
                {"output", p.output}});
  } else if (!global.quiet) {
    std::fprintf(stderr, "wrote %s\n", p.output.c_str());
  }
  return 0;
}

}  // namespace

void register_report(CLI::App& app, const GlobalOptions& global, RunFn& run) {
  auto p = std::make_shared<ReportParams>();
  auto* cmd = app.add_subcommand(
      "report", "Draw an HTML report (inline SVG charts, tables, the data as JSON) from a "
                "bundle's report.json or a saved --json result");
  cmd->add_option("IN", p->input,
                  "A bundle's report.json (or the NAME.qfb folder), or the --json output of "
                  "convert, calibrate or compare saved to a file")
      ->required();
  cmd->add_option("-o,--output", p->output, "The HTML file to write")->required();
  cmd->footer(
      "Example: qforge convert calib_data/sample_cnn.onnx -o sample.qfb --quant int8 --calib "
      "calib_data/calib.npz && qforge report sample.qfb/report.json -o sample_report.html");
  cmd->callback([&global, &run, p] { run = [&global, p] { return run_report(global, *p); }; });
}

}  // namespace qforge::cli
