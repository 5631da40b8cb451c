#include "cli/job/job_config.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <yaml-cpp/yaml.h>
#include <nlohmann/json.hpp>

#include "importers/lora/lora_adapter.h"
#include "ir/error.h"

namespace qforge::cli {

namespace fs = std::filesystem;

namespace {

constexpr size_t kMaxJobFileBytes = 16u << 20;  // a job file is a few lines; refuse a stray blob
constexpr size_t kMaxJobs = 100000;

bool is_json_file(const std::string& file) {
  std::string ext = fs::path(file).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return ext == ".json";
}

[[noreturn]] void fail_at(const std::string& file, int line, const std::string& what) {
  fail_usage(job_where(file, line) + ": " + what);
}

// --- YAML ---------------------------------------------------------------------------------

int yaml_line(const YAML::Node& node) {
  const YAML::Mark mark = node.Mark();
  return mark.is_null() ? 0 : mark.line + 1;
}

// Only a plain (unquoted) true/false is a boolean; "yes", "on" stay strings.
bool yaml_is_bool(const YAML::Node& node, std::string& text) {
  if (node.Tag() != "?") return false;  // quoted or tagged: a string
  const std::string& s = node.Scalar();
  if (s == "true" || s == "True" || s == "TRUE") {
    text = "true";
    return true;
  }
  if (s == "false" || s == "False" || s == "FALSE") {
    text = "false";
    return true;
  }
  return false;
}

JobValue yaml_value(const YAML::Node& node, const std::string& file, const std::string& key) {
  JobValue v;
  if (node.IsScalar()) {
    std::string text;
    if (yaml_is_bool(node, text)) {
      v.kind = JobValue::Kind::Bool;
      v.items.push_back(text);
    } else {
      v.items.push_back(node.Scalar());
    }
    return v;
  }
  if (node.IsSequence()) {
    v.kind = JobValue::Kind::List;
    for (const auto& item : node) {
      if (!item.IsScalar()) {
        fail_at(file, yaml_line(item),
                "'" + key + "' lists a " + (item.IsMap() ? "mapping" : "list or null") +
                    "; give strings or numbers");
      }
      v.items.push_back(item.Scalar());
    }
    return v;
  }
  fail_at(file, yaml_line(node),
          "'" + key + "' has " + (node.IsMap() ? "a mapping" : "no value") +
              "; give a string, a number, true/false or a list");
}

std::vector<JobEntry> yaml_entries(const YAML::Node& map, const std::string& file) {
  std::vector<JobEntry> out;
  for (const auto& kv : map) {
    if (!kv.first.IsScalar()) fail_at(file, yaml_line(kv.first), "a key must be a plain name");
    const std::string key = kv.first.Scalar();
    out.push_back({key, yaml_value(kv.second, file, key), yaml_line(kv.first)});
  }
  return out;
}

YAML::Node yaml_load(std::string_view text, const std::string& file) {
  try {
    return YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    fail_at(file, e.mark.is_null() ? 0 : e.mark.line + 1, "not valid YAML: " + e.msg);
  }
}

// --- JSON ---------------------------------------------------------------------------------

JobValue json_value(const nlohmann::ordered_json& j, const std::string& file,
                    const std::string& key) {
  JobValue v;
  const auto scalar = [&](const nlohmann::ordered_json& x, std::string& out) {
    if (x.is_string()) {
      out = x.get<std::string>();
    } else if (x.is_number()) {
      out = x.dump();
    } else {
      return false;
    }
    return true;
  };
  std::string text;
  if (j.is_boolean()) {
    v.kind = JobValue::Kind::Bool;
    v.items.push_back(j.get<bool>() ? "true" : "false");
  } else if (scalar(j, text)) {
    v.items.push_back(text);
  } else if (j.is_array()) {
    v.kind = JobValue::Kind::List;
    for (const auto& item : j) {
      if (!scalar(item, text)) {
        fail_at(
            file, 0,
            "'" + key + "' lists " + std::string(item.type_name()) + "; give strings or numbers");
      }
      v.items.push_back(text);
    }
  } else {
    fail_at(file, 0,
            "'" + key + "' is " + std::string(j.type_name()) +
                "; give a string, a number, true/false or a list");
  }
  return v;
}

std::vector<JobEntry> json_entries(const nlohmann::ordered_json& obj, const std::string& file) {
  std::vector<JobEntry> out;
  for (const auto& [key, value] : obj.items())
    out.push_back({key, json_value(value, file, key), 0});
  return out;
}

nlohmann::ordered_json json_load(std::string_view text, const std::string& file) {
  try {
    return nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail_at(file, 0, std::string("not valid JSON: ") + e.what());
  }
}

// Keys compare with '_' read as '-' (block_size is block-size).
std::string canonical_key(std::string key) {
  std::replace(key.begin(), key.end(), '_', '-');
  return key;
}

// The job's own entries override the defaults' with the same key.
JobSpec merge_job(const std::vector<JobEntry>& defaults, std::vector<JobEntry> own,
                  const std::string& file, int line, size_t index) {
  JobSpec job;
  job.file = file;
  job.line = line;
  job.name = "job-" + std::to_string(index + 1);
  for (auto it = own.begin(); it != own.end();) {
    if (canonical_key(it->key) != "name") {
      ++it;
      continue;
    }
    if (it->value.kind == JobValue::Kind::List) fail_at(file, it->line, "'name' must be a string");
    job.name = it->value.items.front();
    it = own.erase(it);
  }
  for (const auto& d : defaults) {
    const bool overridden = std::any_of(own.begin(), own.end(), [&](const JobEntry& e) {
      return canonical_key(e.key) == canonical_key(d.key);
    });
    if (!overridden) job.entries.push_back(d);
  }
  for (auto& e : own) job.entries.push_back(std::move(e));
  return job;
}

std::string key_list(const std::vector<std::string>& keys) {
  std::string s;
  for (const auto& k : keys) s += (s.empty() ? "" : ", ") + k;
  return s;
}

std::string resolve_path(const std::string& value, const fs::path& base) {
  const fs::path p(value);
  if (value.empty() || p.is_absolute() || base.empty()) return value;
  return (base / p).lexically_normal().string();
}

std::string resolve_adapter_spec(const std::string& value, const fs::path& base) {
  const AdapterSpec spec = parse_adapter_spec(value);
  const std::string path = spec.path.string();
  return resolve_path(path, base) + value.substr(path.size());  // keeps ":WEIGHT"
}

}  // namespace

std::string job_where(const std::string& file, int line) {
  return line > 0 ? file + " line " + std::to_string(line) : file;
}

std::string read_job_file(const std::string& file) {
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) {
    fail_io("job file '" + file + "' does not exist or is not a file");
  }
  if (fs::file_size(file, ec) > kMaxJobFileBytes) {
    fail_usage("job file '" + file + "' is larger than 16 MiB; is it really a job file?");
  }
  std::ifstream in(file, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in.good() && !in.eof()) fail_io("cannot read job file '" + file + "'");
  return text.str();
}

