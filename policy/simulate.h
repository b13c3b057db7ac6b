// The simulator behind `nopfs simulate` (docs/simulate.md): the performance model of
// docs/algorithm.md §4 run as a discrete-event simulation of t_{i,f}, the time rank i consumes the
// f-th entry of its stream, under each data-loading policy the benchmarks compare:
//
//   no-io       the consumer alone (synthetic data): the lower bound of every other policy;
//   frequency   nopfs: tiers hold the node's most read samples (MakeNodePlan), filled ahead by
//               p_j prefetch threads per class in first-access order; p_0 staging threads per
//               rank fetch each entry from the tier once it is filled, else from the PFS;
//   staging     nopfs without tiers: staging threads read every entry from the PFS;
//   fill-once   tiers hold the first-read samples (Planner::kFillOnce) until full, never evicted
//               (CoorDL's MinIO). As nopfsd runs it, prefetchers fill them in first-access order
//               like frequency's; with fill_once_on_read, the first staged read of each sample
//               writes it into its tier instead (no prefetchers), as MinIO does;
//   dataloader  PyTorch's DataLoader on the PFS: W worker processes per rank each load whole
//               batches (fetch + preprocessing), at most prefetch_factor * W batches ahead,
//               restarted at every epoch (persistent_workers = False).
//
// The job's node `node` is simulated; the other nodes are taken to behave alike (symmetry: every
// node reads E*F/N samples drawn from the same permutations, with the same classes), so the job's
// PFS readers are nodes x the node's readers and the job's PFS bytes nodes x the node's. The
// recurrence per staged entry is PredictNode's (fluid staging: avail advances by read/p_0), plus
// what PredictNode leaves out: tiers that fill over time, a staging window of the ring's
// capacity, and the ranks of a node meeting at every step (data-parallel allreduce). With
// warm_tiers, no window and no step barrier, the frequency policy's totals equal PredictNode's.
// Peers (b_c > 0, several nodes): a miss is read from a peer that holds the sample, if faster
// than the PFS. Which peer holds what is not planned per node (1024 plans would cost 1024 passes):
// a peer is known once another node has read the sample at an earlier step (tracked exactly, in
// one pass over each epoch); it keeps it with the probability that this node's own plan keeps
// what it reads, in a class drawn by this plan's bytes (symmetry); its copy is ready by
// docs/algorithm.md §7's rule with its prefetch progress taken as this node's (or at once where
// staging reads fill tiers). Prefetchers read from the PFS only, as nopfsd's do.
//
// Thread safety: pure; starts up to `threads` worker threads (counting and permutations).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "policy/job.h"
#include "policy/model.h"

namespace nopfs::policy {

enum class SimPolicy : uint8_t { kNoIo, kFrequency, kStaging, kFillOnce, kDataLoader };
inline constexpr std::array kAllSimPolicies = {SimPolicy::kNoIo, SimPolicy::kFrequency,
                                               SimPolicy::kStaging, SimPolicy::kFillOnce,
                                               SimPolicy::kDataLoader};
// "no-io", "frequency", "staging", "fill-once", "dataloader".
std::string_view SimPolicyName(SimPolicy p);
Result<SimPolicy> ParseSimPolicy(std::string_view name);

struct SimOptions {
  JobSpec job;
  // c is model.compute_rate, bytes/s per rank (must be > 0); the classes' capacities are the
  // node's (shared by its ranks); staging.capacity is the node's ring bytes, split among ranks.
  SystemModel model;
  uint32_t node = 0;             // the node simulated
  uint32_t loader_workers = 4;   // W of the DataLoader baseline (0: load in the main process)
  uint32_t loader_prefetch = 2;  // DataLoader prefetch_factor (batches per worker in flight)
  bool step_barrier = true;      // the node's ranks start each step together
  bool staging_window = true;    // staging runs at most one ring's capacity ahead
  bool warm_tiers = false;       // tiers are full at time 0 (PredictNode's assumption)
  // A staged PFS read of a sample planned for a tier also writes it there (docs/algorithm.md §7's
  // fetch-and-cache, as nopfsd does; off models a service whose tiers only prefetchers fill).
  bool fetch_and_cache = true;
  bool fill_once_on_read = false;  // fill-once: tiers filled by staging reads, not prefetchers
  // frequency and fill-once read from peers (model.network_bandwidth > 0, more than one node).
  bool peers = true;
  // Concurrent PFS readers in the job for the nopfs policies; 0: derived (nodes x the node's
  // staging threads, plus the prefetch threads of its non-empty classes until they are done).
  uint32_t pfs_readers = 0;
  unsigned threads = 0;  // workers for counting and permutations (0: hardware concurrency)

  // Job valid, node in range, compute_rate > 0, model valid, loader_prefetch >= 1.
  Status Validate() const;
};

struct PolicyResult {
  SimPolicy policy = SimPolicy::kNoIo;
  std::vector<double> epoch_seconds;  // [E]: from the end of the previous epoch (slowest rank)
  double total_seconds = 0;           // end of the last epoch
  double compute_seconds = 0;         // max over ranks of the sum of s/c
  double stall_seconds = 0;           // max over ranks of the time waiting for data
  // Per step, the longest wait of the node's ranks for data in that step; median and p99 over
  // all E*T steps (nearest rank).
  double stall_median_seconds = 0;
  double stall_p99_seconds = 0;
  uint64_t steps = 0;
  uint32_t pfs_readers = 0;         // gamma (while the prefetchers run)
  Bytes node_pfs_bytes = 0;         // bytes the node reads from the PFS (staging, prefetch)
  Bytes job_pfs_bytes = 0;          // node_pfs_bytes x nodes
  std::array<uint64_t, 3> reads{};  // consumed entries by source (SourceKind)
};

// Runs each policy of `policies` over the job's whole stream on node options.node. sizes has F
// entries. Cost: E permutations of F once (shared by the policies), one CountNodeAccesses pass
// if a tiered policy is asked for, and O(1) per access and policy. Errors: InvalidArgument.
Result<std::vector<PolicyResult>> Simulate(const SimOptions& options, std::span<const Bytes> sizes,
                                           std::span<const SimPolicy> policies);

}  // namespace nopfs::policy
