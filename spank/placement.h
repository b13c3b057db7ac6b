// Data-aware placement (docs/admin.md, "Placement"): while a node holds a user's kept copy of a
// dataset (kept/area.h), root marks the node in Slurm with a node feature, the copy's *mark*.
// A mark's name tells no one else whose copy it is or of which dataset: it is "nopfs_" and 16 hex
// digits of HMAC-SHA256, under the site's placement key, of the user's uid and the dataset's path.
// contrib/slurm/job_submit.lua, run by slurmctld (which holds the key too), computes the same
// name for a job submitted with --nopfs=DATASET and adds it to the job's --prefer (to its
// --constraint with --nopfs-placement=require), so that Slurm starts the job on the nodes that
// hold its copy when they are free. Two more things make a node warm: a running job whose tiers
// serve its user's other jobs on the dataset (the sibling link) gives the node that user's mark
// while it runs, and the share service's copy of a shared dataset (share/store.h), once it holds
// half of the dataset's quota, gives the node the dataset's shared mark, the same for every user,
// which job_submit.lua adds as an alternative to the user's own ("mark|shared").
//
// The node side is one reconcile, `nopfs-job placement`: the marks the node should carry (one per
// complete kept dataset of any user on its SSD paths within its keep lifetime, per running job
// with a sibling dataset in the ledger, per warm shared copy) against the features slurmctld has
// for the node; only nopfs's marks are added or removed, the admin's features stay. The prolog
// and the epilog start it in the background (PlacementLater) and never wait for it; a timer runs
// it too, so that a copy removed without a job (`nopfs cache rm`, `nopfs gc`) loses its mark
// within the timer's period, and a mark slurmctld forgot (a restart or `scontrol reconfigure`
// resets the features to slurm.conf's) comes back. The reconcile is rate-limited by its state
// file in <rundir>/<node>/ (PlacementState): it skips slurmctld while the marks are unchanged and
// were verified within kPlacementVerifySeconds, and for kPlacementRetrySeconds after slurmctld
// was slow or refused; it logs one line when the marks change, one when slurmctld starts failing
// (not one per attempt, and from the timer's runs only) and one when it takes them again.
//
// Thread safety: functions over values; ReconcilePlacement takes a file lock, so that two
// reconciles of one node never interleave (the second waits for the first, up to
// kPlacementLockWaitSeconds, then returns without a change).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace nopfs::spank {

inline constexpr std::string_view kMarkPrefix = "nopfs_";
inline constexpr size_t kMarkHexDigits = 16;
// job_submit.lua's note in a job's AdminComment when it added the job's mark ("=prefer" or
// "=require" follows): the prolog's evidence that the job asked, when Slurm could not meet it.
inline constexpr std::string_view kPlacementAsked = "nopfs_placement=";
inline constexpr int64_t kPlacementVerifySeconds = 60;
inline constexpr int64_t kPlacementRetrySeconds = 30;
inline constexpr int64_t kPlacementLockWaitSeconds = 30;  // for the run before this one
// The state file and its lock in <rundir>/<node>/ (root's).
inline constexpr char kPlacementStateName[] = ".placement";
inline constexpr char kPlacementLockName[] = ".placement.lock";

// The dataset path as a mark names it (LexicalPath): "/" and its components without empty and "."
// ones ("/pfs//ds/./" is "/pfs/ds"). A path through a link is another path: a job names the
// dataset as its kept copy's MANIFEST does (the canonical root, docs/user.md).
std::string MarkPath(std::string_view dataset);

// The placement key: a regular file of 16 to 4095 bytes, owned by root, readable by root alone,
// never reached through a link. The error says how to make one.
Result<std::string> ReadPlacementKey(const std::string& path);

// The mark of `uid`'s copies of `dataset`: "nopfs_" + the first 16 hex digits of
// HMAC-SHA256(key, "nopfs placement v1:<uid>:" + MarkPath(dataset)).
std::string PlacementMark(std::string_view key, uint32_t uid, std::string_view dataset);

// The mark of a shared dataset's copy (docs/admin.md, "Shared datasets"), the same for every
// user: "nopfs_" + the first 16 hex digits of HMAC-SHA256(key, "nopfs placement v1:shared:" +
// MarkPath(dataset)). A user's mark names a uid (decimal digits) where this one names "shared",
// so no user's mark is a shared one.
std::string SharedMark(std::string_view key, std::string_view dataset);

// A node's shared copy of a dataset carries the shared mark while it holds at least this share
// (percent) of the dataset's `ssd` quota (docs/algorithm.md, §9).
inline constexpr uint64_t kSharedWarmPercent = 50;

// A shared dataset the node config declares, and where the node's share service keeps its copy
// (share/server.h StoreDirOf).
struct SharedDataset {
  std::string dataset;
  std::string store_dir;
  uint64_t quota = 0;  // its `ssd`
};

// A job running on the node whose tiers serve its user's other jobs on its dataset (the ledger's
// sibling_dataset): the node carries that user's mark for the dataset while it runs.
struct RunningJob {
  uint64_t job_id = 0;
  uint32_t uid = 0;
  std::string dataset;
};
// The living jobs of the ledger in `ledger_dir` (this boot, their process alive) that have a
// sibling dataset; none when there is no ledger. Takes the ledger's lock for the read.
Result<std::vector<RunningJob>> RunningJobs(const std::string& ledger_dir);

