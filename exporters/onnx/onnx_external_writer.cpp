#include "exporters/onnx/onnx_external_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <string>

#include "exporters/write_pieces.h"
#include "ir/error.h"

namespace qforge {

OnnxExternalWriter::OnnxExternalWriter(const std::filesystem::path& data_path) : file_(data_path) {
  fd_ = ::open(file_.temp_path().c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    fail_io("cannot create '" + file_.temp_path().string() + "': " + std::strerror(errno));
  }
  writeback_.emplace(fd_);
}

OnnxExternalWriter::~OnnxExternalWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void OnnxExternalWriter::write_all(std::span<const std::byte> bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd_, bytes.data(), std::min(bytes.size(), kWritePiece));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      fail_io("cannot write external data to '" + file_.temp_path().string() +
              "': " + std::strerror(n < 0 ? errno : EIO) + "; check free disk space");
    }
    bytes = bytes.subspan(static_cast<size_t>(n));
    size_ += static_cast<uint64_t>(n);
    writeback_->wrote(static_cast<size_t>(n));
  }
}

uint64_t OnnxExternalWriter::append(std::span<const std::byte> bytes) {
  static constexpr std::array<std::byte, kAlignment> kZeros{};
  const uint64_t pad = (kAlignment - size_ % kAlignment) % kAlignment;
  write_all(std::span(kZeros).first(static_cast<size_t>(pad)));
  const uint64_t offset = size_;
  write_all(bytes);
  return offset;
}

void OnnxExternalWriter::close() {
  if (fd_ < 0) return;
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    fail_io("cannot finish writing '" + file_.temp_path().string() + "': " + std::strerror(errno));
  }
}

void OnnxExternalWriter::commit() {
  close();
  file_.commit();
}

}  // namespace qforge