JobSpec parse_job_config(std::string_view text, const std::string& file) {
  JobSpec job;
  job.file = file;
  if (is_json_file(file)) {
    const auto j = json_load(text, file);
    if (!j.is_object()) fail_at(file, 0, "expected one object of convert options");
    job.entries = json_entries(j, file);
  } else {
    const YAML::Node root = yaml_load(text, file);
    if (!root.IsMap()) {
      fail_at(file, yaml_line(root), "expected a mapping of convert options (key: value lines)");
    }
    job.entries = yaml_entries(root, file);
  }
  return job;
}

std::vector<JobSpec> parse_job_list(std::string_view text, const std::string& file) {
  std::vector<JobEntry> defaults;
  std::vector<std::pair<std::vector<JobEntry>, int>> jobs;  // entries, line
  const char* shape = "expected a list of jobs, or a mapping with 'jobs:' (and 'defaults:')";
  if (is_json_file(file)) {
    const auto j = json_load(text, file);
    const nlohmann::ordered_json* list = &j;
    if (j.is_object()) {
      for (const auto& [key, value] : j.items()) {
        if (key != "jobs" && key != "defaults") {
          fail_at(file, 0, "unknown top-level key '" + key + "' (valid: defaults, jobs)");
        }
      }
      if (!j.contains("jobs")) fail_at(file, 0, shape);
      list = &j["jobs"];
      if (j.contains("defaults")) {
        if (!j["defaults"].is_object()) fail_at(file, 0, "'defaults' must be an object");
        defaults = json_entries(j["defaults"], file);
      }
    }
    if (!list->is_array()) fail_at(file, 0, shape);
    for (const auto& item : *list) {
      if (!item.is_object())
        fail_at(file, 0, "job " + std::to_string(jobs.size() + 1) + " is not an object");
      jobs.emplace_back(json_entries(item, file), 0);
    }
  } else {
    const YAML::Node root = yaml_load(text, file);
    YAML::Node list = root;
    if (root.IsMap()) {
      for (const auto& kv : root) {
        const std::string key = kv.first.IsScalar() ? kv.first.Scalar() : "?";
        if (key != "jobs" && key != "defaults") {
          fail_at(file, yaml_line(kv.first),
                  "unknown top-level key '" + key + "' (valid: defaults, jobs)");
        }
      }
      if (!root["jobs"]) fail_at(file, yaml_line(root), shape);
      list.reset(root["jobs"]);  // `list = ...` would overwrite root's content (yaml-cpp)
      if (const YAML::Node d = root["defaults"]) {
        if (!d.IsMap()) fail_at(file, yaml_line(d), "'defaults' must be a mapping");
        defaults = yaml_entries(d, file);
      }
    }
    if (!list.IsSequence()) fail_at(file, yaml_line(list), shape);
    for (const auto& item : list) {
      if (!item.IsMap()) {
        fail_at(file, yaml_line(item),
                "job " + std::to_string(jobs.size() + 1) + " is not a mapping of options");
      }
      jobs.emplace_back(yaml_entries(item, file), yaml_line(item));
      if (jobs.size() > kMaxJobs) fail_at(file, yaml_line(item), "more than 100000 jobs");
    }
  }
  if (jobs.empty()) fail_at(file, 0, "holds no jobs");
  std::vector<JobSpec> out;
  for (size_t i = 0; i < jobs.size(); ++i) {
    out.push_back(merge_job(defaults, std::move(jobs[i].first), file, jobs[i].second, i));
  }
  return out;
}

