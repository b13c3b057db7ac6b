// The placement simulation behind `nopfs simulate --placement` (docs/simulate.md, "Placement"):
// a cluster of N nodes, a scheduler, one user's sweep of jobs on one dataset among other users'
// jobs, and what data-aware placement (a node holding the user's kept copy of the dataset is
// marked; the user's job prefers or requires the marked nodes) saves in first-epoch PFS bytes and
// costs in queue wait, against placement off.
//
// The model, in short (docs/simulate.md has it whole):
//   scheduler   by priority with first fit and no reservations: at every event, the pending jobs
//               in order, each started at once if it can be; whole nodes (one job per node); the
//               priority is the submission time (FIFO), but background_ahead of the other users'
//               jobs rank ahead of the sweep (fair share, a QOS). A job's nodes are drawn at
//               random among the free ones (a busy cluster's free nodes are whichever jobs just
//               ended). A node ends each job with an epilog of epilog_seconds (keeping, marking)
//               before it is free again.
//   placement   off: as above. prefer (Slurm's --prefer): if at least n marked nodes are free, n of
//               them, else as off. require: waits for n free marked nodes while the user has n
//               marked nodes (else as off: there is no warm set to wait for). A node is marked for
//               the user while it holds the user's kept copy: from the end of the job that keeps
//               it (the epilog makes the copy and the mark) until it is adopted, evicted or
//               expires. A node runs one job at a time, so no sibling job shares it.
//   kept copies per user and node (one dataset per user): a job adopts its user's copy on each of
//               its nodes; reserving its SSD grant evicts the least recently used copies of any
//               user until the copies and the grant fit the node's SSD; at its end each node keeps
//               what its SSD tier held, up to the user's quota; a copy expires keep_lifetime after
//               its last use.
//   first epoch a start whose nodes hold kept fractions k_i of the dataset reads
//               dataset x (1 - mean k_i) from the PFS in its first epoch (a node's reads of its
//               share of the epoch are uniform over the dataset; another node's kept copy is not
//               counted).
//   the sweep   sweep_jobs jobs of job_nodes nodes submitted at time 0, at most sweep_concurrency
//               running at once (Slurm's array throttle); log-normal durations; each start is
//               requeued with requeue_probability at a uniform moment of its run.
//   others      Poisson arrivals of jobs of 1, 2, 4, ... background_max_nodes nodes (equally
//               likely) with log-normal durations, at the rate that offers background_load of the
//               cluster's node-hours, from well before time 0 so that the cluster is in its steady
//               state when the sweep comes; each reserves background_ssd_bytes per node and keeps
//               background_keep_bytes per node (up to its user's quota).
//
// Each placement of a run sees the same arrivals, durations and requeues (common random numbers),
// so the difference between placements is the placement's. The random numbers are SplitMix64's,
// never the standard library's: a seed gives the same figures on every machine.
//
// Thread safety: pure.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "policy/job.h"

namespace nopfs::policy {

enum class Placement : uint8_t { kOff, kPrefer, kRequire };
inline constexpr std::array kAllPlacements = {Placement::kOff, Placement::kPrefer,
                                              Placement::kRequire};
// "off", "prefer", "require": the values of the job option --nopfs-placement.
std::string_view PlacementName(Placement p);
Result<Placement> ParsePlacement(std::string_view name);

// A job of another user given exactly (tests, and scenarios such as "n2 is taken"): submitted at
// `submit` seconds (may be < 0: before the sweep), on `pinned` nodes if given (Slurm's
// --nodelist), else on `nodes` nodes drawn as any job's.
struct ScriptedJob {
  double submit = 0;
  uint32_t nodes = 1;
  double seconds = 3600;
  std::vector<uint32_t> pinned;
};

struct PlacementSimOptions {
  uint32_t cluster_nodes = 256;  // N
  // The user's sweep.
  uint32_t sweep_jobs = 32;
  uint32_t sweep_concurrency = 4;  // at most this many of its jobs running at once; 0: no limit
  uint32_t job_nodes = 1;          // n, nodes of each sweep job
  uint32_t epochs = 3;             // E, epochs of each sweep job (what its SSD tier holds)
  double job_seconds = 2 * 3600;   // mean duration of a sweep job (log-normal)
  double job_sigma = 0.5;          // sigma of the log-normal (0: every job job_seconds)
  double requeue_probability = 0.1;
  Bytes dataset_bytes = 0;  // D
  // Every node's SSD (kept copies and the running job's grant share it) and the keep policy.
  Bytes ssd_bytes = 0;
  // A sweep job's SSD grant per node; 0: what its tier holds, min(ssd, D x (1 - (1 - 1/n)^E)).
  Bytes job_ssd_bytes = 0;
  Bytes keep_quota = 0;      // a user's kept bytes per node (0: nothing is kept)
  double keep_lifetime = 0;  // seconds a copy lives after its last use (0: no limit)
  double epilog_seconds = 30;
  // Nodes that hold the user's whole kept copy (up to the quota) when the simulation starts (before
  // the other users' jobs), last used at time 0.
  std::vector<uint32_t> warm_nodes;
  // Other users.
  double background_load = 0.8;        // share of the node-hours their jobs offer, [0, 1)
  uint32_t background_max_nodes = 16;  // sizes 1, 2, 4, ... up to this
  double background_seconds = 4 * 3600;
  double background_sigma = 1.0;
  Bytes background_ssd_bytes = 0;   // SSD grant per node of their jobs
  Bytes background_keep_bytes = 0;  // kept per node at the end of each (up to the quota)
  uint32_t background_users = 100;  // their users, each with one dataset
  // Share of their jobs that rank ahead of the sweep whatever their submission time (fair share,
  // a QOS); the others rank by submission.
  double background_ahead = 0.5;
  std::vector<ScriptedJob> scripted_jobs;  // besides the random ones
  uint64_t seed = 0;
  uint32_t runs = 20;  // independent runs (seeds seed, seed + 1, ...), summed

  // Every field in range; the message names the field.
  Status Validate() const;
};

struct PlacementResult {
  Placement placement = Placement::kOff;
  uint32_t runs = 0;
  uint64_t starts = 0;       // sweep job starts over all runs, restarts after a requeue included
  uint64_t requeues = 0;     // starts that were requeued
  uint64_t warm_starts = 0;  // starts whose every node held some of the user's kept copy
  double first_epoch_pfs_bytes = 0;  // expected first-epoch PFS bytes, summed over the starts
  double cold_bytes = 0;             // starts x D: the same starts without any kept copy
  double wait_mean_seconds = 0;      // per start: from eligible (submitted, under the throttle,
  double wait_p95_seconds = 0;       //   or requeued) to start; p95 by nearest rank
  double sweep_mean_seconds = 0;     // from submission to the sweep's last end, mean of the runs
  double background_wait_mean_seconds = 0;  // other users' jobs submitted from time 0 on

  // 1 - first_epoch_pfs_bytes / cold_bytes.
  double SavedShare() const;
};

// Simulates each placement of `placements` over options.runs runs. Cost: O(events x (queue +
// the user's marked nodes)) per run, events about twice the jobs. Errors: InvalidArgument.
Result<std::vector<PlacementResult>> SimulatePlacement(const PlacementSimOptions& options,
                                                       std::span<const Placement> placements);

// What a sweep job's SSD tier holds per node: min(grant, D x (1 - (1 - 1/n)^E)), the distinct
// samples a node reads in E epochs when each epoch is a fresh permutation split among n nodes.
Bytes SweepTierBytes(const PlacementSimOptions& options);

}  // namespace nopfs::policy
