#include "policy/sampler.h"

#include <stdexcept>

namespace nopfs::policy {
namespace {

__extension__ typedef unsigned __int128 U128;

// How many swap partners are drawn (and their cache lines prefetched) before the swaps are done.
// The draws do not depend on the array, so drawing ahead changes nothing but the memory traffic:
// for large F the swaps are random accesses, and overlapping their cache misses is most of the
// speed.
constexpr uint64_t kDrawAhead = 64;

}  // namespace

uint64_t SplitMix64::Bounded(uint64_t range) {
  if (range == 0) throw std::invalid_argument("SplitMix64::Bounded: range must be at least 1");
  uint64_t x = Next();
  U128 m = static_cast<U128>(x) * range;
  uint64_t low = static_cast<uint64_t>(m);
  if (low < range) {
    // 2^64 mod range: the number of low products that would make some results more likely.
    const uint64_t threshold = (0 - range) % range;
    while (low < threshold) {
      x = Next();
      m = static_cast<U128>(x) * range;
      low = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

void EpochPermutation(uint64_t seed, uint32_t epoch, std::span<SampleId> out) {
  const uint64_t f = out.size();
  if (f > kMaxSamples) {
    throw std::invalid_argument("EpochPermutation: more samples than SampleId can hold");
  }
  for (uint64_t i = 0; i < f; ++i)
    out[i] = static_cast<SampleId>(i);
  if (f < 2) return;
  SplitMix64 rng(EpochSeed(seed, epoch));
  SampleId* const a = out.data();
  uint32_t partner[kDrawAhead];
  uint64_t i = f - 1;  // the next position to finalize; i >= 1 inside the loop
  while (i > 0) {
    const uint64_t n = i < kDrawAhead ? i : kDrawAhead;
    for (uint64_t d = 0; d < n; ++d) {
      const uint64_t j = rng.Bounded(i - d + 1);
      partner[d] = static_cast<uint32_t>(j);
#if defined(__GNUC__)
      __builtin_prefetch(a + j, 1);
#endif
    }
    for (uint64_t d = 0; d < n; ++d) {
      const uint64_t pos = i - d;
      const SampleId t = a[pos];
      a[pos] = a[partner[d]];
      a[partner[d]] = t;
    }
    i -= n;
  }
}

std::vector<SampleId> EpochPermutation(uint64_t seed, uint32_t epoch, uint64_t samples) {
  std::vector<SampleId> out(samples);
  EpochPermutation(seed, epoch, out);
  return out;
}

}  // namespace nopfs::policy
