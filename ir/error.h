#pragma once
// Errors carry a category (which decides the exit code) and a one-line message saying what
// went wrong, where, and what to do. They are thrown anywhere and caught once, in cli/.
#include <stdexcept>
#include <string>
#include <string_view>

namespace qforge {

enum class ErrorCategory {
  Usage,         // bad flags or arguments
  InvalidInput,  // a file or value that is malformed or inconsistent
  Unsupported,   // valid input that qforge does not handle
  IO,            // a file that cannot be opened, read, written or renamed
  GateFailed,    // an accuracy gate (compare --fail-below-*) was not met
  Internal,      // a bug in qforge
};

// Exit code for each category; documented in README.md and `qforge --help`.
int exit_code(ErrorCategory category);
std::string_view category_name(ErrorCategory category);

class Error : public std::runtime_error {
 public:
  Error(ErrorCategory category, const std::string& message)
      : std::runtime_error(message), category_(category) {}
  ErrorCategory category() const { return category_; }

 private:
  ErrorCategory category_;
};

[[noreturn]] inline void fail(ErrorCategory category, const std::string& message) {
  throw Error(category, message);
}
[[noreturn]] inline void fail_invalid(const std::string& message) {
  throw Error(ErrorCategory::InvalidInput, message);
}
[[noreturn]] inline void fail_unsupported(const std::string& message) {
  throw Error(ErrorCategory::Unsupported, message);
}
[[noreturn]] inline void fail_io(const std::string& message) {
  throw Error(ErrorCategory::IO, message);
}
[[noreturn]] inline void fail_usage(const std::string& message) {
  throw Error(ErrorCategory::Usage, message);
}
[[noreturn]] inline void fail_internal(const std::string& message) {
  throw Error(ErrorCategory::Internal, message);
}

}  // namespace qforge
