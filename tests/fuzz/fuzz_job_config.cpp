// Fuzzes the job-file parser (cli/job/job_config.h: convert --config, qforge batch). The first
// byte picks YAML or JSON and a --config mapping or a batch list; the rest is the file. Any
// input is refused with a qforge::Error or parsed into entries that bind to a convert-shaped
// command and give an argument list that CLI11 parses back; never a crash or a read outside
// the input.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "cli/job/job_config.h"
#include "ir/error.h"

#include "abort_on_internal.h"

namespace {

void check(bool ok) {
  if (!ok) std::abort();  // libFuzzer reports the input that got here
}

struct Command {
  CLI::App app{"fuzz"};
  CLI::App* cmd = nullptr;
  std::string input, output, quant, exclude;
  int block_size = 128;
  bool per_tensor = false;
  std::vector<std::string> lora, op_types;
  Command() {
    cmd = app.add_subcommand("convert");
    cmd->add_option("IN", input);
    cmd->add_option("-o,--output", output);
    cmd->add_option("--quant", quant);
    cmd->add_option("--exclude", exclude);
    cmd->add_option("--block-size", block_size);
    cmd->add_flag("--per-tensor", per_tensor);
    cmd->add_option("--lora", lora)->allow_extra_args(false)->take_all();
    cmd->add_option("--op-types", op_types)->delimiter(',');
  }
};

void bind_and_rebuild(const qforge::cli::JobSpec& job) {
  Command a;
  try {
    const auto bound = qforge::cli::bind_job(*a.cmd, job);
    qforge::cli::apply_job(bound, job.file);
    Command b;
    auto args = qforge::cli::job_arguments(bound);
    args.insert(args.begin(), "convert");
    try {
      b.app.parse(std::vector<std::string>(args.rbegin(), args.rend()));
    } catch (const CLI::ParseError& e) {
      std::fprintf(stderr, "command line form refused: %s\n", e.what());
      std::abort();  // apply_job accepted what the command line form refuses
    }
    const std::string input = a.input.rfind('-', 0) == 0 ? "./" + a.input : a.input;
    check(b.input == input && b.output == a.output && b.quant == a.quant &&
          b.exclude == a.exclude && b.block_size == a.block_size && b.per_tensor == a.per_tensor &&
          b.lora == a.lora && b.op_types == a.op_types);
  } catch (const qforge::Error& e) {
    qforge::fuzz::abort_on_internal(e);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool json = (data[0] & 1) != 0;
  const bool list = (data[0] & 2) != 0;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  const std::string file = json ? "fuzz/job.json" : "fuzz/job.yaml";
  try {
    if (list) {
      for (const auto& job : qforge::cli::parse_job_list(text, file)) bind_and_rebuild(job);
    } else {
      bind_and_rebuild(qforge::cli::parse_job_config(text, file));
    }
  } catch (const qforge::Error& e) {
    qforge::fuzz::abort_on_internal(e);
  }
  return 0;
}
