// `nopfs simulate --placement`: the placement simulation (policy/placement_sim.h) for a cluster of
// one or more sizes, printed as a table, one `key=value` line per cluster size and placement
// (--format kv) or JSON. docs/simulate.md, "Placement", describes the model and the options.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "policy/job.h"
#include "policy/model.h"

namespace nopfs::cli {

struct PlacementFlags {
  bool placement = false;  // --placement: run this simulation instead of the epochs'
  std::string cluster_nodes = "256";
  std::string placements;  // empty: off,prefer,require
  uint32_t sweep_jobs = 32;
  uint32_t sweep_concurrency = 4;
  double job_hours = 2;
  double job_sigma = 0.5;
  double requeue = 0.1;
  std::string ssd;         // empty: the node config's SSD classes
  std::string job_ssd;     // empty: what the job's SSD tier holds
  std::string keep_quota;  // empty: a tenth of the SSD
  std::string keep_lifetime = "7d";
  double epilog_seconds = 30;
  std::string warm_nodes;
  double background_load = 0.8;
  uint32_t background_max_nodes = 0;  // 0: 16, or the cluster's nodes if fewer
  double background_hours = 4;
  double background_sigma = 1;
  std::string background_ssd;   // empty: a quarter of the SSD
  std::string background_keep;  // empty: the keep quota
  uint32_t background_users = 100;
  double background_ahead = 0.5;
  uint32_t runs = 20;
};

// Registers the placement options on `nopfs simulate`.
void AddPlacementOptions(CLI::App* sub, PlacementFlags* f);

// What the rest of `nopfs simulate` gives the placement simulation.
struct PlacementJob {
  uint32_t nodes = 1;  // --nodes: each sweep job's
  uint32_t epochs = 3;
  uint64_t seed = 0;
  policy::Bytes dataset_bytes = 0;
  const policy::SystemModel* model = nullptr;  // its SSD classes size --ssd by default
  std::string format;                          // table, kv or json
};

// Runs and prints; returns the exit code (2 on bad input, with the message on stderr).
int RunPlacement(const PlacementFlags& f, const PlacementJob& job);

}  // namespace nopfs::cli
