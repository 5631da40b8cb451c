#include "exporters/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>
#include <system_error>

#include "ir/error.h"

namespace qforge {

namespace {

std::atomic<unsigned> g_temp_counter{0};

// fsync of a path: the file's data before the rename, the folder's entry after it.
// Returns 0 or the errno of the failure.
int sync_path(const std::filesystem::path& path, int flags) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) return errno;
  const int err = ::fsync(fd) == 0 ? 0 : errno;
  ::close(fd);
  return err;
}

}  // namespace

AtomicFile::AtomicFile(std::filesystem::path target) : target_(std::move(target)) {
  if (target_.filename().empty()) {
    fail_io("output path '" + target_.string() + "' names a folder, not a file");
  }
  std::filesystem::path parent = target_.parent_path();
  if (parent.empty()) parent = ".";
  std::error_code ec;
  if (!std::filesystem::is_directory(parent, ec)) {
    fail_io("output folder '" + parent.string() + "' does not exist: create it first");
  }
  temp_ = target_.parent_path() /
          (std::string(".") + target_.filename().string() + ".tmp-" + std::to_string(::getpid()) + "-" +
           std::to_string(g_temp_counter.fetch_add(1)));
}

AtomicFile::~AtomicFile() {
  if (!committed_) {
    std::error_code ec;
    std::filesystem::remove(temp_, ec);  // may not exist if nothing was written
  }
}

void AtomicFile::commit() {
  if (committed_) fail_internal("AtomicFile::commit called twice for '" + target_.string() + "'");
  std::error_code ec;
  if (!std::filesystem::is_regular_file(temp_, ec)) {
    fail_internal("nothing was written to the temporary file for '" + target_.string() + "'");
  }
  if (const int err = sync_path(temp_, O_RDONLY); err != 0) {
    fail_io("cannot flush '" + temp_.string() + "' to disk: " + std::strerror(err));
  }
  if (::rename(temp_.c_str(), target_.c_str()) != 0) {
    fail_io("cannot rename '" + temp_.string() + "' to '" + target_.string() +
            "': " + std::strerror(errno));
  }
  committed_ = true;
  // Make the rename itself durable; failing here leaves a complete file, so it is not an error.
  const std::filesystem::path parent = target_.parent_path().empty() ? "." : target_.parent_path();
  sync_path(parent, O_RDONLY | O_DIRECTORY);
}

WritebackPacer::WritebackPacer(const std::filesystem::path& path)
    : fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)), owned_(true) {}

WritebackPacer::~WritebackPacer() {
  if (owned_ && fd_ >= 0) ::close(fd_);
}

void WritebackPacer::wrote(size_t bytes) {
  if (fd_ < 0) return;
  pending_ += bytes;
  if (pending_ < kStep) return;
  pending_ = 0;
  // The whole file's dirty pages not yet under writeback; a failure only loses the head start.
  (void)::sync_file_range(fd_, 0, 0, SYNC_FILE_RANGE_WRITE);
}

}  // namespace qforge
