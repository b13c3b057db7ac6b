// Per-node access frequencies over all epochs (ALGORITHM.md §3, "node, not rank").
//
// The node's concatenated stream orders its accesses by epoch, then step, then local rank (in rank
// order), then entry: the order in which the node as a whole consumes samples when its ranks run in
// lockstep. Positions in it are 64-bit.
//
// Thread safety: CountNodeAccesses is reentrant; it starts up to `threads` worker threads itself,
// each taking whole epochs (epochs are independent), and merges their counts.
#pragma once

#include <cstdint>
#include <vector>

#include "policy/job.h"

namespace nopfs::policy {

inline constexpr uint64_t kNeverAccessed = UINT64_MAX;

struct NodeAccessCounts {
  uint32_t node = 0;
  std::vector<uint32_t> count;         // [F]: a_k(n), how often the node reads sample k
  std::vector<uint64_t> first_access;  // [F]: first position in the concatenated stream, or kNeverAccessed
  uint64_t accesses = 0;               // total entries in the node's stream (E * NodeEpochLength)
  uint64_t distinct = 0;               // samples with count > 0
};

// Counts node `node`'s accesses over all E epochs. threads == 0 means hardware concurrency.
// The result is identical for every thread count.
NodeAccessCounts CountNodeAccesses(const JobSpec& job, uint32_t node, unsigned threads = 0);

}  // namespace nopfs::policy
