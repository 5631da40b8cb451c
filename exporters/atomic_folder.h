#pragma once
// A folder written whole or not at all (engine bundles, model folders): files go into
// `.NAME.tmp-<pid>` beside the target; commit() flushes every file and folder in it to the disk
// and renames it into place.
// Replacing an existing folder moves it aside first, puts it back if the rename fails, and
// removes it after. Destroyed before commit(), the temporary folder is removed: a failed write
// leaves nothing behind.
#include <filesystem>
#include <string>

namespace qforge {

class AtomicFolder {
 public:
  // Creates the temporary folder beside `target`. `what` names the folder in messages
  // ("bundle", "folder"). Throws Error(IO) when it cannot be created.
  AtomicFolder(std::filesystem::path target, bool replace, std::string what);
  ~AtomicFolder();
  AtomicFolder(const AtomicFolder&) = delete;
  AtomicFolder& operator=(const AtomicFolder&) = delete;

  const std::filesystem::path& temp_path() const { return temp_; }
  void commit();  // fsync + rename into place; throws Error(IO)

 private:
  std::filesystem::path target_;
  std::filesystem::path temp_;
  bool replace_;
  std::string what_;
  bool committed_ = false;
};

}  // namespace qforge
