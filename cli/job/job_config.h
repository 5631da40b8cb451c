#pragma once
// Job files: a convert command written as a mapping (`qforge convert --config job.yaml`) or a
// list of them (`qforge batch jobs.yaml`). YAML (yaml-cpp) or JSON (nlohmann-json, for a
// .json file). Keys are the long option names of the subcommand without the dashes (`quant`,
// `block-size`, `block_size` too), `input` for the positional model and `output` for -o;
// values are strings, numbers, true/false for flags and lists for repeatable options.
//
// Two layers: parse_* turn text into JobSpecs (keys and raw values with their line), knowing
// nothing of the options; bind_job checks a JobSpec against a CLI11 subcommand's options, so
// that flags added to convert are job keys with no change here.
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

namespace qforge::cli {

struct JobValue {
  enum class Kind { Scalar, Bool, List };
  Kind kind = Kind::Scalar;
  std::vector<std::string> items;  // Scalar, Bool: one ("true"/"false"); List: each element
};

struct JobEntry {
  std::string key;  // as written in the file
  JobValue value;
  int line = 0;  // 1-based; 0 when the format gives none (JSON)
};

struct JobSpec {
  std::string file;               // the file it came from, for messages and relative paths
  std::string name;               // batch: `name:` or "job-N"
  int line = 0;                   // where the job starts (batch)
  std::vector<JobEntry> entries;  // file order; defaults first, then the job's own
};

// "FILE line N" or "FILE" when line is 0.
std::string job_where(const std::string& file, int line);

// One mapping of keys (a --config file). `file` names the source in messages and picks the
// format by extension (.json: JSON, else YAML). Throws Error(Usage) with file and line.
JobSpec parse_job_config(std::string_view text, const std::string& file);

// A batch file: a list of job mappings, or {defaults: MAPPING, jobs: LIST}. Each job is the
// defaults overridden by its own keys; `name` is taken out of the entries. Throws Error(Usage).
std::vector<JobSpec> parse_job_list(std::string_view text, const std::string& file);

// The file's bytes; Error(IO) naming it when it cannot be read.
std::string read_job_file(const std::string& file);

// --- binding to a CLI11 subcommand -------------------------------------------------------

// The keys `cmd` accepts, sorted: long option names without dashes, "input" for a positional
// named IN (other positionals: their name in lower case). --config and --help are not keys.
std::vector<std::string> job_keys(CLI::App& cmd);

struct BoundEntry {
  CLI::Option* option = nullptr;
  std::string key;                  // the canonical key (dashes)
  std::vector<std::string> values;  // what the option receives; a flag set to true: {"true"}
  bool flag = false;
  int line = 0;
};

// Checks every key and value type against `cmd` and resolves relative paths (the keys named
// by job_path_keys) against the folder of job.file. Throws Error(Usage): an unknown key
// (with the list of valid ones), a key given twice, a list for a single-valued option, a
// non-boolean for a flag, a boolean for a valued option.
std::vector<BoundEntry> bind_job(CLI::App& cmd, const JobSpec& job);

// Keys whose values are paths and are resolved against the job file's folder: input, output,
// lora (PATH[:WEIGHT]), weights, reference, calib, import-calib, report.
const std::vector<std::string>& job_path_keys();

// Gives every bound option that was not given on the command line (count() == 0) its
// values, running the option's validators and conversion; a failure is Error(Usage) naming
// the key, file and line. Command-line flags therefore override the file.
void apply_job(const std::vector<BoundEntry>& bound, const std::string& file);

// The argument list a command line with the same effect would hold (after the subcommand's
// name): positional values first, then `--key=value` per option value, `--flag` for a flag
// set to true (false adds nothing), in file order.
std::vector<std::string> job_arguments(const std::vector<BoundEntry>& bound);

}  // namespace qforge::cli
