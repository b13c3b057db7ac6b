#include "common/checksum.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <random>
#include <vector>

namespace nopfs {
namespace {

// ColdXxh3 must be XXH3_64bits exactly: tiers record one and verify with the other.
TEST(ColdXxh3, EqualsTheOneShotXxh3AtEverySizeAroundItsSteps) {
  std::vector<std::byte> bytes((4u << 20) + 8192);  // the largest case, at the largest offset
  std::mt19937_64 rng(7);
  for (std::byte& b : bytes)
    b = static_cast<std::byte>(rng());
  for (size_t n : {0, 1, 63, 64, 1023, 1024, 1025, 1535, 1536, 1537, 16383, 16384, 16385, 65536,
                   131072, 131072 + 7, 1 << 20, 4 << 20, (4 << 20) + 4095}) {
    for (size_t at : {0, 1, 13}) {
      const std::span<const std::byte> s(bytes.data() + at, n);
      EXPECT_EQ(ColdXxh3(s), XXH3_64bits(s.data(), s.size())) << n << " bytes at +" << at;
    }
  }
}

TEST(ColdXxh3, SeesAFlippedBitAnywhere) {
  std::vector<std::byte> bytes(131072, std::byte{0x5a});
  const uint64_t clean = ColdXxh3(bytes);
  for (size_t at : {size_t{0}, size_t{1023}, size_t{1024}, size_t{70000}, bytes.size() - 1}) {
    bytes[at] ^= std::byte{1};
    EXPECT_NE(ColdXxh3(bytes), clean) << "bit flipped at " << at;
    bytes[at] ^= std::byte{1};
  }
  EXPECT_EQ(ColdXxh3(bytes), clean);
}

// Xxh3 must be XXH3_64bits exactly, whichever vector unit it runs on: every size class of XXH3
// (up to 16, 128, 240 bytes, then stripes of 64 and blocks of 1 KiB), odd lengths and offsets.
TEST(Xxh3, EqualsTheLibrarysXxh3AtEverySizeAndAlignment) {
  std::vector<std::byte> bytes((1u << 20) + 64);
  std::mt19937_64 rng(11);
  for (std::byte& b : bytes)
    b = static_cast<std::byte>(rng());
  for (size_t n : {0,   1,   3,   4,    8,    9,    16,   17,    128,    129,        240,
                   241, 255, 256, 1023, 1024, 1025, 4095, 65536, 131072, 131072 + 7, 1 << 20}) {
    for (size_t at : {0, 1, 13, 32}) {
      const std::span<const std::byte> s(bytes.data() + at, n);
      ASSERT_EQ(Xxh3(s), XXH3_64bits(s.data(), s.size())) << n << " at " << at;
    }
  }
  bytes[77777] ^= std::byte{1};
  const std::span<const std::byte> all(bytes.data(), 1 << 20);
  EXPECT_EQ(Xxh3(all), XXH3_64bits(all.data(), all.size()));
}

}  // namespace
}  // namespace nopfs
