#include "policy/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <numeric>
#include <stdexcept>
#include <vector>

namespace nopfs::policy {
namespace {

// ---- Golden vectors ----------------------------------------------------------------------------
// Made by the independent Python reference, tests/reference/sampler_ref.py. To regenerate, run
//   /usr/bin/python3 tests/reference/sampler_ref.py --golden
// and paste its blocks below (the ctest policy_reference_check also compares the two on random
// cases at every test run). A change here changes every job's shuffle: it breaks resume and
// cross-node agreement and must be called out as an incompatible change.

TEST(SplitMix64Test, GoldenOutputs) {
  // SplitMix64(0): E220A8397B1DCDAF is also the first output in Vigna's reference implementation.
  const uint64_t zero[] = {0xE220A8397B1DCDAFULL, 0x6E789E6AA1B965F4ULL, 0x06C45D188009454FULL,
                           0xF88BB8A8724C81ECULL};
  SplitMix64 a(0);
  for (uint64_t v : zero)
    EXPECT_EQ(a.Next(), v);
  const uint64_t max[] = {0xE4D971771B652C20ULL, 0xE99FF867DBF682C9ULL, 0x382FF84CB27281E9ULL};
  SplitMix64 b(UINT64_MAX);
  for (uint64_t v : max)
    EXPECT_EQ(b.Next(), v);
}

struct BoundedCase {
  uint64_t state;
  uint64_t range;
  uint64_t outputs[4];
};

TEST(SplitMix64Test, GoldenBounded) {
  const BoundedCase cases[] = {
      {0x0000000000000000ULL, 0x0000000000000001ULL, {0ULL, 0ULL, 0ULL, 0ULL}},
      {0x0000000000000000ULL, 0x0000000000000003ULL, {2ULL, 1ULL, 0ULL, 2ULL}},
      // range 2^63+1 rejects almost half of all draws: this pins the rejection path.
      {0x0000000000000001ULL,
       0x8000000000000001ULL,
       {8955919645141445295ULL, 4098490376910890117ULL, 4097618618563484380ULL,
        7036458801432265024ULL}},
      {0x0000000000000063ULL,
       0xFFFFFFFFFFFFFFFFULL,
       {4824385676517010402ULL, 583982616703494563ULL, 15398599001720869626ULL,
        1887459716761070806ULL}},
      {0x00000000000007E8ULL, 0x00000000000F4243ULL, {622767ULL, 97232ULL, 298577ULL, 116187ULL}},
  };
  for (const BoundedCase& c : cases) {
    SplitMix64 rng(c.state);
    for (uint64_t v : c.outputs)
      EXPECT_EQ(rng.Bounded(c.range), v) << "range " << c.range;
  }
}

struct PermCase {
  uint64_t seed;
  uint32_t epoch;
  uint64_t samples;
  std::vector<SampleId> perm;
};

TEST(EpochPermutationTest, GoldenPermutations) {
  const PermCase cases[] = {
      {0x0000000000000000ULL, 0u, 1, {0}},
      {0x0000000000000000ULL, 0u, 2, {0, 1}},
      {0x0000000000000001ULL, 0u, 2, {1, 0}},
      {0x000000000000002AULL, 3u, 13, {5, 7, 6, 9, 12, 11, 0, 4, 3, 1, 2, 8, 10}},
      {0xFFFFFFFFFFFFFFFFULL, 7u, 10, {0, 8, 9, 2, 6, 3, 7, 4, 1, 5}},
      {0x0000000000003039ULL, 0u, 31, {3,  8,  4,  28, 17, 26, 12, 24, 25, 6, 16, 29, 1, 13, 11, 10,
                                       30, 21, 27, 23, 9,  14, 22, 18, 20, 7, 2,  19, 5, 15, 0}},
      {0xFFFFFFFFFFFFFFFFULL,
       4294967295u,
       17,
       {2, 16, 15, 4, 9, 8, 6, 13, 1, 14, 7, 0, 5, 10, 11, 3, 12}},
  };
  for (const PermCase& c : cases) {
    EXPECT_EQ(EpochPermutation(c.seed, c.epoch, c.samples), c.perm)
        << "seed " << c.seed << " epoch " << c.epoch << " F " << c.samples;
  }
}

// FNV-1a 64 over the entries as little-endian uint32, as sampler_ref.py computes it.
uint64_t Fnv1a(const std::vector<SampleId>& v) {
  uint64_t h = 0xCBF29CE484222325ULL;
  for (SampleId x : v) {
    for (int k = 0; k < 4; ++k) {
      h ^= (x >> (8 * k)) & 0xFF;
      h *= 0x100000001B3ULL;
    }
  }
  return h;
}

struct FingerprintCase {
  uint64_t seed;
  uint32_t epoch;
  uint64_t samples;
  SampleId head[8];
  uint64_t fnv1a;
};

TEST(EpochPermutationTest, GoldenFingerprints) {
  const FingerprintCase cases[] = {
      {0x0000000000000000ULL,
       0u,
       1000,
       {279, 872, 144, 943, 772, 312, 205, 639},
       0x7ACF967840625F79ULL},
      {0x0000000000000007ULL,
       89u,
       100003,
       {87397, 78642, 90383, 12560, 47299, 11092, 75526, 67008},
       0xD6934B3AEFE80761ULL},
      {0xFFFFFFFFFFFFFFFFULL,
       1u,
       65536,
       {63104, 63079, 1393, 51849, 37682, 41024, 19320, 18505},
       0xA38873D505C66C21ULL},
  };
  for (const FingerprintCase& c : cases) {
    const std::vector<SampleId> perm = EpochPermutation(c.seed, c.epoch, c.samples);
    ASSERT_EQ(perm.size(), c.samples);
    EXPECT_TRUE(std::equal(std::begin(c.head), std::end(c.head), perm.begin()));
    EXPECT_EQ(Fnv1a(perm), c.fnv1a) << "seed " << c.seed << " epoch " << c.epoch;
  }
}

// ---- Properties --------------------------------------------------------------------------------

bool IsPermutation(const std::vector<SampleId>& v) {
  std::vector<bool> seen(v.size(), false);
  for (SampleId x : v) {
    if (x >= v.size() || seen[x]) return false;
    seen[x] = true;
  }
  return true;
}

TEST(EpochPermutationTest, EveryEpochIsAPermutation) {
  for (uint64_t f : {0ULL, 1ULL, 2ULL, 3ULL, 97ULL, 1000ULL, 65537ULL}) {
    for (uint32_t e : {0u, 1u, 2u, 89u, UINT32_MAX}) {
      const std::vector<SampleId> p = EpochPermutation(12345, e, f);
      EXPECT_EQ(p.size(), f);
      EXPECT_TRUE(IsPermutation(p)) << "F " << f << " epoch " << e;
    }
  }
}

TEST(EpochPermutationTest, EpochsAndSeedsDiffer) {
  const uint64_t f = 5000;
  std::vector<std::vector<SampleId>> seen;
  for (uint64_t seed : std::initializer_list<uint64_t>{0, 1, 2, UINT64_MAX}) {
    for (uint32_t e = 0; e < 8; ++e)
      seen.push_back(EpochPermutation(seed, e, f));
  }
  for (size_t a = 0; a < seen.size(); ++a) {
    for (size_t b = a + 1; b < seen.size(); ++b)
      EXPECT_NE(seen[a], seen[b]) << a << " " << b;
  }
  // Not the identity either.
  std::vector<SampleId> identity(f);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_NE(seen[0], identity);
}

TEST(EpochPermutationTest, SpanAndVectorFormsAgreeAndAreRepeatable) {
  std::vector<SampleId> buf(777, 12345);  // stale contents must not matter
  EpochPermutation(99, 4, buf);
  EXPECT_EQ(buf, EpochPermutation(99, 4, 777));
  EXPECT_EQ(EpochPermutation(99, 4, 777), EpochPermutation(99, 4, 777));
}

TEST(EpochPermutationTest, EpochSeedMixesSeedXorEpochTimesGamma) {
  // The first output of SplitMix64(seed ^ e*gamma): for seed 0 and epochs 0 and 1, the first and
  // second outputs of SplitMix64(0).
  EXPECT_EQ(EpochSeed(0, 0), 0xE220A8397B1DCDAFULL);
  EXPECT_EQ(EpochSeed(0, 1), 0x6E789E6AA1B965F4ULL);
  EXPECT_EQ(EpochSeed(UINT64_MAX, 0), 0xE4D971771B652C20ULL);
  EXPECT_EQ(EpochSeed(5, 3), SplitMix64(5 ^ (3 * kGoldenGamma)).Next());
}

TEST(EpochPermutationTest, PositionsAreRoughlyUniform) {
  // Where sample 0 lands over many epochs: each of 8 positions about 1/8 of the time. 8000 draws:
  // the standard deviation of a count is ~30, the bounds are ~6.5 of them.
  const uint64_t f = 8;
  uint64_t where[f] = {};
  for (uint32_t e = 0; e < 8000; ++e) {
    const std::vector<SampleId> p = EpochPermutation(3, e, f);
    ++where[std::find(p.begin(), p.end(), 0u) - p.begin()];
  }
  for (uint64_t c : where) {
    EXPECT_GT(c, 800u);
    EXPECT_LT(c, 1200u);
  }
}

TEST(SplitMix64Test, BoundedStaysInRangeAndIsUnbiased) {
  SplitMix64 rng(7);
  uint64_t counts[3] = {};
  for (int i = 0; i < 30000; ++i) {
    const uint64_t v = rng.Bounded(3);
    ASSERT_LT(v, 3u);
    ++counts[v];
  }
  for (uint64_t c : counts) {
    EXPECT_GT(c, 9500u);  // mean 10000, standard deviation ~82
    EXPECT_LT(c, 10500u);
  }
  // range = 3 * 2^62: a bare multiply-shift maps 4 draws onto 3 values, floor(3x/4), so values
  // divisible by 3 would get half of all draws; with the rejection they get a third.
  uint64_t thirds = 0;
  const uint64_t range = 3ULL << 62;
  for (int i = 0; i < 30000; ++i)
    thirds += rng.Bounded(range) % 3 == 0 ? 1 : 0;
  EXPECT_GT(thirds, 9500u);  // mean 10000, standard deviation ~82 (15000 without rejection)
  EXPECT_LT(thirds, 10500u);
  EXPECT_THROW(rng.Bounded(0), std::invalid_argument);
}

}  // namespace
}  // namespace nopfs::policy
