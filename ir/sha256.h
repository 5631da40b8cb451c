#pragma once
// Incremental SHA-256 (OpenSSL's libcrypto): data set digests, bundle file digests.
#include <cstddef>
#include <filesystem>
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

// SHA-256 of a file's bytes as lowercase hex, read in chunks. Throws Error(IO) naming `what`
// when the file cannot be opened or read.
std::string sha256_file_hex(const std::filesystem::path& path, const std::string& what);

}  // namespace qforge
