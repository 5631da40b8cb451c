// Sha256 against FIPS 180-2 test vectors, in one piece and streamed in uneven pieces.
#include <gtest/gtest.h>

#include <string>

#include "ir/sha256.h"
#include "tests/unit/importers/dataset/dataset_test_util.h"

using namespace qforge;

TEST(Sha256, MatchesFipsVectors) {
  EXPECT_EQ(sha256_hex({}), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex(test::as_bytes("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const std::string million(1000000, 'a');
  Sha256 h;
  const auto bytes = test::as_bytes(million);
  for (size_t at = 0, step = 1; at < bytes.size(); at += step, step = step * 3 % 4099 + 1) {
    h.update(std::span<const std::byte>(bytes).subspan(at, std::min(step, bytes.size() - at)));
  }
  EXPECT_EQ(h.hex_digest(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // The hasher starts over after a digest.
  h.update(test::as_bytes("abc"));
  EXPECT_EQ(h.hex_digest(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}