// --- binding ------------------------------------------------------------------------------

namespace {

std::string option_key(const CLI::Option& opt) {
  if (!opt.get_lnames().empty()) return opt.get_lnames().front();
  if (!opt.nonpositional()) {
    std::string name = opt.get_name();
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return std::tolower(c); });
    return name == "in" ? "input" : name;
  }
  return {};  // short-only option: not a job key
}

bool is_job_option(const CLI::Option& opt) {
  const std::string key = option_key(opt);
  return !key.empty() && key != "config" && key != "help" && key != "help-all";
}

}  // namespace

const std::vector<std::string>& job_path_keys() {
  static const std::vector<std::string> keys = {"input",     "output", "lora",         "weights",
                                                "reference", "calib",  "import-calib", "report"};
  return keys;
}

std::vector<std::string> job_keys(CLI::App& cmd) {
  std::vector<std::string> keys;
  for (const CLI::Option* opt : cmd.get_options()) {
    if (is_job_option(*opt)) keys.push_back(option_key(*opt));
  }
  std::sort(keys.begin(), keys.end());
  return keys;
}

std::vector<BoundEntry> bind_job(CLI::App& cmd, const JobSpec& job) {
  const fs::path base = fs::path(job.file).parent_path();
  const auto& paths = job_path_keys();
  std::vector<BoundEntry> bound;
  for (const auto& e : job.entries) {
    const std::string key = canonical_key(e.key);
    CLI::Option* option = nullptr;
    for (CLI::Option* opt : cmd.get_options()) {
      if (is_job_option(*opt) && option_key(*opt) == key) option = opt;
    }
    if (!option) {
      fail_at(job.file, e.line,
              "unknown key '" + e.key + "' (valid keys: " + key_list(job_keys(cmd)) + ")");
    }
    for (const auto& b : bound) {
      if (b.key == key) fail_at(job.file, e.line, "'" + e.key + "' is given twice; give it once");
    }
    BoundEntry b;
    b.option = option;
    b.key = key;
    b.line = e.line;
    b.flag = option->get_expected_max() == 0;
    if (b.flag) {
      if (e.value.kind != JobValue::Kind::Bool) {
        fail_at(job.file, e.line, "'" + e.key + "' is a flag: give true or false");
      }
      if (e.value.items.front() == "true") b.values.push_back("true");
    } else {
      if (e.value.kind == JobValue::Kind::Bool) {
        fail_at(job.file, e.line, "'" + e.key + "' takes a value, not true/false");
      }
      const bool many = option->get_items_expected_max() > 1;
      if (e.value.kind == JobValue::Kind::List && !many) {
        fail_at(job.file, e.line, "'" + e.key + "' takes one value, not a list");
      }
      if (e.value.items.empty()) fail_at(job.file, e.line, "'" + e.key + "' lists no values");
      for (const auto& item : e.value.items) {
        if (item.empty()) {
          fail_at(job.file, e.line, "'" + e.key + "' is empty; give a value or leave the key out");
        }
      }
      b.values = e.value.items;
      if (std::find(paths.begin(), paths.end(), key) != paths.end()) {
        for (auto& v : b.values)
          v = key == "lora" ? resolve_adapter_spec(v, base) : resolve_path(v, base);
      }
    }
    bound.push_back(std::move(b));
  }
  return bound;
}

void apply_job(const std::vector<BoundEntry>& bound, const std::string& file) {
  for (const auto& b : bound) {
    if (b.option->count() > 0) continue;  // the command line wins
    if (b.values.empty()) continue;       // a flag set to false
    try {
      for (const auto& v : b.values) b.option->add_result(v);
      b.option->run_callback();
    } catch (const CLI::Error& e) {
      fail_at(file, b.line, "'" + b.key + "': " + e.what());
    }
  }
}

std::vector<std::string> job_arguments(const std::vector<BoundEntry>& bound) {
  std::vector<std::string> args;
  for (const auto& b : bound) {
    if (b.option->nonpositional()) continue;
    // CLI11 2.1 has no reliable "--" inside a subcommand: a path that starts with '-' is
    // given as ./-name, the same file.
    for (const auto& v : b.values) args.push_back(v.rfind('-', 0) == 0 ? "./" + v : v);
  }
  for (const auto& b : bound) {
    if (!b.option->nonpositional()) continue;
    for (const auto& v : b.values) args.push_back(b.flag ? "--" + b.key : "--" + b.key + "=" + v);
  }
  return args;
}

}  // namespace qforge::cli
