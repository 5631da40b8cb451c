// qforge batch JOBS.yaml -j N: many conversions from one file. Every job is checked (keys,
// value types, inputs present, outputs distinct) before any runs; then each runs as a child
// `qforge convert` of this same binary, at most N at once, so that a crash in one cannot take
// the others down and each keeps its own exit code. A job's output is the bytes a single
// `qforge convert` with the same options writes.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>

#include "cli/app.h"
#include "cli/job/job_config.h"
#include "importers/lora/lora_adapter.h"
#include "ir/error.h"

extern char** environ;

namespace qforge::cli {

namespace {

namespace fs = std::filesystem;

struct BatchParams {
  std::string file;
  int jobs = 1;
  bool json = false;
};

struct PreparedJob {
  JobSpec spec;
  std::vector<std::string> args;  // after "convert"
  std::string output;             // as the job gives it (resolved against the job file)
};

struct JobResult {
  bool ok = false;
  int exit_code = 0;
  std::string error;
  double seconds = 0;
};

std::string bound_value(const std::vector<BoundEntry>& bound, const std::string& key) {
  for (const auto& b : bound) {
    if (b.key == key && !b.values.empty()) return b.values.front();
  }
  return {};
}

// Keys, types and validators on a scratch convert command (the real one's options), the
// output given, and every input file present. Throws Error naming the job.
PreparedJob prepare_job(const JobSpec& spec) {
  CLI::App scratch;
  GlobalOptions global;
  RunFn run;
  register_convert(scratch, global, run);
  CLI::App& convert = *scratch.get_subcommand("convert");
  const std::string where = job_where(spec.file, spec.line) + ": job '" + spec.name + "'";
  try {
    const auto bound = bind_job(convert, spec);
    apply_job(bound, spec.file);
    PreparedJob job{spec, job_arguments(bound), bound_value(bound, "output")};
    if (bound_value(bound, "input").empty()) fail_usage(where + " has no 'input'");
    if (job.output.empty()) fail_usage(where + " has no 'output'");
    for (const auto& b : bound) {
      const auto& paths = job_path_keys();
      // Outputs (the model, --report) need not exist yet.
      if (b.key == "output" || b.key == "report" ||
          std::find(paths.begin(), paths.end(), b.key) == paths.end())
        continue;
      for (const auto& v : b.values) {
        const fs::path path = b.key == "lora" ? parse_adapter_spec(v).path : fs::path(v);
        std::error_code ec;
        if (!fs::exists(path, ec)) {
          fail_io(where + ": " + b.key + " '" + path.string() + "' does not exist" +
                  (b.line > 0 ? " (line " + std::to_string(b.line) + ")" : "") +
                  "; paths in a job file are relative to its folder");
        }
      }
    }
    return job;
  } catch (const Error& e) {
    const std::string message = e.what();
    if (message.rfind(where, 0) == 0) throw;
    throw Error(e.category(), message.rfind(spec.file, 0) == 0
                                  ? message + " (job '" + spec.name + "')"
                                  : where + ": " + message);
  }
}

// The last "qforge: error: ..." line of a child's stderr, else its last non-empty line.
std::string last_error_line(const std::string& text) {
  std::string last;
  std::string last_error;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    start = end + 1;
    if (line.empty()) continue;
    last = line;
    constexpr std::string_view prefix = "qforge: error: ";
    if (line.rfind(prefix, 0) == 0) last_error = line.substr(prefix.size());
  }
  return last_error.empty() ? last : last_error;
}

// A child killed by a signal (SIGKILL, the OOM killer) runs no destructors, so the temporary
// names its writers had made beside the output stay behind: AtomicFile's `.NAME.tmp-PID-N`
// (the model, its external data, safetensors shards and index) and a bundle's
// `.NAME.qfb.tmp-PID` folder. They carry the child's pid, which is how they are told apart from
// anything else in the folder. A bundle's `.NAME.qfb.old-PID` is the user's previous bundle and
// is left alone.
void remove_temp_files_of(const fs::path& output, pid_t pid) {
  fs::path target = output;
  if (target.filename().empty()) target = target.parent_path();  // "x.qfb/"
  const fs::path folder = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  const std::string tag = ".tmp-" + std::to_string(pid);
  std::error_code ec;
  std::vector<fs::path> leftovers;
  for (fs::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const size_t at = name.rfind(tag);
    if (name.front() != '.' || at == std::string::npos) continue;
    const std::string_view rest = std::string_view(name).substr(at + tag.size());  // "" or "-N"
    const bool counter = rest.size() > 1 && rest.front() == '-' &&
                         rest.find_first_not_of("0123456789", 1) == std::string_view::npos;
    if (rest.empty() || counter) leftovers.push_back(it->path());
  }
  for (const auto& path : leftovers) fs::remove_all(path, ec);
}

JobResult run_child(const std::string& exe, const PreparedJob& job, int verbose) {
  const std::vector<std::string>& args = job.args;
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::string> argv_text = {exe};
  if (verbose > 0) {
    argv_text.push_back(verbose > 1 ? "-vv" : "-v");
  } else {
    argv_text.push_back("--quiet");
  }
  argv_text.push_back("convert");
  argv_text.insert(argv_text.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_text) argv.push_back(a.data());
  argv.push_back(nullptr);

  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) fail_io(std::string("pipe: ") + std::strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDERR_FILENO);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(pipe_fds[1]);
  JobResult r;
  if (rc != 0) {
    close(pipe_fds[0]);
    r.exit_code = exit_code(ErrorCategory::Internal);
    r.error = "cannot start '" + exe + "': " + std::strerror(rc);
    return r;
  }
  std::string captured;
  char buf[4096];
  for (;;) {
    const ssize_t n = read(pipe_fds[0], buf, sizeof buf);
    if (n > 0) {
      captured.append(buf, static_cast<size_t>(n));
      if (captured.size() > (1u << 20)) captured.erase(0, captured.size() - (1u << 19));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  close(pipe_fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (WIFEXITED(status)) {
    r.exit_code = WEXITSTATUS(status);
    r.ok = r.exit_code == 0;
    if (!r.ok) r.error = last_error_line(captured);
  } else {
    const int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    r.exit_code = 128 + sig;
    r.error = "convert died from signal " + std::to_string(sig) + " (" + strsignal(sig) + ")";
    const std::string tail = last_error_line(captured);
    if (!tail.empty()) r.error += ": " + tail;
    remove_temp_files_of(job.output, pid);
  }
  return r;
}

void print_result(bool as_json, const PreparedJob& job, const JobResult& r) {
  if (as_json) {
    print_json({{"name", job.spec.name},
                {"output", job.output},
                {"status", r.ok ? "ok" : "failed"},
                {"exit_code", r.exit_code},
                {"error", r.ok ? Json(nullptr) : Json(r.error)},
                {"seconds", r.seconds}});
    return;
  }
  if (r.ok) {
    std::printf("ok      %s -> %s (%.2f s)\n", job.spec.name.c_str(), job.output.c_str(),
                r.seconds);
  } else {
    std::printf("FAILED  %s -> %s (%.2f s): exit %d: %s\n", job.spec.name.c_str(),
                job.output.c_str(), r.seconds, r.exit_code, r.error.c_str());
  }
  std::fflush(stdout);
}

// The batch's exit code: 0 when all passed, else the code of the first failed job in file
// order (a job that died from a signal counts as an internal error, 70).
int batch_exit_code(const std::vector<JobResult>& results) {
  for (const auto& r : results) {
    if (r.ok) continue;
    return r.exit_code > 0 && r.exit_code < 128 ? r.exit_code : exit_code(ErrorCategory::Internal);
  }
  return 0;
}

int run_batch(const GlobalOptions& global, const BatchParams& p) {
  const auto start = std::chrono::steady_clock::now();
  const bool as_json = global.json || p.json;
  const std::vector<JobSpec> specs = parse_job_list(read_job_file(p.file), p.file);

  // Everything checked before anything runs; every bad job gets its line, the first one's
  // category is the exit code.
  std::vector<PreparedJob> jobs;
  std::vector<std::pair<std::string, Error>> errors;  // job name, error
  for (const auto& spec : specs) {
    try {
      jobs.push_back(prepare_job(spec));
    } catch (const Error& e) {
      errors.emplace_back(spec.name, e);
    }
  }
  std::map<fs::path, size_t> outputs;
  for (size_t i = 0; i < jobs.size(); ++i) {
    std::error_code ec;
    const fs::path key = fs::weakly_canonical(fs::absolute(jobs[i].output), ec).lexically_normal();
    const auto [it, fresh] = outputs.emplace(key, i);
    if (!fresh) {
      const PreparedJob& other = jobs[it->second];
      errors.emplace_back(
          jobs[i].spec.name,
          Error(ErrorCategory::Usage, job_where(p.file, jobs[i].spec.line) + ": job '" +
                                          jobs[i].spec.name + "' writes '" + jobs[i].output +
                                          "', as job '" + other.spec.name +
                                          "' does; give each job its own output"));
    }
  }
  if (!errors.empty()) {
    for (const auto& [name, e] : errors) {
      std::fprintf(stderr, "qforge: error: %s\n", e.what());
      if (as_json) {
        print_json({{"name", name},
                    {"status", "invalid"},
                    {"exit_code", exit_code(e.category())},
                    {"error", e.what()}});
      }
    }
    std::fprintf(stderr, "qforge: error: %zu of %zu jobs are invalid; nothing was run\n",
                 errors.size(), specs.size());
    return exit_code(errors.front().second.category());
  }

  const std::string exe = fs::read_symlink("/proc/self/exe").string();
  const size_t workers = std::min<size_t>(static_cast<size_t>(std::max(p.jobs, 1)), jobs.size());
  std::vector<JobResult> results(jobs.size());
  std::atomic<size_t> next{0};
  std::mutex print_mutex;
  const auto worker = [&] {
    for (size_t i = next++; i < jobs.size(); i = next++) {
      results[i] = run_child(exe, jobs[i], global.verbose);
      const std::lock_guard<std::mutex> lock(print_mutex);
      print_result(as_json, jobs[i], results[i]);
    }
  };
  std::vector<std::thread> threads;
  for (size_t w = 0; w < workers; ++w) threads.emplace_back(worker);
  for (auto& t : threads) t.join();

  const size_t passed = static_cast<size_t>(
      std::count_if(results.begin(), results.end(), [](const JobResult& r) { return r.ok; }));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!as_json && !global.quiet) {
    std::fprintf(stderr, "batch: %zu of %zu jobs passed in %.2f s (-j %zu)\n", passed, jobs.size(),
                 seconds, workers);
  }
  return batch_exit_code(results);
}

}  // namespace

void register_batch(CLI::App& app, const GlobalOptions& global, RunFn& run) {
  auto p = std::make_shared<BatchParams>();
  auto* cmd = app.add_subcommand("batch", "Run many conversions from a job file (YAML or JSON)");
  cmd->add_option("JOBS", p->file,
                  "A list of jobs, or {defaults: ..., jobs: [...]}; each job is what "
                  "`convert --config` reads, plus an optional name")
      ->required();
  cmd->add_option("-j,--jobs", p->jobs, "Conversions run at once")->check(CLI::Range(1, 256));
  cmd->add_flag("--json", p->json, "One JSON object per job on stdout");
  cmd->footer(
      "Each job runs as a child `qforge convert`; one failing does not stop the others.\n"
      "Exit code: 0 when every job passed, else the exit code of the first failed job in file "
      "order (70 for a job that crashed). Nothing runs when a job is invalid or two jobs write "
      "the same output.\nExample: qforge batch jobs.yaml -j 4 --json");
  cmd->callback([&global, &run, p] { run = [&global, p] { return run_batch(global, *p); }; });
}

}  // namespace qforge::cli
