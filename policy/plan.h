// The plan of one node (ALGORITHM.md §5): which samples each cache class holds and the order in
// which its prefetchers fill it.
//
// Rule: samples the node reads (a_k(n) > 0) are ranked by a_k(n) descending, then first access
// ascending, then id ascending. In that order each sample goes to the fastest class whose remaining
// capacity still holds it (first fit by bytes), or to none. Within a class the prefetch list is
// ordered by first access. Tier contents are fixed for the job.
//
// Thread safety: pure functions; MakeNodePlan(job, ...) starts worker threads via
// CountNodeAccesses.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "policy/frequency.h"
#include "policy/job.h"

namespace nopfs::policy {

inline constexpr int8_t kNotCached = -1;

struct TierPlan {
  std::vector<SampleId> prefetch_order;  // by first access in the node's stream
  Bytes bytes = 0;                       // sum of the sizes of its samples
  uint64_t accesses = 0;                 // node accesses this tier will serve (sum of a_k(n))
};

struct NodePlan {
  uint32_t node = 0;
  std::vector<TierPlan> tiers;     // one per capacity given, fastest first
  std::vector<int8_t> location;    // [F]: tier index holding sample k, or kNotCached
  uint64_t accesses = 0;           // node's total accesses over the job
  uint64_t distinct = 0;           // distinct samples the node reads
  Bytes distinct_bytes = 0;        // their total size
  uint64_t uncached_accesses = 0;  // accesses to samples in no tier
};

// The node's plan from its access counts. sizes.size() is F; capacities are the classes' byte
// capacities, fastest first (at most 127 classes); otherwise throws std::invalid_argument. No
// tier's bytes exceed its capacity. Cost: a sort of the distinct samples (16 bytes each) and
// O(classes) per sample.
NodePlan MakeNodePlan(const NodeAccessCounts& counts, std::span<const Bytes> sizes,
                      std::span<const Bytes> capacities);

// Convenience: counts (with `threads` workers) and plans in one call; throws like
// CountNodeAccesses, and std::invalid_argument if sizes.size() != F.
NodePlan MakeNodePlan(const JobSpec& job, uint32_t node, std::span<const Bytes> sizes,
                      std::span<const Bytes> capacities, unsigned threads = 0);

}  // namespace nopfs::policy
