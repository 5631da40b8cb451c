// The .npy/.npz reader: valid files built byte by byte as NumPy writes them, and corrupt or
// unsupported ones, each refused with a clear error.
#include <gtest/gtest.h>

#include <cstring>

#include "importers/dataset/npy.h"
#include "tests/unit/runtime/runtime_test_util.h"

using namespace qforge;
using namespace qforge::rt_test;

namespace {

using Bytes = std::vector<std::byte>;

void put(Bytes& b, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) b.push_back(static_cast<std::byte>((v >> (8 * i)) & 0xff));
}
void put(Bytes& b, std::string_view s) {
  for (char c : s) b.push_back(static_cast<std::byte>(c));
}
void put(Bytes& b, const void* data, size_t n) {
  const auto* p = static_cast<const std::byte*>(data);
  b.insert(b.end(), p, p + n);
}

// An .npy file as numpy writes it (format 1.0, header padded to 64 bytes with spaces + \n).
Bytes npy(std::string_view dict, const void* data, size_t nbytes) {
  Bytes b;
  put(b, "\x93NUMPY");
  b.push_back(std::byte{1});
  b.push_back(std::byte{0});
  std::string header(dict);
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  put(b, header.size(), 2);
  put(b, header);
  put(b, data, nbytes);
  return b;
}

uint32_t crc32(const Bytes& data) {
  uint32_t c = 0xffffffffu;
  for (std::byte byte : data) {
    c ^= static_cast<uint8_t>(byte);
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? 0xedb88320u ^ (c >> 1) : c >> 1;
  }
  return c ^ 0xffffffffu;
}

struct Entry {
  std::string name;
  Bytes data;
  uint16_t method = 0;
};

// A zip archive as Python's zipfile writes one for np.savez (stored entries).
Bytes zip(const std::vector<Entry>& entries) {
  Bytes b, cd;
  for (const auto& e : entries) {
    const uint64_t offset = b.size();
    const uint32_t crc = crc32(e.data);
    put(b, 0x04034b50u, 4);
    put(b, 20, 2);
    put(b, 0, 2);
    put(b, e.method, 2);
    put(b, 0, 4);  // time, date
    put(b, crc, 4);
    put(b, e.data.size(), 4);
    put(b, e.data.size(), 4);
    put(b, e.name.size(), 2);
    put(b, 0, 2);
    put(b, e.name);
    b.insert(b.end(), e.data.begin(), e.data.end());
    put(cd, 0x02014b50u, 4);
    put(cd, 20, 2);
    put(cd, 20, 2);
    put(cd, 0, 2);
    put(cd, e.method, 2);
    put(cd, 0, 4);
    put(cd, crc, 4);
    put(cd, e.data.size(), 4);
    put(cd, e.data.size(), 4);
    put(cd, e.name.size(), 2);
    put(cd, 0, 2);
    put(cd, 0, 2);
    put(cd, 0, 2);
    put(cd, 0, 2);
    put(cd, 0, 4);
    put(cd, offset, 4);
    put(cd, e.name);
  }
  const uint64_t cd_offset = b.size();
  b.insert(b.end(), cd.begin(), cd.end());
  put(b, 0x06054b50u, 4);
  put(b, 0, 4);
  put(b, entries.size(), 2);
  put(b, entries.size(), 2);
  put(b, cd.size(), 4);
  put(b, cd_offset, 4);
  put(b, 0, 2);
  return b;
}

const float kF[6] = {1, 2, 3, 4, 5, 6};
const int64_t kI[3] = {7, -8, 9};

Caught npy_error(std::string_view dict, size_t nbytes = 24) {
  const Bytes b = npy(dict, kF, nbytes);
  return catch_error([&] { parse_npy(b, "t.npy"); });
}

}  // namespace

