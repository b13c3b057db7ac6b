// nopfs-job's parts (nopfs_job.cc is the program): the job as its command line gives it, what
// Slurm and the job's secret tell about it (launcher_slurm.cc), the prolog (launcher_prolog.cc) and
// the epilog with the teardown both use (launcher_epilog.cc). Private to spank/.
#pragma once

#include <fcntl.h>
#include <grp.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

extern "C" {
#include <slurm/slurm.h>
#include <slurm/slurm_errno.h>
}

#include "common/units.h"
#include "common/version.h"
#include "kept/node.h"
#include "launch/daemon_args.h"
#include "launch/process.h"
#include "launch/run_files.h"
#include "lua/admit.h"
#include "lua/config.h"
#include "protocol/status_report.h"
#include "spank/hostlist.h"
#include "spank/job_cgroup.h"
#include "spank/job_files.h"
#include "spank/ledger.h"
#include "spank/options.h"
#include "spank/user_dirs.h"

namespace nopfs::spank::launcher {

using kept::AfterJob;
using kept::KeepJob;
using kept::KeepPlan;
using kept::NodeKept;

// The node index when it is not known (the epilog takes it from the ledger entry).
inline constexpr uint32_t kUnknownIndex = UINT32_MAX;

// The job as the plugin describes it on nopfs-job's command line (ParseCommandLine, nopfs_job.cc).
struct Job {
  std::string mode;
  uint64_t job_id = 0;
  std::string node;
  std::string nodelist;
  uint32_t node_index = 0;
  uint32_t nodes = 1;
  std::vector<std::string> names;  // the job's nodes, in node-list order
  uid_t uid = 0;
  gid_t gid = 0;
  std::string user;
  PluginArgs args;
  JobOptions opts;
  std::string run_dir;
  std::string node_dir;  // <rundir>/<node>, root-owned
  std::string ledger_dir;
};

// mkdir -p for root-owned directories: every component from "/" is checked (job_files.h
// MakeTrustedDir), so that no user can swap one for a link while root works below it.
Status EnsureRootDir(const std::string& path, mode_t mode);

// Slurm's view of the job: its account, partition, QOS, memory on this node and task layout.
struct SlurmJob {
  bool known = false;
  bool active = true;  // pending, running, suspended or completing
  std::string account, partition, qos;
  uint64_t memory = 0;  // bytes on this node; 0: unknown/unlimited
  TaskLayout layout;    // nodes 0: unknown
  std::string std_out;  // a batch job's output file, its name patterns expanded ("": none)
  // The job's --prefer and --constraint as slurmctld reports them: once the job runs, `features`
  // is what Slurm placed it by (its prefer when that could be met, else its constraint) and
  // `prefer` is empty. req_nodes: its --nodelist.
  std::string prefer, features, req_nodes;
  // Its AdminComment, which only root, SlurmUser and slurmctld's job_submit script set:
  // job_submit.lua notes there that it asked for the job's warm nodes (kPlacementAsked).
  std::string admin_comment;
};

SlurmJob QuerySlurm(uint64_t job_id, const std::string& node);

Result<lua::NodeConfig> LoadConfig(const Job& job);

// The SSD class paths of `config`: where the job's SSD directories are.
std::vector<std::string> SsdPaths(const lua::NodeConfig& config);

// Removes the job's SSD directory under each of `paths`.
Status RemoveSsd(const std::vector<std::string>& paths, uint64_t job_id, uid_t uid, uint32_t index);

// What a teardown needs, all of it recorded in root-owned state (the ledger entry) or given by
// Slurm; nothing from the node config nor from the user's files.
struct Target {
  uint64_t job_id = 0;
  uid_t uid = 0;
  uint32_t index = kUnknownIndex;  // the job's node index here; unknown: SSD not touched
  ProcessId daemon;                // pid 0: none recorded
  std::vector<std::string> ssd_paths;
  std::string metrics_dir;  // where the job's metrics file is; "": none
  std::string node;         // this node's name (the job's cgroup, job_cgroup.h); "": not touched
  // The keep grant (the ledger's): a killed nopfsd's keep records are kept within it.
  bool keep = false;
  uint64_t keep_max_bytes = 0;
  std::string keep_dataset;
};

Target FromEntry(const LedgerEntry& e);

// The ledger entry of `job_id`, if the ledger exists and has one.
std::optional<LedgerEntry> FindEntry(const std::string& ledger_dir, uint64_t job_id,
                                     std::string* error);

// Everything the epilog does for one job; also used on a stale ledger entry. Depends on nothing
// that can fail but the removals themselves: the process is the one the ledger names (pid and
// start time, never its command line), the run directory is reached through a checked walk of
// `node_dir`, the metrics file is the one in the directory the ledger recorded.
// With a keep grant, once nopfsd is gone, a kept entry is made from each SSD tier's keep record
// that nopfsd left (it was killed before it kept: kept/finish.h), before the tier is removed;
// what was kept is added to `notes` when given; the job's entries in the user's sibling registry
// (live/) are removed. `while_stopped` (if any) runs then too, before the run directory goes:
// the epilog reads the job's record there. Returns what is left (empty when nothing).
std::string Teardown(const std::string& node_dir, const Target& t, std::chrono::milliseconds grace,
                     const std::function<void()>& while_stopped = nullptr,
                     std::string* notes = nullptr);

// Writes <run dir>/<name> with `text` (a line), owned by the job's user.
void WriteStatus(const Job& job, const char* name, const std::string& text);

std::string LastLine(std::string text);

std::string DaemonPath(const Job& job, const char* self);

// The job's peer secret: HMAC-SHA256 under the site key (`peer_key`, a file only root may read)
// of the job id and the user id. Every node of the job derives the same 32 bytes without talking
// to the others; no other job and no user can derive it without the key.
Result<std::string> PeerSecret(const std::string& key_path, uint64_t job_id, uid_t uid);

// Where the job's peer ports start in peer_ports (spank/options.h PeerPort, which takes it modulo
// the number of ports): 24 bits of HMAC-SHA256 under the job's secret, so that only who can read
// the secret can compute them.
uint32_t PeerPortOffset(const std::string& secret);

// Sets the nopfsd arguments that make this node serve its peers, or leaves them unset (with the
// reason in *why) for a one-node job or a cluster without peer_key. *why warns when peer_ports
// reaches net.ipv4.ip_unprivileged_port_start (PeerPortsWarning), where any user can bind.
void SetPeers(const Job& job, launch::DaemonArgs* args, std::string* why);
uint32_t UnprivilegedPortStart();
// "; warning: peer_ports=... reaches net.ipv4.ip_unprivileged_port_start=N, ..." when the ranges
// reach this node's threshold; "" when every port is privileged here.
std::string PeerPortsWarning(const PluginArgs& args);

// The prolog line's words on the peer link once nopfsd said ready (`ready`, the user's process's
// words, shown printable): "peers: N nodes, listening on H:P; every other node answered ...", or
// why this node has no peer link or not every other node answered, with what the admin can do.
// In those two cases *for_job is the same for the job's `peers` file. Empty without peers.
std::string PeersOutcome(const Job& job, const launch::DaemonArgs& dargs,
                         const launch::ReadyInfo& ready, std::string* for_job);

// The ranks per node of nopfsd's plan, from the job's task layout (spank/options.h
// RanksPerNode). The answer goes to the job's tasks in <run dir>/layout: task_init sets
// NOPFS_RANKS_PER_NODE from it, or fails every task with the message.
Result<uint32_t> DecideRanksPerNode(const Job& job, const SlurmJob& sj);

// Asks the admission policy with the node's reservations (cleaning up after stale ones), and
// reserves what it grants in the ledger, under the ledger's lock. A refusal is an Admission
// that is not admitted; an error is a Status. *entry is the reservation written (naming this
// launcher until nopfsd runs); *keep what nopfsd may keep at exit.
Result<lua::Admission> Reserve(const Job& job, const lua::NodeConfig& config,
                               const lua::JobRequest& req, LedgerEntry* entry, KeepPlan* keep);

// nopfsd's arguments for this node of the job; *peers_note says how it reaches its peers.
launch::DaemonArgs DaemonArgsFor(const Job& job, uint32_t ranks_per_node, const lua::Admission& adm,
                                 const KeepPlan& keep, std::string* peers_note);

// Starts nopfsd as the job's user and waits until it says ready. A nopfsd with peers gets
// CAP_NET_BIND_SERVICE alone, as an ambient capability, for its peer port in the privileged range
// (it gives it up once bound). The ledger entry (`entry`, with the grant) is rewritten to name
// nopfsd as soon as it runs; nopfsd joins the cgroup whose cgroup.procs `cgroup_procs` is (-1:
// none) before exec. Returns nopfsd's pid and *said what it said ready with; on failure nopfsd
// is stopped and the Status says why.
Result<pid_t> StartNopfsd(const Job& job, const std::string& nopfsd, launch::DaemonArgs dargs,
                          LedgerEntry entry, int cgroup_procs, launch::ReadyInfo* said);

// The job's last summary from its nopfsd (launch::kSummaryName in its run directory below the
// trusted `node_dir`, read as the user's file: regular, the user's, size-capped, decoded by the
// wire format's checks). nullopt, with the reason in *why, when there is none or it is not one.
std::optional<report::StatusReport> ReadSummary(const std::string& node_dir, uint64_t job_id,
                                                uid_t uid, std::string* why);

// One line for slurmd's log and the job's output: where the samples came from, what was read
// from the PFS, the stall, the kept copy, the peers and the errors.
std::string DescribeSummary(const report::StatusReport& r);

// When the job's nopfsd staged data but the job read nothing through it: the warning, with what
// to change in the training script; "" otherwise.
std::string UnusedWarning(const report::StatusReport& r);

// Keeps the job's nopfsd log (launch::kLogName in its run directory, read as the user's file, at
// most kMaxKeptLogBytes) as <log_dir>/nopfsd-<job>-<node>.log: root's, mode 0640, readable by the
// job's user alone through a POSIX ACL (root's alone where the file system has none); removes
// the files there older than `days`. Returns what was done, for a line of slurmd's log.
inline constexpr size_t kMaxKeptLogBytes = 64 << 20;
std::string KeepJobLog(const Job& job, const std::string& log_dir, uint32_t days);

// Appends `text` to the batch job's output file `path` as the job's user: a child that becomes
// uid/gid first opens it (O_APPEND, never through a final link, a regular file only), so that
// root's rights never reach a path the user chose.
Status AppendAsUser(const std::string& path, uid_t uid, gid_t gid, const std::string& text);

// Shared datasets (launcher_share.cc): the node's share service, `nopfs-job share-serve`
// (share/server.h), run as root with CAP_DAC_READ_SEARCH alone; <node_dir>/share is its
// directory (lock, socket, log).
int ShareServe(int argc, char** argv);
// The plugin's arguments on the nopfs line of a plugstack.conf (nopfs_job.cc).
Result<std::vector<std::string>> PlugstackArgs(const std::string& path);
// The plugin's config= with its %n replaced by the node's name (nopfs_job.cc).
std::string NodeConfigPath(std::string config, const std::string& node);
std::string ShareDir(const std::string& node_dir);
// The service's socket, once it answers (started, detached, when it did not).
Result<std::string> EnsureShareService(const Job& job, const char* self);
// What placement did for the job on this node (docs/admin.md, "Placement"), for the prolog's line
// and the job's output: whether the job asked for its user's warm nodes (--prefer or
// --constraint holding its mark, or job_submit.lua's note in its AdminComment) and whether this
// node holds the user's kept copy of the dataset; a job that would have asked (not off, no
// --nodelist) and did not is told that slurmctld's side is not set up. "" when the node has no
// placement key, or the job neither asked nor would have.
std::string PlacementNote(const Job& job, const SlurmJob& sj, const lua::NodeConfig& config);

int Prolog(const Job& job, const char* self);

int Epilog(const Job& job);

}  // namespace nopfs::spank::launcher
