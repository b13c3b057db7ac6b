// The model's prediction for one node (docs/algorithm.md §6): each local rank consumes its stream
// at compute rate c while a staging buffer with p_0 threads fetches ahead from the source the model
// picks; the prediction is the time the consumer waits (stall).
//
//   t_{i,f} = max(avail_i(f), t_{i,f-1} + s_{R_{f-1}}/c)
//   avail_i(f) = sum_{k<=f} read_i(R_k) / p_0, read = fetch + write
//
// p_0 is model.staging.threads: each local rank has its own staging ring with p_0 threads. A
// sample the plan caches (plan.location = j >= 0) is fetched from class j, or from the PFS if that
// is faster per byte (ChooseSource's rule, ties to the class); any other sample from the PFS.
// docs/algorithm.md §5 gives the details.
//
// Thread safety: pure; starts up to `threads` worker threads itself (they generate the epochs'
// permutations; the result does not depend on their number).
#pragma once

#include <array>
#include <cstdint>
#include <span>

#include "policy/job.h"
#include "policy/model.h"
#include "policy/plan.h"

namespace nopfs::policy {

struct NodePrediction {
  double compute_seconds = 0;  // max over the node's ranks of the sum of s/c over its stream
  double stall_seconds = 0;    // max over the node's ranks of the total stall
  // max over ranks of the end of the rank's last compute, t_{i,last} + s_last/c; for each rank
  // that is exactly its compute plus its stall.
  double total_seconds = 0;
  // Fraction of the node's reads served by local tiers, peers and the PFS, and bytes from each.
  std::array<uint64_t, 3> reads{};  // indexed by SourceKind
  std::array<Bytes, 3> bytes{};
};

// Predicts node `plan.node`'s stall. Samples the node does not cache are read from the PFS with
// `pfs_readers` concurrent readers (the job's node count when every node misses alike); peers are
// not modelled here (peer_class = -1) until the directory exists. `threads` workers (0: hardware
// concurrency) generate the permutations. Throws std::invalid_argument if the job does not
// validate, sizes or plan.location do not have F entries, or the plan names a class the model
// lacks; std::out_of_range if plan.node is not a node of the job. Cost: E permutations of F plus
// O(1) per access (a 16-node ImageNet-1k job, 7.2M accesses per node, takes about 0.2 s).
NodePrediction PredictNode(const JobSpec& job, const NodePlan& plan, std::span<const Bytes> sizes,
                           const SystemModel& model, uint32_t pfs_readers, unsigned threads = 0);

}  // namespace nopfs::policy
