#include "ir/sha256.h"

#include <openssl/evp.h>

#include <fstream>
#include <vector>

#include "ir/error.h"

namespace qforge {

struct Sha256::Context {
  EVP_MD_CTX* md = nullptr;
  ~Context() { EVP_MD_CTX_free(md); }
};

namespace {

void start(EVP_MD_CTX* md) {
  if (EVP_DigestInit_ex(md, EVP_sha256(), nullptr) != 1) {
    fail_internal("SHA-256: EVP_DigestInit_ex failed");
  }
}

}  // namespace

Sha256::Sha256() : ctx_(std::make_unique<Context>()) {
  ctx_->md = EVP_MD_CTX_new();
  if (ctx_->md == nullptr) fail_internal("SHA-256: EVP_MD_CTX_new failed");
  start(ctx_->md);
}

Sha256::~Sha256() = default;

void Sha256::update(std::span<const std::byte> bytes) {
  if (bytes.empty()) return;
  if (EVP_DigestUpdate(ctx_->md, bytes.data(), bytes.size()) != 1) {
    fail_internal("SHA-256: EVP_DigestUpdate failed");
  }
}

std::string Sha256::hex_digest() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_DigestFinal_ex(ctx_->md, digest, &len) != 1) {
    fail_internal("SHA-256: EVP_DigestFinal_ex failed");
  }
  start(ctx_->md);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * static_cast<size_t>(len));
  for (unsigned int i = 0; i < len; ++i) {
    out += kHex[digest[i] >> 4];
    out += kHex[digest[i] & 15];
  }
  return out;
}

std::string sha256_hex(std::span<const std::byte> bytes) {
  Sha256 h;
  h.update(bytes);
  return h.hex_digest();
}

std::string sha256_file_hex(const std::filesystem::path& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail_io("cannot open " + what + " to hash it");
  Sha256 hasher;
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const auto got = in.gcount();
    if (got > 0) hasher.update(std::as_bytes(std::span(buf.data(), static_cast<size_t>(got))));
  }
  if (in.bad()) fail_io("cannot read " + what + " to hash it");
  return hasher.hex_digest();
}

}  // namespace qforge
