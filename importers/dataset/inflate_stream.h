#pragma once
// Reads a raw-deflate stream (a compressed zip entry, as np.savez_compressed writes) front to
// back in pieces, so that an array is never inflated whole. Checks the CRC-32 and the size
// against the zip directory when the end is reached.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace qforge {

class InflateStream {
 public:
  // `compressed` must outlive the stream; `size` and `crc32` come from the zip directory;
  // `source` names the entry in messages.
  InflateStream(std::span<const std::byte> compressed, uint64_t size, uint32_t crc32,
                std::string source);
  ~InflateStream();
  InflateStream(const InflateStream&) = delete;
  InflateStream& operator=(const InflateStream&) = delete;

  [[nodiscard]] uint64_t position() const { return position_; }
  [[nodiscard]] uint64_t size() const { return size_; }
  // The next out.size() bytes. Throws Error(InvalidInput) when the stream is corrupt, ends
  // early, runs past `size`, or fails its CRC-32.
  void read(std::span<std::byte> out);
  void skip(uint64_t count);
  void restart();

 private:
  void refill();
  void check_end();

  struct State;
  std::unique_ptr<State> state_;
  std::span<const std::byte> compressed_;
  uint64_t size_ = 0;
  uint32_t expected_crc_ = 0;
  uint32_t crc_ = 0;
  uint64_t position_ = 0;
  std::string source_;
};

}  // namespace qforge
