#include "ir/error.h"

namespace qforge {

int exit_code(ErrorCategory category) {
  switch (category) {
    case ErrorCategory::Usage: return 2;
    case ErrorCategory::InvalidInput: return 3;
    case ErrorCategory::Unsupported: return 4;
    case ErrorCategory::IO: return 5;
    case ErrorCategory::GateFailed: return 6;
    case ErrorCategory::Internal: return 70;
  }
  return 70;
}

std::string_view category_name(ErrorCategory category) {
  switch (category) {
    case ErrorCategory::Usage: return "usage";
    case ErrorCategory::InvalidInput: return "invalid input";
    case ErrorCategory::Unsupported: return "unsupported";
    case ErrorCategory::IO: return "i/o";
    case ErrorCategory::GateFailed: return "gate failed";
    case ErrorCategory::Internal: return "internal";
  }
  return "internal";
}

}  // namespace qforge
