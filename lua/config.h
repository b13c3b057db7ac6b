// NodeConfig: what the admin says about a node, read from a Lua file (docs/config.md).
//
// The file is a sandboxed Lua script (lua/state.h) that sets globals:
//   classes  = { ram { capacity = "20G", threads = 4 }, ssd { path = "/scratch", ... } }
//   staging  = { capacity = "1G", threads = 4, write = ... }
//   pfs      = { {1, "250M/s"}, {16, "2G/s"} }        -- readers -> aggregate bandwidth
//   network  = "10G/s"
//   limits   = { jobs_per_node = 8, ram_per_job = "64G", ssd_per_job = "1T",
//                streams_per_rank = 32 }
// Sizes and bandwidths are written as Slurm's --mem (common/units.h): a number, in a string or
// not, is MiB (MiB/s); K, M, G, T are powers of 1024 ("GB" is the same as "G").
//   log_level, catalog_cache, preprocess, metrics_dir
//   shared   = { { path = "/pfs/imagenet", ssd = "200G" } }  -- one copy per node for all users
//   planner  = "frequency"                             -- or "staging", "fill-once"
//   verify   = "on_fill"                               -- or "always": RAM hits re-hashed
// Unknown globals that look like misspellings of these and unknown fields are errors, so a typo
// never silently falls back to a default. Every error names the file, and the line where the
// class was written when it was made with ram{} or ssd{}.
//
// Thread safety: NodeConfig is a value; the loaders are reentrant.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "lua/state.h"
#include "policy/model.h"
#include "policy/plan.h"

namespace nopfs::lua {

// Hard caps the admin puts on every job of the node; 0 means no cap.
struct Limits {
  uint32_t jobs_per_node = 0;     // nopfs jobs at once on this node
  policy::Bytes ram_per_job = 0;  // bytes of RAM tier one job may hold on this node
  policy::Bytes ssd_per_job = 0;  // bytes of SSD tier one job may hold on this node
  // Streams one rank may have open at once in nopfsd (one per DataLoader worker); each holds a
  // ring and staging threads, so this bounds what a job's clients can make nopfsd allocate. 32:
  // one worker per core of a common training node, and torchvision's reference scripts' 16.
  uint32_t streams_per_rank = 32;
};

// When a RAM tier's bytes are checked against the xxh3 recorded at fill (docs/tiers.md). Fills,
// SSD reads and peer reads are always checked.
// A dataset the node keeps one copy of for every user allowed to read it (docs/admin.md, "Shared
// datasets"): its directory and the bytes of SSD its copy may take on the node.
struct SharedDecl {
  std::string path;
  uint64_t ssd = 0;
};

enum class RamVerify {
  kOnFill,  // at fill only; a hit is served as it lies in the sealed memfd
  kAlways,  // also at every hit (in place, or the copy-out)
};
std::string_view RamVerifyName(RamVerify v);

class NodeConfig {
 public:
  // Where it came from: the file's path, or "built-in defaults".
  const std::string& source() const { return source_; }
  // The storage classes (fastest first), staging, PFS curve and network of the model.
  const policy::SystemModel& model() const { return model_; }
  policy::SystemModel& mutable_model() { return model_; }
  const Limits& limits() const { return limits_; }
  // spdlog level name for nopfsd: trace, debug, info, warn, error, critical, off.
  const std::string& log_level() const { return log_level_; }
  // Directory where scanned dataset catalogs are kept for later jobs; empty: no reuse.
  const std::string& catalog_cache() const { return catalog_cache_; }
  // node_exporter's textfile directory where nopfsd writes nopfs_<job>.prom; empty: no metrics.
  const std::string& metrics_dir() const { return metrics_dir_; }
  // Where the epilog keeps each job's nopfsd log (`job_logs.dir`, root's; empty: not kept) and
  // for how many days (`job_logs.days`).
  const std::string& job_log_dir() const { return job_log_dir_; }
  uint32_t job_log_days() const { return job_log_days_; }
  // Which samples the node's classes hold (policy/plan.h); frequency unless the file says.
  policy::Planner planner() const { return planner_; }
  // When RAM tier hits are verified (`verify`).
  RamVerify ram_verify() const { return ram_verify_; }

  // The shared datasets (`shared`), and where their copies are: <first SSD class's
  // path>/.nopfs-shared.
  const std::vector<SharedDecl>& shared() const { return shared_; }
  std::string shared_store_dir() const;

  // Sum of the capacities of the classes of `kind`.
  policy::Bytes CapacityOf(policy::ClassKind kind) const;
  // The SSD a node offers jobs (the policy's node.ssd_total): the SSD classes' capacities less
  // every shared dataset's `ssd`, the quota its copy may take on the first SSD class.
  policy::Bytes SsdForJobs() const;

 private:
  friend Result<NodeConfig> LoadNodeConfigFromString(std::string_view, std::string_view,
                                                     policy::Bytes, const LuaLimits&);
  friend NodeConfig DefaultNodeConfig(policy::Bytes);

  std::string source_;
  policy::SystemModel model_;
  Limits limits_;
  std::string log_level_ = "info";
  std::string catalog_cache_;
  std::string metrics_dir_;
  std::string job_log_dir_;
  uint32_t job_log_days_ = 14;
  policy::Planner planner_ = policy::Planner::kFrequency;
  RamVerify ram_verify_ = RamVerify::kOnFill;
  std::vector<SharedDecl> shared_;
};

// This host's physical memory in bytes (sysconf), for RAM capacities written as "25%".
policy::Bytes HostMemoryBytes();

// Loads `path`; a RAM capacity written as a percentage is taken of `host_memory`.
Result<NodeConfig> LoadNodeConfig(const std::string& path,
                                  policy::Bytes host_memory = HostMemoryBytes(),
                                  const LuaLimits& limits = {});
// The same from text, named `name` in errors.
Result<NodeConfig> LoadNodeConfigFromString(std::string_view text, std::string_view name,
                                            policy::Bytes host_memory = HostMemoryBytes(),
                                            const LuaLimits& limits = {});

// No file: one RAM class of 1/8 of `host_memory`, no SSD, the default bandwidth tables
// (docs/config.md lists them), no network (a single node's view).
NodeConfig DefaultNodeConfig(policy::Bytes host_memory);

}  // namespace nopfs::lua
