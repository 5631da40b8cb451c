// Job files (cli/job/job_config.h): parsing YAML and JSON, binding keys to a CLI11
// subcommand's options, precedence of the command line, relative paths, and the argument
// list a batch job's child process gets.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli/job/job_config.h"
#include "ir/error.h"

namespace qforge::cli {
namespace {

// A subcommand shaped like convert: a positional, -o, valued options, flags, a repeatable
// option, a delimited list.
struct Command {
  CLI::App app{"test"};
  CLI::App* cmd = nullptr;
  std::string input, output, quant = "none", exclude;
  int block_size = 128;
  bool per_tensor = false, overwrite = false;
  std::vector<std::string> lora, op_types, overrides;
  Command() {
    cmd = app.add_subcommand("convert");
    cmd->add_option("IN", input);
    cmd->add_option("-o,--output", output);
    cmd->add_option("--config", exclude);  // not a job key
    cmd->add_option("--quant", quant)->check(CLI::IsMember({"none", "int8", "w4a16"}));
    cmd->add_option("--exclude", exclude);
    cmd->add_option("--block-size", block_size)->check(CLI::IsMember({32, 64, 128}));
    cmd->add_flag("--per-tensor", per_tensor);
    cmd->add_flag("--overwrite", overwrite);
    cmd->add_option("--lora", lora)->allow_extra_args(false)->take_all();
    cmd->add_option("--op-types", op_types)->delimiter(',');
    cmd->add_option("--override", overrides);
  }
  void parse(std::vector<std::string> args) {
    args.insert(args.begin(), "convert");
    std::reverse(args.begin(), args.end());
    app.parse(args);
  }
};

std::string usage_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::Usage) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return {};
}

TEST(JobConfig, YamlKeysFillOptions) {
  Command c;
  const JobSpec job = parse_job_config(
      "input: m.onnx\noutput: out.onnx\nquant: w4a16\nblock_size: 64\nper-tensor: true\n"
      "overwrite: false\nlora: [a:0.7, b:0.3]\nop-types: [Conv, MatMul]\n",
      "job.yaml");
  apply_job(bind_job(*c.cmd, job), job.file);
  EXPECT_EQ(c.input, "m.onnx");
  EXPECT_EQ(c.output, "out.onnx");
  EXPECT_EQ(c.quant, "w4a16");
  EXPECT_EQ(c.block_size, 64);
  EXPECT_TRUE(c.per_tensor);
  EXPECT_FALSE(c.overwrite);
  EXPECT_EQ(c.lora, (std::vector<std::string>{"a:0.7", "b:0.3"}));
  EXPECT_EQ(c.op_types, (std::vector<std::string>{"Conv", "MatMul"}));
  EXPECT_EQ(c.cmd->count("--block-size"), 1u);  // convert asks count() which flags were given
}

TEST(JobConfig, JsonGivesTheSameAsYaml) {
  Command y, j;
  const JobSpec yj = parse_job_config(
      "quant: int8\nblock-size: 32\nper_tensor: true\n"
      "override: [a=per-tensor]\n",
      "j.yaml");
  const JobSpec jj = parse_job_config(
      R"({"quant": "int8", "block-size": 32, "per_tensor": true, "override": ["a=per-tensor"]})",
      "j.json");
  apply_job(bind_job(*y.cmd, yj), yj.file);
  apply_job(bind_job(*j.cmd, jj), jj.file);
  EXPECT_EQ(y.quant, j.quant);
  EXPECT_EQ(j.block_size, 32);
  EXPECT_EQ(y.block_size, j.block_size);
  EXPECT_TRUE(j.per_tensor);
  EXPECT_EQ(j.overrides, y.overrides);
  EXPECT_EQ(job_arguments(bind_job(*y.cmd, yj)), job_arguments(bind_job(*j.cmd, jj)));
}

TEST(JobConfig, CommandLineOverridesTheFile) {
  Command c;
  c.parse({"--quant", "int8", "--lora", "x"});
  const JobSpec job = parse_job_config("quant: w4a16\nlora: [a, b]\nexclude: head\n", "j.yaml");
  apply_job(bind_job(*c.cmd, job), job.file);
  EXPECT_EQ(c.quant, "int8");
  EXPECT_EQ(c.lora, (std::vector<std::string>{"x"}));
  EXPECT_EQ(c.exclude, "head");  // not on the command line: from the file
}

