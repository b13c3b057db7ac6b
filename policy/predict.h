// The model's prediction for one node (ALGORITHM.md §4): each local rank consumes its stream at
// compute rate c while a staging buffer with p_0 threads fetches ahead from the source the model
// picks; the prediction is the time the consumer waits (stall).
//
//   t_{i,f} = max(avail_i(f), t_{i,f-1} + s_{R_{f-1}}/c)
//   avail_i(f) = sum_{k<=f} read_i(R_k) / p_0, read = fetch + write
//
// Thread safety: pure.
#pragma once

#include <array>
#include <cstdint>
#include <span>

#include "policy/job.h"
#include "policy/model.h"
#include "policy/plan.h"

namespace nopfs::policy {

struct NodePrediction {
  double compute_seconds = 0;  // sum over the node's slowest rank of s/c
  double stall_seconds = 0;    // max over the node's ranks of the total stall
  double total_seconds = 0;    // max over ranks of t_{i,last}
  // Fraction of the node's reads served by local tiers, peers and the PFS, and bytes from each.
  std::array<uint64_t, 3> reads{};  // indexed by SourceKind
  std::array<Bytes, 3> bytes{};
};

// Predicts node `plan.node`'s stall. Samples the node does not cache are read from the PFS with
// `pfs_readers` concurrent readers (the job's node count when every node misses alike); peers are
// not modelled here (peer_class = -1) until the directory exists.
NodePrediction PredictNode(const JobSpec& job, const NodePlan& plan, std::span<const Bytes> sizes,
                           const SystemModel& model, uint32_t pfs_readers);

}  // namespace nopfs::policy
