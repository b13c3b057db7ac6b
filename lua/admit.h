// The admin's admission policy: a Lua file defining `admit(job, node)`, asked at job start on
// every node of the allocation (by the SPANK plugin, as root) whether the job may have a cache
// and how large.
//
//   function admit(job, node)
//     if job.partition == "debug" then return nil, "no cache on the debug partition" end
//     return { ram = math.min(node.ram_free, size("32G")), ssd = node.ssd_free // 2 }
//   end
//
// `job` and `node` are read-only tables (fields of JobRequest and NodeState, plus node.ram_free
// and node.ssd_free; job.ram = 0 when the user asked for no particular size, job.memory = the
// job's memory allocation on the node, 0 when unknown). Every size a policy sees or returns is
// in MiB, as Slurm's --mem and the job_desc of Slurm's job_submit.lua: a Lua number, an integer
// when whole (job.memory is 4096 for --mem=4G); size("32G") converts a size to MiB (32768).
// The hook returns a table {ram = SIZE, ssd = SIZE} (sizes as numbers of MiB or strings like
// "20G"; a missing field means "what was asked for"), or nil/false and a reason to refuse. A policy
// file that defines no `admit` function is an error (failing closed, like any policy error);
// with no policy file at all the job gets what it asked for (RAM: half its memory allocation
// when that is known and nothing was asked). Either way the grant is then clamped to what was
// asked, the job's memory allocation (RAM), the config's per-job limits and what is free on the
// node, in that order; a node already running limits.jobs_per_node jobs refuses before the hook is
// asked.
//
// Each call runs in a fresh sandboxed state (lua/state.h), so a slow or broken policy cannot
// hang or crash the caller, and nothing carries over between jobs.
//
// Thread safety: Admit is reentrant.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "lua/config.h"
#include "lua/state.h"

namespace nopfs::lua {

// What the job asked for; strings are as Slurm reports them.
struct JobRequest {
  uint64_t job_id = 0;
  uint32_t uid = 0;
  uint32_t gid = 0;
  std::string user;
  std::string account;
  std::string partition;
  std::string qos;
  std::string dataset;    // the --nopfs=DATASET path
  uint32_t nodes = 1;     // nodes in the allocation
  policy::Bytes ram = 0;  // RAM tier bytes asked for on this node (0: as much as allowed)
  policy::Bytes ssd = 0;  // SSD tier bytes asked for (0: as much as allowed)
  // --nopfs-ram=0 / --nopfs-ssd=0: no tier of that kind, whatever the policy grants (the policy
  // sees job.ram = 0 / job.ssd = 0).
  bool no_ram = false;
  bool no_ssd = false;
  // The job's own memory allocation on this node (Slurm's --mem, or --mem-per-cpu times its CPUs
  // here); 0 when unknown or unlimited. When set, the RAM tier comes out of it: a job that asked
  // for no particular RAM gets half of it by default, and no grant ever exceeds it, so the
  // training processes keep their memory. The host's total memory never sizes a job's RAM tier.
  policy::Bytes memory = 0;
};

// The node as the caller sees it before this job.
struct NodeState {
  std::string name;
  policy::Bytes ram_total = 0;     // the config's RAM classes
  policy::Bytes ssd_total = 0;     // the config's SSD classes less the shared copies' quotas
  policy::Bytes ram_reserved = 0;  // held by other nopfs jobs now
  // Other jobs' reservations, and (from the prolog) what users left on the SSD that a live
  // process holds, which nothing can evict (kept/space.h HeldBytes).
  policy::Bytes ssd_reserved = 0;
  uint32_t jobs = 0;           // other nopfs jobs now
  policy::Bytes ssd_kept = 0;  // kept datasets of every user (evicted, least recently used
                               // first, when a job needs the space; ssd_free does not count them)
};

struct Admission {
  bool admitted = false;
  std::string reason;     // why refused, or what clamped the grant ("" when nothing did)
  policy::Bytes ram = 0;  // granted
  policy::Bytes ssd = 0;
};

// Runs the policy at `policy_path` ("" = no policy file: no opinion). An error in the policy
// (syntax, runtime, budget, a bad return value) is returned as a Status naming the file and line;
// the caller refuses the job with it (failing closed).
Result<Admission> Admit(const std::string& policy_path, const NodeConfig& config,
                        const JobRequest& job, const NodeState& node, const LuaLimits& limits = {});
// The same with the policy's text, named `name` in errors.
Result<Admission> AdmitWithPolicyText(std::string_view policy_text, std::string_view name,
                                      const NodeConfig& config, const JobRequest& job,
                                      const NodeState& node, const LuaLimits& limits = {});

// The keep hook of the same policy file: how much of a user's SSD tier may outlive its jobs on a
// node (the kept area, kept/area.h), asked at job start (the prolog) and by `nopfs gc`.
//
//   function keep(user, node)
//     if user.name == "guest" then return nil end            -- keeps nothing
//     return { quota = "200G", lifetime = "7d" }
//   end
//
// `user` has uid, gid and name; `node` is as for admit (gc asks with no reservations). `quota`
// is the user's kept bytes on this node (a size); `lifetime` (seconds, or a string "90s",
// "30m", "12h", "7d") how long a kept dataset lives after its last use (absent: until quota or
// space evicts it). A policy without a keep function, or a hook returning nil/false, keeps
// nothing: the default is that every job's SSD tier goes with it. Errors as for admit.
struct KeepUser {
  uint32_t uid = 0;
  uint32_t gid = 0;
  std::string name;
};
struct KeepGrant {
  policy::Bytes quota = 0;  // 0: nothing may be kept
  int64_t lifetime = 0;     // seconds after the last use; 0: no limit
};
Result<KeepGrant> Keep(const std::string& policy_path, const NodeConfig& config,
                       const KeepUser& user, const NodeState& node, const LuaLimits& limits = {});
Result<KeepGrant> KeepWithPolicyText(std::string_view policy_text, std::string_view name,
                                     const NodeConfig& config, const KeepUser& user,
                                     const NodeState& node, const LuaLimits& limits = {});
// The keep hook asked once per user for the users whose kept datasets root looks at on a node
// (the prolog, the epilog, `nopfs gc`); the user's gid and name come from the passwd database.
// A hook that fails for a user is noted in errors() and Failed(uid) is true: the caller then
// leaves that user's complete datasets alone (the grant returned has no quota limit and no
// lifetime) and lets the user's job keep nothing, so that a policy error neither wipes what
// users kept nor lets them keep more. Use from one thread.
class KeepGrants {
 public:
  // `policy`: the policy file ("" = none: nothing is kept); `node`: as the hook sees it.
  KeepGrants(std::string policy, const NodeConfig& config, NodeState node)
      : policy_(std::move(policy)), config_(config), node_(std::move(node)) {}
  KeepGrant For(uint32_t uid);
  bool Failed(uint32_t uid);
  const std::vector<std::string>& errors() const { return errors_; }

 private:
  std::string policy_;
  const NodeConfig& config_;
  NodeState node_;
  std::map<uint32_t, std::pair<KeepGrant, bool>> grants_;
  std::vector<std::string> errors_;
};

// "90", "90s", "30m", "12h", "7d" as seconds; InvalidArgument saying what to write otherwise.
Result<int64_t> ParseLifetime(std::string_view text);

}  // namespace nopfs::lua
