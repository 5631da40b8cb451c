#include "importers/dataset/inflate_stream.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <limits>

#include "ir/error.h"

namespace qforge {

struct InflateStream::State {
  z_stream z{};
  bool open = false;
  ~State() {
    if (open) inflateEnd(&z);
  }
};

InflateStream::InflateStream(std::span<const std::byte> compressed, uint64_t size, uint32_t crc32,
                             std::string source)
    : state_(std::make_unique<State>()),
      compressed_(compressed),
      size_(size),
      expected_crc_(crc32),
      source_(std::move(source)) {
  restart();
}

InflateStream::~InflateStream() = default;

void InflateStream::restart() {
  if (state_->open) {
    inflateEnd(&state_->z);
    state_->open = false;
  }
  state_->z = z_stream{};
  if (inflateInit2(&state_->z, -MAX_WBITS) != Z_OK) {  // raw deflate, as zip stores it
    fail_internal("inflateInit2 failed for " + source_);
  }
  state_->open = true;
  position_ = 0;
  crc_ = static_cast<uint32_t>(::crc32(0L, Z_NULL, 0));
  state_->z.next_in = reinterpret_cast<Bytef*>(const_cast<std::byte*>(compressed_.data()));
  refill();
}

// zlib counts input in uInt: the entry is fed in pieces of at most 1 GiB.
void InflateStream::refill() {
  z_stream& z = state_->z;
  if (z.avail_in != 0) return;
  const auto consumed =
      static_cast<size_t>(reinterpret_cast<const std::byte*>(z.next_in) - compressed_.data());
  z.avail_in = static_cast<uInt>(std::min<size_t>(compressed_.size() - consumed, size_t{1} << 30));
}

void InflateStream::read(std::span<std::byte> out) {
  if (out.size() > size_ - position_) {
    fail_invalid(source_ + ": a read of " + std::to_string(out.size()) + " bytes at byte " +
                 std::to_string(position_) + " runs past the entry's " + std::to_string(size_) +
                 " bytes");
  }
  z_stream& z = state_->z;
  size_t done = 0;
  while (done < out.size()) {
    const size_t want = std::min<size_t>(out.size() - done, std::numeric_limits<uInt>::max());
    z.next_out = reinterpret_cast<Bytef*>(out.data() + done);
    z.avail_out = static_cast<uInt>(want);
    refill();
    const int rc = inflate(&z, Z_NO_FLUSH);
    const size_t produced = want - z.avail_out;
    crc_ = static_cast<uint32_t>(::crc32(crc_, reinterpret_cast<const Bytef*>(out.data() + done),
                                         static_cast<uInt>(produced)));
    done += produced;
    position_ += produced;
    if (rc == Z_STREAM_END && done < out.size()) {
      fail_invalid(source_ + " ends after " + std::to_string(position_) + " of its " +
                   std::to_string(size_) + " bytes; the archive is corrupt");
    }
    if (rc != Z_OK && rc != Z_STREAM_END && !(rc == Z_BUF_ERROR && produced > 0)) {
      fail_invalid(source_ + " does not inflate at byte " + std::to_string(position_) + " (" +
                   (z.msg != nullptr ? z.msg : "zlib error " + std::to_string(rc)) +
                   "); the archive is corrupt");
    }
  }
  if (position_ == size_) check_end();
}

void InflateStream::skip(uint64_t count) {
  std::array<std::byte, 65536> scratch{};
  while (count > 0) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(count, scratch.size()));
    read(std::span<std::byte>(scratch.data(), n));
    count -= n;
  }
}

// At the declared size the stream must end, with the CRC-32 the directory gives.
void InflateStream::check_end() {
  z_stream& z = state_->z;
  refill();
  std::byte extra{};
  z.next_out = reinterpret_cast<Bytef*>(&extra);
  z.avail_out = 1;
  const int rc = inflate(&z, Z_FINISH);
  if (rc != Z_STREAM_END || z.avail_out != 1) {
    fail_invalid(source_ + " inflates to more than the " + std::to_string(size_) +
                 " bytes its zip directory declares; the archive is corrupt");
  }
  if (crc_ != expected_crc_) {
    fail_invalid(source_ + " fails its CRC-32 check; the archive is corrupt");
  }
}

}  // namespace qforge