TEST(JobConfig, UnknownKeyNamesKeyFileLineAndValidKeys) {
  Command c;
  const JobSpec job = parse_job_config("quant: int8\n\nqaunt: int8\n", "dir/job.yaml");
  const std::string msg = usage_error([&] { bind_job(*c.cmd, job); });
  EXPECT_NE(msg.find("dir/job.yaml line 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'qaunt'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("block-size, exclude, input, lora"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("config"), std::string::npos) << "--config is not a job key: " << msg;
}

TEST(JobConfig, WrongTypesAreRefusedWithTheLine) {
  const auto error_for = [](const std::string& text) {
    Command c;
    return usage_error([&] {
      const JobSpec job = parse_job_config(text, "j.yaml");
      apply_job(bind_job(*c.cmd, job), job.file);
    });
  };
  EXPECT_NE(error_for("quant: [int8, w4a16]\n").find("line 1: 'quant' takes one value, not a list"),
            std::string::npos);
  EXPECT_NE(error_for("quant: int8\nper-tensor: yes\n").find("line 2"), std::string::npos);
  EXPECT_NE(error_for("per-tensor: 1\n").find("is a flag: give true or false"), std::string::npos);
  EXPECT_NE(error_for("quant: true\n").find("takes a value, not true/false"), std::string::npos);
  EXPECT_NE(error_for("quant: {a: 1}\n").find("a mapping"), std::string::npos);
  EXPECT_NE(error_for("block-size: abc\n").find("line 1: 'block-size'"), std::string::npos);
  EXPECT_NE(error_for("quant: int9\n").find("'quant'"), std::string::npos);
  EXPECT_NE(error_for("quant: int8\nquant_: 1\n").find("unknown key"), std::string::npos);
  EXPECT_NE(error_for("block_size: 32\nblock-size: 64\n").find("given twice"), std::string::npos);
  EXPECT_NE(error_for("exclude: \"\"\n").find("'exclude' is empty"), std::string::npos);
  EXPECT_NE(error_for("block_size: >4-\n").find("'block_size' is empty"), std::string::npos);
  EXPECT_NE(error_for("- a\n- b\n").find("expected a mapping"), std::string::npos);
  EXPECT_NE(error_for("quant: [int8\n").find("not valid YAML"), std::string::npos);
}

TEST(JobConfig, JsonErrorsNameTheFile) {
  Command c;
  EXPECT_NE(usage_error([&] {
              parse_job_config("{\"quant\": ", "x.json");
            }).find("x.json: not valid JSON"),
            std::string::npos);
  EXPECT_NE(usage_error([&] {
              bind_job(*c.cmd, parse_job_config(R"({"blok": 1})", "x.json"));
            }).find("x.json: unknown key 'blok'"),
            std::string::npos);
}

TEST(JobConfig, RelativePathsResolveAgainstTheFilesFolder) {
  Command c;
  const JobSpec job = parse_job_config(
      "input: ../models/m.onnx\noutput: out/m.onnx\nlora: [ad:0.5, /abs/b, c]\nexclude: a/b\n",
      "jobs/j.yaml");
  apply_job(bind_job(*c.cmd, job), job.file);
  EXPECT_EQ(c.input, "models/m.onnx");
  EXPECT_EQ(c.output, "jobs/out/m.onnx");
  EXPECT_EQ(c.lora, (std::vector<std::string>{"jobs/ad:0.5", "/abs/b", "jobs/c"}));
  EXPECT_EQ(c.exclude, "a/b") << "a regex is not a path";
}

TEST(JobConfig, ArgumentsRebuildTheSameOptions) {
  Command a, b;
  const JobSpec job = parse_job_config(
      "input: -m.onnx\noutput: o.onnx\nquant: int8\nexclude: -x\nper-tensor: true\n"
      "overwrite: false\nlora: [a, b:2]\nop-types: [Conv, Gemm]\n",
      "j.yaml");
  apply_job(bind_job(*a.cmd, job), job.file);
  const auto args = job_arguments(bind_job(*b.cmd, job));
  b.parse(args);
  EXPECT_EQ(b.input, "./-m.onnx");  // the same file; CLI11 would read -m as an option
  EXPECT_EQ(b.output, a.output);
  EXPECT_EQ(b.quant, a.quant);
  EXPECT_EQ(b.exclude, "-x");
  EXPECT_TRUE(b.per_tensor);
  EXPECT_FALSE(b.overwrite);
  EXPECT_EQ(b.lora, a.lora);
  EXPECT_EQ(b.op_types, a.op_types);
}

TEST(JobConfig, BatchDefaultsAreOverriddenPerJob) {
  const auto jobs = parse_job_list(
      "defaults:\n  quant: int8\n  exclude: head\njobs:\n  - name: first\n    input: a.onnx\n"
      "  - input: b.onnx\n    quant: w4a16\n",
      "b.yaml");
  ASSERT_EQ(jobs.size(), 2u);
  EXPECT_EQ(jobs[0].name, "first");
  EXPECT_EQ(jobs[1].name, "job-2");
  EXPECT_EQ(jobs[0].line, 5);
  Command c;
  apply_job(bind_job(*c.cmd, jobs[1]), jobs[1].file);
  EXPECT_EQ(c.quant, "w4a16");
  EXPECT_EQ(c.exclude, "head");
  Command d;
  apply_job(bind_job(*d.cmd, jobs[0]), jobs[0].file);
  EXPECT_EQ(d.quant, "int8");
  const auto list = parse_job_list(R"([{"input": "a"}, {"input": "b", "name": "two"}])", "b.json");
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[1].name, "two");
}

TEST(JobConfig, BadBatchFilesAreRefused) {
  EXPECT_NE(usage_error([] { parse_job_list("jobs: []\n", "b.yaml"); }).find("holds no jobs"),
            std::string::npos);
  EXPECT_NE(usage_error([] {
              parse_job_list("job:\n  - input: a\n", "b.yaml");
            }).find("b.yaml line 1: unknown top-level key 'job'"),
            std::string::npos);
  EXPECT_NE(usage_error([] {
              parse_job_list("- input: a\n- 3\n", "b.yaml");
            }).find("line 2: job 2 is not a mapping"),
            std::string::npos);
  EXPECT_NE(usage_error([] { parse_job_list("- name: [a]\n", "b.yaml"); }).find("'name' must be"),
            std::string::npos);
}

}  // namespace
}  // namespace qforge::cli