// Whether a feature name has a mark's form.
bool IsPlacementMark(std::string_view feature);

// A node's features as slurmctld has them: comma-separated (AvailableFeatures, ActiveFeatures).
struct NodeFeatures {
  std::string available, active;
  bool operator==(const NodeFeatures&) const = default;
};

// `current` with its marks replaced by `marks`: the other features keep their order, the marks
// follow them sorted, in both lists.
NodeFeatures WithMarks(const NodeFeatures& current, const std::set<std::string>& marks);

// The marks a node carries: those of the complete kept datasets of every user under `ssd_paths`
// that have not expired, of the shared copies that hold at least kSharedWarmPercent of their
// quota, and of the running jobs whose tiers serve their user's other jobs. A copy expires as
// `nopfs gc` has it (kept/space.h): `lifetime(uid)` seconds (0: never) after its last use in
// root's record (kept/record.h, read without its lock: it is replaced whole); a copy root has no
// record of has not expired. Without `lifetime` nothing expires. `now`: unix seconds, 0:
// time(nullptr).
struct NodeMarks {
  struct Copy {
    uint32_t uid = 0;
    std::string dataset;  // as its MANIFEST says (the user's text)
    uint64_t bytes = 0;
    int64_t last_used = 0;  // unix seconds, as its MANIFEST says
    std::string mark;
    bool expired = false;  // past its lifetime: held (until gc removes it), not marked
  };
  std::vector<Copy> copies_held;  // every complete kept dataset, for the admin's listing
  struct Shared {
    std::string dataset;
    uint64_t files = 0, bytes = 0, quota = 0;
    bool warm = false;  // bytes >= kSharedWarmPercent of quota: the node carries `mark`
    std::string mark;
  };
  std::vector<Shared> shared_held;  // every declared shared dataset's copy here
  struct Running {
    uint64_t job_id = 0;
    uint32_t uid = 0;
    std::string dataset;
    std::string mark;
  };
  std::vector<Running> running_held;
  std::set<std::string> marks;
  size_t copies = 0;  // complete kept datasets (two SSD paths' copies of one dataset: one mark)
  std::set<std::string> kept_marks, shared_marks, running_marks;  // the marks by what made them
  std::vector<std::string> errors;
};
// What a shared copy's manifest said when it was last read, by the manifest's identity: a
// reconcile reads a manifest again only when it was replaced (the share service rewrites it
// while the copy changes, at most every 2 s), since one names every file of the copy (about 100
// bytes each). Keyed by store directory; kept in the state file between runs.
struct ManifestSeen {
  uint64_t ino = 0, size = 0;
  int64_t mtime_ns = 0;
  uint64_t files = 0, bytes = 0;
  bool operator==(const ManifestSeen&) const = default;
};
using ManifestCache = std::map<std::string, ManifestSeen>;

// `cache` (optional): what earlier runs read; on return, what this one used, for `shared` alone.
NodeMarks MarksOfNode(std::string_view key, const std::vector<std::string>& ssd_paths,
                      const std::function<int64_t(uint32_t uid)>& lifetime = nullptr,
                      int64_t now = 0, const std::vector<SharedDataset>& shared = {},
                      const std::vector<RunningJob>& running = {}, ManifestCache* cache = nullptr);

// One reconcile of a node's marks.
struct PlacementRun {
  std::string node;
  std::string node_dir;  // <rundir>/<node>, root's: the state file and its lock
  std::string key_path;
  std::vector<std::string> ssd_paths;
  std::vector<SharedDataset> shared;  // the node config's shared datasets
  std::string ledger_dir;             // the node's ledger (its running jobs); "": none
  int64_t now = 0;                    // unix seconds; 0: time(nullptr)
  bool force = false;                 // ask slurmctld whatever the state file says
  // Whether a failure gets its line here (the timer's runs), or only its time in the state file
  // (the runs the prolog and epilog start, whose lines would go to another log).
  bool report_failures = true;
  // Each user's keep lifetime in seconds, 0: none (the policy's keep hook); null: none expire.
  std::function<int64_t(uint32_t uid)> lifetime;
  // slurmctld's side (LoadNodeFeatures, UpdateNodeFeatures; tests give their own).
  std::function<Result<NodeFeatures>(const std::string& node)> load;
  std::function<Status(const std::string& node, const NodeFeatures& features)> update;
};
// Returns the line to log ("" when nothing worth one happened), of the form
// "placement: n2: marks 2 kept copies (1 added, 0 removed)", with ", 1 shared copy" and
// ", 1 running job" after "copies" when the node carries such marks.
std::string ReconcilePlacement(const PlacementRun& run);

// slurmctld's features of `node` (slurm_load_node_single), and their update (slurm_update_node,
// which takes it from root alone).
Result<NodeFeatures> LoadNodeFeatures(const std::string& node);
Status UpdateNodeFeatures(const std::string& node, const NodeFeatures& features);

// Runs `argv` (nopfs-job placement ...) in a detached grandchild: its own session, /dev/null for
// its standard descriptors, no other descriptor; returns once the middle process has exited
// (at once), never waiting for the reconcile.
void RunDetached(const std::vector<std::string>& argv);

}  // namespace nopfs::spank
