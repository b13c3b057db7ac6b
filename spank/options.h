// The values a user and an admin give the nopfs SPANK plugin, parsed and validated by pure
// functions that every context (sbatch, srun, slurmstepd, the job prolog and epilog, nopfs-job)
// runs again on its own, since each is a separate process.
//
// User options (sbatch/salloc/srun, docs/user.md):
//   --nopfs=DATASET            absolute path of the dataset directory; turns the cache on
//   --nopfs-seed=N             shuffle seed, 0 .. 2^64-1 (default 0)
//   --nopfs-epochs=N           1 .. 1000000 (default 1)
//   --nopfs-batch=N            global batch size, 1 .. 2^40 (default 1)
//   --nopfs-scheme=S           strided | uniform (default strided)
//   --nopfs-drop-last          drop the last incomplete batch of each epoch
//   --nopfs-ranks-per-node=N   training processes per node, 1 .. 4096 (default: the job's tasks
//                              per node, RanksPerNode)
//   --nopfs-ram=SIZE           RAM tier asked for on each node in the units of --mem (a bare
//                              number is MiB, K/M/G/T powers of 1024, common/units.h), e.g.
//                              16G; 0: no RAM tier; 1 .. 1M-1 bytes are refused (a slip of
//                              the unit) (default: policy's)
//   --nopfs-ssd=SIZE           SSD tier asked for on each node, likewise (default: policy's)
//   --nopfs-keep=yes|no        keep the SSD tier's samples on the node for the user's next job
//                              on the dataset (default yes: as much as the policy's keep allows)
//   --nopfs-share-running=yes|no  read through the user's other running jobs on the node and
//                              dataset, and serve them (default yes; docs/tiers.md "Sibling jobs")
//   --nopfs-placement=prefer|require|off  run on the nodes that hold the user's kept copy of the
//                              dataset (docs/admin.md, "Placement"): read by contrib/slurm's
//                              job_submit.lua at submission; checked here (default prefer)
// Every value is treated as hostile: bounded length, no control characters, numbers in range,
// sizes through ParseSize. Each error message says what to write instead.
//
// Plugin arguments (plugstack.conf, written by the admin): strict key=value, unknown keys are
// errors: config=FILE policy=FILE rundir=DIR on_refusal=fail|run launcher=PATH nopfsd=PATH
// timeout=SECONDS grace=SECONDS peer_key=FILE peer_ports=LOW-HIGH[,LOW-HIGH...] peer_host=ADDR
// placement_key=FILE (the site key of the nodes' placement marks, spank/placement.h).
// With peer_key, the nopfsd of a multi-node job serve each other (docs/fabric.md): each listens
// on PeerPort(), knows the others by PeerEndpoints(), and authenticates them with a per-job
// secret derived from the site key (docs/admin.md), from which its ports are derived too.
//
// Thread safety: pure functions over values.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace nopfs::spank {

// One user option: its name without the leading "--", whether it takes a value, its help text.
struct OptionInfo {
  const char* name;
  const char* arginfo;  // nullptr for a flag
  const char* usage;
};
// Every user option, in the order `sbatch --help` shows them.
const std::vector<OptionInfo>& UserOptions();

struct JobOptions {
  std::string dataset;  // empty: the job did not ask for nopfs
  uint64_t seed = 0;
  uint32_t epochs = 1;
  uint64_t batch = 1;
  std::string scheme = "strided";
  bool drop_last = false;
  uint32_t ranks_per_node = 1;
  uint64_t ram = 0;  // bytes asked for per node; 0: what the policy grants, or, when the option
  uint64_t ssd = 0;  // was given (--nopfs-ram=0), no tier of this kind
  bool keep = true;  // --nopfs-keep: false when the job asked to keep nothing
  bool share_running = true;         // --nopfs-share-running: false when the job reads alone
  std::string placement = "prefer";  // --nopfs-placement: prefer, require or off
  // Which options were given (bit i = UserOptions()[i]), so that a repeated option with a
  // different value is refused while the same value twice (Slurm calls back twice) is accepted.
  uint32_t given = 0;
};

// Applies option `name` ("nopfs", "nopfs-seed", ...) with `value` (ignored for flags) to *opts.
// InvalidArgument with a message of the form "--nopfs-seed=abc: <what>; write <instead>".
Status ApplyOption(JobOptions* opts, std::string_view name, std::string_view value);

// Checks the options together (e.g. a --nopfs-* option without --nopfs=DATASET, or uniform with a
// global batch smaller than the given ranks per node).
Status ValidateJob(const JobOptions& opts);

// Whether option `name` ("nopfs-ranks-per-node", ...) was given.
bool OptionGiven(const JobOptions& opts, std::string_view name);

