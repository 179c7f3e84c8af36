#include "format/checksum.h"

#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckptd::format {
namespace {

// Bytes 0..n-1 of the same pattern for every size.
std::vector<uint8_t> Pattern(size_t n) {
  std::vector<uint8_t> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(i * 131 + (i >> 9));
  return b;
}

// XXH3-64 as libxxhash 0.8.1 computes it (XXH3_64bits), for every code path
// of the hash: up to 3, 8, 16, 128 and 240 bytes, stripes, blocks and a long
// tail. Every checksum already on disk was computed by that library: these
// must never change.
struct KnownAnswer {
  size_t n;
  uint64_t xxh3;
};
constexpr KnownAnswer kKnownAnswers[] = {
    {0, 0x2d06800538d394c2ULL},     {1, 0xc44bdff4074eecdbULL},      {3, 0x6811538b444fc6dcULL},
    {4, 0xed503340c589a28bULL},     {8, 0xe5b43ab074c9c13bULL},      {9, 0x089b8d25b20fb877ULL},
    {16, 0x0a0ec5ae8679cb7fULL},    {17, 0x57c52d21ce492c1eULL},     {128, 0x696069c4f1e6a91aULL},
    {129, 0xb1ada52285757bebULL},   {240, 0xb80284837259eee4ULL},    {241, 0x44dbd3180a664e27ULL},
    {1024, 0xcc338a494acf74beULL},  {1025, 0x027f8ed1f658e5fcULL},   {65536, 0xc1b5960e97b31ef0ULL},
    {65537, 0x7e4d114e9d2687caULL}, {1000003, 0xa47883e6fe743053ULL},
};

TEST(ChecksumTest, Xxh3IsTheChecksumOfFilesAlreadyWritten) {
  const std::vector<uint8_t> bytes = Pattern(1000003);
  for (const KnownAnswer& k : kKnownAnswers) {
    EXPECT_EQ(Xxh3(bytes.data(), k.n), k.xxh3) << k.n;
    std::vector<uint8_t> copy(k.n);
    EXPECT_EQ(CopyAndXxh3(copy.data(), bytes.data(), k.n), k.xxh3) << k.n;
  }
}

TEST(ChecksumTest, HexIsSixteenLowercaseDigits) {
  EXPECT_EQ(ChecksumHex(0x2d06800538d394c2ULL), "2d06800538d394c2");
  EXPECT_EQ(ChecksumHex(0xAB), "00000000000000ab");
}

}  // namespace
}  // namespace ckptd::format
