// The plan of one node (docs/algorithm.md §5): which samples each cache class holds and the order
// in which its prefetchers fill it.
//
// Rule: samples the node reads (a_k(n) > 0) are ranked by a_k(n) descending, then first access
// ascending, then id ascending. In that order each sample goes to the fastest class whose remaining
// capacity still holds it (first fit by bytes), or to none. Within a class the prefetch list is
// ordered by first access. Tier contents are fixed for the job.
//
// The simpler planners the benchmarks compare against (docs/simulate.md) reuse the same fill:
//   staging:   no class holds anything; every read streams from the PFS through staging.
//   fill-once: samples are ranked by first access only (then id), as a cache that keeps what is
//              read first until it is full and never evicts (CoorDL's MinIO) would hold them.
//
// Thread safety: pure functions; MakeNodePlan(job, ...) starts worker threads via
// CountNodeAccesses.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "policy/frequency.h"
#include "policy/job.h"

namespace nopfs::policy {

inline constexpr int8_t kNotCached = -1;

// Which samples the classes hold.
enum class Planner : uint8_t {
  kFrequency,  // the node's most frequently read samples (the NoPFS rule)
  kStaging,    // none: staging only, prefetch-ahead in stream order
  kFillOnce,   // the first-accessed samples until the classes are full
};
std::string_view PlannerName(Planner p);
// "frequency", "staging" or "fill-once"; the message lists them.
Result<Planner> ParsePlanner(std::string_view name);

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
                      std::span<const Bytes> capacities, Planner planner = Planner::kFrequency);

// Convenience: counts (with `threads` workers) and plans in one call; throws like
// CountNodeAccesses, and std::invalid_argument if sizes.size() != F.
NodePlan MakeNodePlan(const JobSpec& job, uint32_t node, std::span<const Bytes> sizes,
                      std::span<const Bytes> capacities, unsigned threads = 0,
                      Planner planner = Planner::kFrequency);

}  // namespace nopfs::policy
