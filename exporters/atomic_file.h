#pragma once
// Writes go to a temporary name beside the target and are renamed into place on commit(), so
// a failed or interrupted write never leaves a partial output.
#include <cstddef>
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

// Starts the disk's writeback of a file while it is still being written (sync_file_range, a
// hint with no effect on the bytes), 8 MiB at a time, so that commit()'s fsync waits for the
// last few MiB instead of the whole file (MiniLM's 86 MB ONNX: the fsync 35 ms -> 5 ms). A
// writer calls wrote() after each write with the bytes it wrote.
class WritebackPacer {
 public:
  explicit WritebackPacer(int fd) : fd_(fd) {}  // the writer's descriptor, borrowed
  // A read-only descriptor of its own for `path` (a writer that has none, a stream's), closed
  // with it; no pacing where it cannot be opened.
  explicit WritebackPacer(const std::filesystem::path& path);
  ~WritebackPacer();
  WritebackPacer(const WritebackPacer&) = delete;
  WritebackPacer& operator=(const WritebackPacer&) = delete;
  void wrote(size_t bytes);

 private:
  static constexpr size_t kStep = size_t{8} << 20;
  int fd_;
  bool owned_ = false;
  size_t pending_ = 0;
};

}  // namespace qforge