// A job's task layout as slurmctld reports it (slurm_load_job).
struct TaskLayout {
  uint32_t nodes = 0;           // the allocation's nodes
  uint32_t tasks = 0;           // -n; 0: not asked for (srun then starts one task a node)
  uint32_t tasks_per_node = 0;  // --ntasks-per-node; 0: not given
};
// The job's ranks per node: its tasks per node (one training process a task), or
// --nopfs-ranks-per-node when given, which must equal the tasks per node or be a multiple of it
// (a launcher such as torchrun starts the other processes of each task). InvalidArgument, with
// what to write instead, for a layout whose nodes do not all run the same number of tasks
// (-n3 -N2) and for a --nopfs-ranks-per-node that disagrees with the tasks per node.
Result<uint32_t> RanksPerNode(const TaskLayout& layout, const JobOptions& opts);

// The options as "--name=value" arguments (for nopfs-job), which ApplyOption reads back.
std::vector<std::string> ToArgs(const JobOptions& opts);

enum class OnRefusal { kFail, kRun };

// A range of TCP ports, both ends included.
struct PortRange {
  uint16_t low = 0;
  uint16_t high = 0;
  bool operator==(const PortRange&) const = default;
};
// The default peer ports: privileged (below net.ipv4.ip_unprivileged_port_start, 1024 unless an
// admin changed it), so that only root and nopfsd, which nopfs-job starts with
// CAP_NET_BIND_SERVICE alone, can bind them; above 599, below the ports of the common services
// (ssh 22, smtp 25, rpcbind 111, https 443, ...); below 988, Lustre's LNet acceptor (which listens
// on every Lustre client) and the TLS ports of mail and FTP (989..995). docs/admin.md, "Peers".
inline constexpr PortRange kDefaultPeerPorts{600, 987};

struct PluginArgs {
  std::string config;                 // node config (lua/config.h); empty: built-in defaults
  std::string policy;                 // admission policy (lua/admit.h); empty: none
  std::string rundir = "/run/nopfs";  // base; a job's run dir is <rundir>/<node>/<jobid>
  OnRefusal on_refusal = OnRefusal::kFail;
  std::string launcher;    // nopfs-job; empty: beside the plugin's install prefix
  std::string nopfsd;      // nopfsd; empty: beside nopfs-job
  uint32_t timeout = 300;  // seconds nopfsd may take to become ready
  uint32_t grace = 10;     // seconds between SIGTERM and SIGKILL in the epilog
  std::string peer_key;    // site key (root-owned, 0600); empty: nodes do not serve each other
  std::vector<PortRange> peer_ports{kDefaultPeerPorts};  // ascending, disjoint, not empty
  std::string peer_host;      // every node's peer address (a one-host test cluster); empty: the
                              // node names of the job's node list
  std::string placement_key;  // site key of the placement marks (root-owned, 0600); empty: the
                              // node advertises no kept copies to Slurm
};

// Parses plugstack.conf's arguments for this plugin.
Result<PluginArgs> ParsePluginArgs(const std::vector<std::string>& args);
// The same arguments back as key=value strings (for nopfs-job).
std::vector<std::string> ToArgs(const PluginArgs& args);

// A job's node list is expanded by libslurm: spank/hostlist.h.

// The peer ports of a job lie in `ranges` (PluginArgs::peer_ports, N ports in all): node i of
// the job listens on the ((offset + i) mod N)-th of them, where `offset` comes from the job's peer
// secret (PeerPortOffset in nopfs-job), which only root and the job's user can read. So another
// user can neither predict a job's ports nor, as they are privileged, bind them; the nodes of one
// job never collide even when they share a host (peer_host), up to N nodes; two jobs on one node
// collide with probability about (their nodes) / N, and the second then runs without peers (its
// prolog line and the job's output say which port was taken).
uint32_t PortCount(const std::vector<PortRange>& ranges);
uint16_t PeerPort(const std::vector<PortRange>& ranges, uint32_t offset, uint32_t node_index);
// "600-987" or "600-630,640-987": what peer_ports= reads back.
std::string FormatPortRanges(const std::vector<PortRange>& ranges);
// "host:port" of every node of the job, in node-list order.
std::vector<std::string> PeerEndpoints(const PluginArgs& args,
                                       const std::vector<std::string>& nodes, uint32_t offset);

// <rundir>/<node>/<jobid>.
std::string RunDir(const std::string& rundir, std::string_view node, uint64_t job_id);

// Checks a name used as one path component (node names, user names): 1..255 characters of
// letters, digits, '.', '_', '-', not starting with '.'.
Status CheckComponent(std::string_view what, std::string_view name);

}  // namespace nopfs::spank