TEST(Npy, ReadsArraysAsNumpyWritesThem) {
  Tensor t = parse_npy(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", kF, 24),
                       "a.npy");
  EXPECT_EQ(t.dtype(), DType::F32);
  EXPECT_EQ(t.shape(), (Shape{2, 3}));
  EXPECT_EQ(values<float>(t), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  t = parse_npy(npy("{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }", kI, 24), "b.npy");
  EXPECT_EQ(t.shape(), (Shape{3}));
  EXPECT_EQ(values<int64_t>(t), (std::vector<int64_t>{7, -8, 9}));
  t = parse_npy(npy("{'descr': '<i8', 'fortran_order': False, 'shape': (), }", kI, 8), "c.npy");
  EXPECT_EQ(t.shape(), (Shape{}));
  const uint8_t flags[2] = {1, 0};
  t = parse_npy(npy("{'descr': '|b1', 'fortran_order': False, 'shape': (2,), }", flags, 2),
                "d.npy");
  EXPECT_EQ(t.dtype(), DType::Bool);
  // Fortran order is harmless for 1-D arrays.
  EXPECT_NO_THROW(
      parse_npy(npy("{'descr': '<f4', 'fortran_order': True, 'shape': (6,), }", kF, 24), "e.npy"));
}

TEST(Npy, RejectsMalformedHeadersAndSizes) {
  const Bytes junk = {std::byte{'P'}, std::byte{'K'}, std::byte{3}, std::byte{4}, std::byte{0},
                      std::byte{0},   std::byte{0},   std::byte{0}, std::byte{0}, std::byte{0}};
  auto e = catch_error([&] { parse_npy(junk, "t.npy"); });
  EXPECT_EQ(e.category, ErrorCategory::InvalidInput);
  EXPECT_EQ(e.message, "'t.npy' is not a .npy file (no \\x93NUMPY magic)");
  e = npy_error("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }");
  EXPECT_EQ(e.category, ErrorCategory::InvalidInput);
  EXPECT_EQ(e.message, "'t.npy' holds 24 data bytes but its header says <f4 [2, 2]");
  EXPECT_EQ(npy_error("{'descr': '<f4', 'shape': (6,), }").category, ErrorCategory::InvalidInput);
  EXPECT_EQ(npy_error("{'descr': '<f4', 'fortran_order': False, 'shape': (6,), 'x': 1}").category,
            ErrorCategory::InvalidInput);
  EXPECT_EQ(npy_error("{'descr': '<f4', 'fortran_order': False, 'shape': (-6,), }").category,
            ErrorCategory::InvalidInput);
  EXPECT_EQ(
      npy_error("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }")
          .category,
      ErrorCategory::InvalidInput);
  // A header length pointing past the end of the file.
  Bytes b = npy("{'descr': '<f4', 'fortran_order': False, 'shape': (6,), }", kF, 24);
  b[8] = std::byte{0xff};
  b[9] = std::byte{0xff};
  EXPECT_EQ(catch_error([&] { parse_npy(b, "t.npy"); }).category, ErrorCategory::InvalidInput);
}

TEST(Npy, RefusesUnsupportedLayoutsSayingWhatToDo) {
  auto e = npy_error("{'descr': '>f4', 'fortran_order': False, 'shape': (6,), }");
  EXPECT_EQ(e.category, ErrorCategory::Unsupported);
  EXPECT_EQ(e.message, "'t.npy' holds big-endian data ('>f4'); re-save it with .astype('<f4')");
  e = npy_error("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }");
  EXPECT_EQ(e.category, ErrorCategory::Unsupported);
  EXPECT_NE(e.message.find("np.ascontiguousarray"), std::string::npos);
  EXPECT_EQ(npy_error("{'descr': '<u2', 'fortran_order': False, 'shape': (12,), }").category,
            ErrorCategory::Unsupported);
  EXPECT_EQ(npy_error("{'descr': '|O', 'fortran_order': False, 'shape': (3,), }").category,
            ErrorCategory::Unsupported);
}

TEST(Npz, ReadsStoredArchivesInOrder) {
  const Bytes archive = zip(
      {{"input.npy", npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 6), }", kF, 24)},
       {"labels.npy", npy("{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }", kI, 24)}});
  const auto arrays = parse_npz(archive, "set.npz");
  ASSERT_EQ(arrays.size(), 2u);
  EXPECT_EQ(arrays[0].first, "input");
  EXPECT_EQ(arrays[0].second.shape(), (Shape{1, 6}));
  EXPECT_EQ(arrays[1].first, "labels");
  EXPECT_EQ(values<int64_t>(arrays[1].second), (std::vector<int64_t>{7, -8, 9}));
}

TEST(Npz, RefusesCompressedCorruptAndOddArchives) {
  const Bytes a = npy("{'descr': '<f4', 'fortran_order': False, 'shape': (6,), }", kF, 24);
  auto e = catch_error([&] { parse_npz(zip({{"x.npy", a, 8}}), "c.npz"); });
  EXPECT_EQ(e.category, ErrorCategory::Unsupported);
  EXPECT_EQ(e.message,
            "'c.npz': entry 'x.npy' is compressed (method 8, e.g. np.savez_compressed); qforge "
            "reads uncompressed archives only: re-save with np.savez");
  // A flipped data byte fails the CRC.
  Bytes bad = zip({{"x.npy", a}});
  bad[30 + 5 + 70] ^= std::byte{1};
  e = catch_error([&] { parse_npz(bad, "b.npz"); });
  EXPECT_EQ(e.category, ErrorCategory::InvalidInput);
  EXPECT_NE(e.message.find("CRC-32 mismatch in entry 'x.npy'"), std::string::npos) << e.message;
  // Truncated: the end record is gone.
  Bytes cut = zip({{"x.npy", a}});
  cut.resize(cut.size() - 10);
  EXPECT_EQ(catch_error([&] { parse_npz(cut, "t.npz"); }).category, ErrorCategory::InvalidInput);
  // A central directory offset beyond the file.
  Bytes far = zip({{"x.npy", a}});
  far[far.size() - 6] = std::byte{0xff};
  far[far.size() - 5] = std::byte{0xff};
  EXPECT_EQ(catch_error([&] { parse_npz(far, "f.npz"); }).category, ErrorCategory::InvalidInput);
  EXPECT_EQ(catch_error([&] {
              parse_npz(zip({{"x.npy", a}, {"x.npy", a}}), "d.npz");
            }).message,
            "'d.npz' holds array 'x' twice");
  EXPECT_EQ(catch_error([&] {
              parse_npz(zip({{"notes.txt", a}}), "n.npz");
            }).message,
            "'n.npz' has entry 'notes.txt', which is not an .npy array");
}
