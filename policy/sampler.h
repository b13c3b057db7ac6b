// The portable epoch permutation (docs/algorithm.md §2.1).
//
// pi_e is a Fisher-Yates shuffle of the identity [0, F): for i = F-1 down to 1, swap positions i
// and j = Bounded(i+1), where Bounded() is Lemire's multiply-shift with rejection over a SplitMix64
// stream whose state starts at EpochSeed(seed, e): the first output of a SplitMix64 started at
// seed XOR (e * 0x9E3779B97F4A7C15) (see EpochSeed for why not that value itself). It never uses
// the standard library's engines or shuffle, so every language and compiler replays it identically;
// the golden vectors in policy/sampler_test.cc (made by tests/reference/sampler_ref.py) pin it.
//
// Thread safety: SplitMix64 is a value; the free functions are pure and reentrant.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "policy/job.h"

namespace nopfs::policy {

inline constexpr uint64_t kGoldenGamma = 0x9E3779B97F4A7C15ULL;

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t state) : state_(state) {}
  uint64_t Next() {
    uint64_t z = (state_ += kGoldenGamma);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, range), range >= 1 (Lemire 2019, "Fast random integer generation in an
  // interval", with rejection so that there is no bias).
  uint64_t Bounded(uint64_t range);

 private:
  uint64_t state_;
};

// The SplitMix64 state that epoch `epoch`'s shuffle starts from: the first output of a SplitMix64
// whose state starts at seed XOR (epoch * kGoldenGamma). The mixing step matters. SplitMix64
// advances its state by kGoldenGamma per draw, so two epochs whose starting states differ by a
// multiple of kGoldenGamma draw the same numbers, shifted; started at seed XOR (e * gamma) itself,
// that holds for every pair of epochs when seed = 0, and for many pairs when the seed has few set
// bits (seed XOR e*gamma = e*gamma + d with d taking only a few values). Such epochs shuffle
// almost alike; docs/algorithm.md §2.1 shows what that does to access frequencies.
inline uint64_t EpochSeed(uint64_t seed, uint32_t epoch) {
  return SplitMix64(seed ^ (static_cast<uint64_t>(epoch) * kGoldenGamma)).Next();
}

// Writes pi_epoch into `out` (out.size() is F).
void EpochPermutation(uint64_t seed, uint32_t epoch, std::span<SampleId> out);
std::vector<SampleId> EpochPermutation(uint64_t seed, uint32_t epoch, uint64_t samples);

}  // namespace nopfs::policy
