#include "exporters/atomic_folder.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string_view>

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
  sync_dir(temp_);
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
