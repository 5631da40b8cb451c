#include "exporters/atomic_folder.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string_view>
#include <vector>

#include <spdlog/spdlog.h>

#include "ir/error.h"

namespace qforge {

namespace fs = std::filesystem;

namespace {

void sync_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

// Every regular file under `dir` on the disk, and every folder's entries: a batch of files has
// its writeback started first (sync_file_range, a hint, so that the disk takes them together),
// then each is waited for (fsync). A file that cannot be flushed fails the commit: after a crash
// the renamed folder could hold it short. In batches, so that a folder of many shards never holds
// more than a batch's descriptors open.
void sync_tree(const fs::path& dir) {
  constexpr size_t kBatch = 64;
  std::vector<fs::path> files;
  std::vector<fs::path> dirs = {dir};
  for (const fs::directory_entry& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_symlink()) continue;
    if (entry.is_regular_file()) files.push_back(entry.path());
    if (entry.is_directory()) dirs.push_back(entry.path());
  }
  for (size_t first = 0; first < files.size(); first += kBatch) {
    std::vector<int> fds;
    const size_t last = std::min(files.size(), first + kBatch);
    const auto close_all = [&] {
      for (const int fd : fds) ::close(fd);
    };
    for (size_t i = first; i < last; ++i) {
      const int fd = ::open(files[i].c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) {
        const std::string why = std::strerror(errno);
        close_all();
        fail_io("cannot open '" + files[i].string() + "' to flush it to disk: " + why);
      }
      fds.push_back(fd);
      ::sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE);
    }
    for (size_t i = first; i < last; ++i) {
      if (::fsync(fds[i - first]) != 0) {
        const std::string why = std::strerror(errno);
        close_all();
        fail_io("cannot flush '" + files[i].string() + "' to disk: " + why);
      }
    }
    close_all();
  }
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) sync_dir(*it);
}

fs::path parent_of(const fs::path& p) {
  return p.parent_path().empty() ? fs::path(".") : p.parent_path();
}

// ".NAME<tag><pid>" beside `target`; appended piece by piece (GCC 12 warns, wrongly, about
// overlapping copies in a chain of operator+ here).
fs::path beside(const fs::path& target, std::string_view tag) {
  std::string name = ".";
  name += target.filename().string();
  name += tag;
  name += std::to_string(::getpid());
  return parent_of(target) / name;
}

}  // namespace

AtomicFolder::AtomicFolder(fs::path target, bool replace, std::string what)
    : target_(std::move(target)), replace_(replace), what_(std::move(what)) {
  temp_ = beside(target_, ".tmp-");
  std::error_code ec;
  fs::remove_all(temp_, ec);
  if (!fs::create_directory(temp_, ec) || ec) {
    fail_io("cannot create the temporary folder '" + temp_.string() +
            "': " + (ec ? ec.message() : std::string("it already exists")));
  }
}

AtomicFolder::~AtomicFolder() {
  if (committed_) return;
  std::error_code ec;
  fs::remove_all(temp_, ec);
}

void AtomicFolder::commit() {
  sync_tree(temp_);
  const fs::path parent = parent_of(target_);
  fs::path old;
  if (replace_) {
    old = beside(target_, ".old-");
    std::error_code ec;
    fs::remove_all(old, ec);
    if (::rename(target_.c_str(), old.c_str()) != 0) {
      fail_io("cannot move the existing " + what_ + " '" + target_.string() +
              "' aside to replace it: " + std::strerror(errno));
    }
  }
  if (::rename(temp_.c_str(), target_.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    if (replace_) ::rename(old.c_str(), target_.c_str());  // put the old one back
    fail_io("cannot rename '" + temp_.string() + "' to '" + target_.string() + "': " + why);
  }
  committed_ = true;
  sync_dir(parent);
  if (replace_) {
    std::error_code ec;
    fs::remove_all(old, ec);
    if (ec) {
      spdlog::warn("the replaced {} was left at '{}': {}; remove it by hand", what_, old.string(),
                   ec.message());
    }
  }
}

}  // namespace qforge
