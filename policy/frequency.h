// Per-node access frequencies over all epochs (docs/algorithm.md §3, "node, not rank").
//
// The node's concatenated stream orders its accesses by epoch, then step, then local rank (in rank
// order), then entry: the order in which the node as a whole consumes samples when its ranks run in
// lockstep. Positions in it are 64-bit.
//
// Thread safety: CountNodeAccesses is reentrant; it starts up to `threads` worker threads itself,
// each taking whole epochs (epochs are independent, worker w takes epochs w, w+W, ...). Workers
// add into the one result with atomic sums and minima, which do not depend on order, so the result
// is identical for every thread count.
//
// Cost: E permutations of F entries (the bulk) plus O(1) per access of the node. Memory: the
// result (12 bytes per sample) plus 4*F bytes per worker; no more workers than E, nor than keep
// those buffers within 2 GiB, are started.
#pragma once

#include <cstdint>
#include <vector>

#include "policy/job.h"

namespace nopfs::policy {

inline constexpr uint64_t kNeverAccessed = UINT64_MAX;

struct NodeAccessCounts {
  uint32_t node = 0;
  std::vector<uint32_t> count;  // [F]: a_k(n), how often the node reads sample k
  std::vector<uint64_t>
      first_access;       // [F]: first position in the concatenated stream, or kNeverAccessed
  uint64_t accesses = 0;  // total entries in the node's stream (E * NodeEpochLength)
  uint64_t distinct = 0;  // samples with count > 0
};

// Counts node `node`'s accesses over all E epochs. threads == 0 means hardware concurrency.
// The result is identical for every thread count. Throws std::invalid_argument if the job does
// not validate and std::out_of_range if node >= job.nodes().
NodeAccessCounts CountNodeAccesses(const JobSpec& job, uint32_t node, unsigned threads = 0);

}  // namespace nopfs::policy
