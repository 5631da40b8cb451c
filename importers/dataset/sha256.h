#pragma once
// Incremental SHA-256 (OpenSSL's libcrypto) for data set digests.
#include <cstddef>
#include <memory>
#include <span>
#include <string>

namespace qforge {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void update(std::span<const std::byte> bytes);
  // Lowercase hex of the digest of everything updated so far; the hasher starts over after.
  std::string hex_digest();

 private:
  struct Context;
  std::unique_ptr<Context> ctx_;
};

// SHA-256 of `bytes` as lowercase hex.
std::string sha256_hex(std::span<const std::byte> bytes);

}  // namespace qforge
