// Internal to policy/: the shape of one epoch of a job (how steps, ranks and entries map to
// positions of the epoch's permutation), shared by partition.cc, frequency.cc and predict.cc.
// Other folders use partition.h instead. docs/algorithm.md §2 defines both schemes.
//
// Thread safety: a value type; the visitor is reentrant.
#pragma once

#include <algorithm>
#include <cstdint>

#include "policy/job.h"

namespace nopfs::policy::internal {

struct EpochShape {
  Scheme scheme = Scheme::kUniform;
  uint64_t samples = 0;  // F
  uint64_t ranks = 0;    // N
  uint64_t batch = 0;    // B
  uint64_t steps = 0;    // T, the same for every rank

  // uniform: steps whose batch has B entries (all but a trailing partial one), and the size of
  // that trailing batch after padding (0 if there is none: F divisible by B, or drop_last). A
  // trailing batch of b = F mod B entries is padded to max(b, (N-1)*ceil(b/N) + 1), the fewest
  // entries that leave no rank's slice empty; the padding (< N entries) repeats the head of the
  // permutation (positions p >= F are read as p - F).
  uint64_t full_steps = 0;
  uint64_t tail = 0;

  // strided: M, entries of each rank's epoch list after padding or truncation, and r = ceil(B/N).
  uint64_t per_rank = 0;
  uint64_t rank_batch = 0;

  // The job must be valid (JobSpec::Validate).
  explicit EpochShape(const JobSpec& job);

  // uniform: the size of batch `step`.
  uint64_t BatchSize(uint64_t step) const { return step < full_steps ? batch : tail; }

  // uniform: [*begin, *end), the slice of a batch of `b` entries that rank `rank` takes:
  // [i*ceil(b/N), min((i+1)*ceil(b/N), b)), empty if it starts at or past b.
  void Slice(uint64_t b, uint64_t rank, uint64_t* begin, uint64_t* end) const {
    const uint64_t q = b / ranks + (b % ranks != 0 ? 1 : 0);
    *begin = std::min(rank * q, b);
    *end = std::min(*begin + q, b);
  }

  // uniform: the position in pi_e of position p of the padded epoch.
  uint64_t Wrap(uint64_t p) const { return p < samples ? p : p - samples; }

  // strided: the position in pi_e of the rank's k-th entry: rank + k*N, wrapped into [0, F)
  // (positions past F are the padding that repeats the head of the permutation).
  uint64_t StridedPosition(uint64_t rank, uint64_t k) const {
    const uint64_t p = rank + k * ranks;
    return p < samples ? p : p % samples;
  }

  // Calls fn(local_rank, position) for every entry of the epoch stream of ranks
  // [first, first + count) in the node's order: step, then rank, then entry.
  template <typename Fn>
  void ForEachNodeEntry(uint64_t first, uint64_t count, Fn&& fn) const;
};

template <typename Fn>
void EpochShape::ForEachNodeEntry(uint64_t first, uint64_t count, Fn&& fn) const {
  if (scheme == Scheme::kUniform) {
    uint64_t base = 0;  // the batch's first position in pi_e
    for (uint64_t h = 0; h < steps; ++h) {
      const uint64_t b = BatchSize(h);
      for (uint64_t l = 0; l < count; ++l) {
        uint64_t begin = 0;
        uint64_t end = 0;
        Slice(b, first + l, &begin, &end);
        for (uint64_t p = begin; p < end; ++p)
          fn(static_cast<uint32_t>(l), Wrap(base + p));
      }
      base += b;
    }
    return;
  }
  for (uint64_t h = 0; h < steps; ++h) {
    const uint64_t kb = h * rank_batch;
    const uint64_t ke = kb + std::min(rank_batch, per_rank - kb);
    for (uint64_t l = 0; l < count; ++l) {
      for (uint64_t k = kb; k < ke; ++k)
        fn(static_cast<uint32_t>(l), StridedPosition(first + l, k));
    }
  }
}

}  // namespace nopfs::policy::internal
