#pragma once
// Writes go to a temporary name beside the target and are renamed into place on commit(), so
// a failed or interrupted write never leaves a partial output.
#include <filesystem>

namespace qforge {

class AtomicFile {
 public:
  // Throws Error(IO) if the target's folder does not exist.
  explicit AtomicFile(std::filesystem::path target);
  ~AtomicFile();  // removes the temporary file unless committed
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  const std::filesystem::path& temp_path() const { return temp_; }
  const std::filesystem::path& target() const { return target_; }
  void commit();  // fsync + rename; throws Error(IO)

 private:
  std::filesystem::path target_;
  std::filesystem::path temp_;
  bool committed_ = false;
};

}  // namespace qforge
