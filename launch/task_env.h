// The NOPFS_* environment of a job's task: what `nopfs run` and the Slurm plugin's task_init give
// every training process, and what the client libraries read (python/nopfs/job.py, docs/user.md).
//
// Thread safety: reentrant.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace nopfs::launch {

struct TaskEnv {
  std::string socket;           // NOPFS_SOCKET; empty: this task has no service (and it is unset)
  std::string run_dir;          // NOPFS_RUN_DIR
  std::string dataset;          // NOPFS_DATASET
  uint32_t node = 0;            // NOPFS_NODE
  uint32_t nodes = 1;           // NOPFS_NODES
  uint32_t local_rank = 0;      // NOPFS_LOCAL_RANK: the task's index on its node
  uint32_t ranks = 1;           // NOPFS_RANKS (the last node may run fewer than ranks_per_node)
  uint32_t ranks_per_node = 1;  // NOPFS_RANKS_PER_NODE
  uint64_t seed = 0;            // NOPFS_SEED
  uint32_t epochs = 1;          // NOPFS_EPOCHS
  uint64_t batch = 1;           // NOPFS_BATCH
  std::string scheme;           // NOPFS_SCHEME
  bool drop_last = false;       // NOPFS_DROP_LAST: "1" or "0"
  uint64_t samples = 0;         // NOPFS_SAMPLES, the catalog's size; 0: unknown (unset)

  // NOPFS_RANK: node x ranks_per_node + local_rank.
  uint64_t rank() const { return uint64_t{node} * ranks_per_node + local_rank; }

  // The variables to set, name and value, in a fixed order. NOPFS_SOCKET and NOPFS_SAMPLES are
  // left out when empty or 0: a caller that inherits an environment unsets those
  // (kOptionalVariables).
  std::vector<std::pair<std::string, std::string>> Variables() const;
};

inline constexpr const char* kOptionalVariables[] = {"NOPFS_SOCKET", "NOPFS_SAMPLES"};

}  // namespace nopfs::launch
