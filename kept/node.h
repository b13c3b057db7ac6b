// The kept datasets of a node as nopfs-job sees them around a job (docs/admin.md, "Kept
// datasets"): the prolog's removal of incomplete, expired and over-quota entries of every user,
// its eviction of the least recently used for the admitted job's SSD, and its decision of what
// the job's nopfsd may keep at exit; the epilog's quota and lifetime after nopfsd kept. Runs as
// root; every listing and removal goes through KeptNode (descriptors, no link followed).
//
// Thread safety: use from one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kept/space.h"
#include "lua/admit.h"
#include "lua/config.h"

namespace nopfs::kept {

// What the job's nopfsd may keep at exit.
struct KeepPlan {
  bool keep = false;       // nopfsd --keep
  uint64_t max_bytes = 0;  // --keep-max-bytes
  std::string note;        // what was decided and removed, for the prolog's line ("": nothing)
};

// The job as far as keeping goes.
struct KeepJob {
  uint32_t uid = 0;
  std::string dataset;  // --nopfs=
  bool keep = true;     // --nopfs-keep
  std::string policy;   // the policy file ("": none, nothing is kept)
};

// A job the ledger holds on this node: its SSD directories (<job>.<index>) count in its
// reservation, not among the kept bytes, and are never removed as strays.
struct LiveJob {
  uint32_t uid = 0;
  uint64_t job_id = 0;
  uint32_t index = 0;
};

class NodeKept {
 public:
  // Lists everything every user has under `ssd_paths` but the directories of `live` jobs
  // (root's view, kept/space.h), removes strays and incomplete, expired and over-quota datasets
  // (the policy's keep hook, asked about `node` with ssd_kept set), and sets ns->ssd_kept to
  // the removable kept bytes left and adds what is in use (HeldBytes, which nothing evicts) to
  // ns->ssd_reserved.
  NodeKept(KeepJob job, const lua::NodeConfig& config, const std::vector<std::string>& ssd_paths,
           const std::vector<LiveJob>& live, lua::NodeState* ns);
  // Once the job is admitted with `adm` (ns: the node before it): removes the least recently
  // used datasets of any user until the kept bytes fit beside ns.ssd_reserved and adm.ssd (the
  // job's user's kept copies of its dataset count within the grant: the job adopts them), and
  // decides what the job keeps: nothing with --nopfs-keep=no, a failing or absent keep hook, no
  // quota or no SSD grant; else at most min(quota, SSD grant).
  KeepPlan Admitted(const lua::NodeState& ns, const lua::Admission& adm);

 private:
  lua::NodeState WithKept(lua::NodeState ns) const;
  KeepJob job_;
  KeptNode kept_;
  lua::KeepGrants grants_;
  std::vector<Removal> removed_;
};

// The epilog's part, after the job's nopfsd has stopped: the job used the user's kept datasets of
// `dataset` (adopted or kept them: their last use in root's record is now), then the user's
// strays, quota and lifetimes apply to everything the user has under `ssd_paths` but the
// directories of `live` jobs. Returns what to add to the epilog's line ("kept ...; kept datasets
// removed: ...; "), "" when the user has nothing there.
std::string AfterJob(const std::string& policy, const lua::NodeConfig& config,
                     const std::string& node, const std::vector<std::string>& ssd_paths,
                     uint32_t uid, const std::string& dataset, const std::vector<LiveJob>& live);

// ScanOptions::live for `live`.
std::function<bool(uint32_t, const std::string&)> LiveDirs(std::vector<LiveJob> live);

}  // namespace nopfs::kept
