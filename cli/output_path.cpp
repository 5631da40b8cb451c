#include "cli/output_path.h"

#include "ir/error.h"

namespace qforge::cli {

namespace fs = std::filesystem;

OutputPath check_output_path(const fs::path& input, const fs::path& output, bool overwrite) {
  std::error_code ec;
  const bool same = fs::exists(output, ec) ? fs::equivalent(input, output, ec)
                                           : fs::weakly_canonical(input, ec) ==
                                                 fs::weakly_canonical(output, ec);
  if (same) {
    fail_usage("output '" + output.string() +
               "' is the input file; qforge never overwrites its input, choose another -o");
  }
  const bool trailing_slash = output.filename().empty();  // "out/" names the folder out
  const fs::path named = trailing_slash ? output.parent_path() : output;
  const fs::path parent = named.has_parent_path() ? named.parent_path() : fs::path(".");
  if (!fs::is_directory(parent, ec)) {
    fail_io("output folder '" + parent.string() + "' does not exist; create it first");
  }
  if (named.extension() == ".qfb") {
    if (fs::exists(output, ec) && !overwrite) {
      fail_usage("bundle '" + output.string() +
                 "' already exists; choose another name or pass --overwrite");
    }
    return {OutputKind::Bundle};
  }
  if (trailing_slash || named.extension().empty()) {
    if (fs::exists(named, ec) && !fs::is_directory(named, ec)) {
      fail_usage("output '" + named.string() + "' is a file; a path without an extension names "
                 "a model folder");
    }
    if (fs::exists(named, ec) && !overwrite) {
      fail_usage("output folder '" + named.string() +
                 "' already exists; choose another name or pass --overwrite");
    }
    return {OutputKind::HfFolder};
  }
  if (fs::is_directory(output, ec)) {
    fail_usage("output '" + output.string() + "' is a folder; give a file name");
  }
  const std::string ext = output.extension().string();
  if (ext == ".onnx") return {OutputKind::Onnx};
  if (ext == ".safetensors") return {OutputKind::Safetensors};
  fail_usage("output '" + output.string() +
             "' has an extension qforge does not write (use .onnx, .safetensors, .qfb, or no "
             "extension for a model folder)");
}

}  // namespace qforge::cli
