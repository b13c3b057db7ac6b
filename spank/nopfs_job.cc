// nopfs-job: what the SPANK plugin runs as root on each node at job start and end, in its own
// process with a hard time limit (the plugin stays thin and never blocks Slurm).
//
//   nopfs-job prolog|epilog --job-id=J --node=NAME --nodelist=LIST --uid=U --gid=G --user=NAME
//             [key=value plugin arguments ...] [--nopfs=DATASET --nopfs-... job options]
//
// prolog: asks the admission policy, reserves the node's capacity in the ledger, creates the
// job's run directory (owned by the user, 0700), starts nopfsd as the user and waits until it is
// ready. It writes <run dir>/refused or <run dir>/failed when the job gets no cache, so that
// task_init can tell the job's tasks. Exit 0: serving; 3: refused; 4: nopfsd failed; 1: error.
// epilog: stops the job's nopfsd (TERM, KILL after the grace period), removes its SSD directory
// and run directory, releases the reservation, then looks again. Idempotent. Exit 0: nothing is
// left; 1: something is (named in the message).
// One line on stdout says what happened; the plugin logs it and shows it to the user.
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
#include <optional>
#include <string>
#include <thread>
#include <vector>

extern "C" {
#include <slurm/slurm.h>
#include <slurm/slurm_errno.h>
}

#include "common/units.h"
#include "launch/daemon_args.h"
#include "launch/process.h"
#include "launch/run_files.h"
#include "lua/admit.h"
#include "lua/config.h"
#include "spank/job_cgroup.h"
#include "spank/job_files.h"
#include "spank/ledger.h"
#include "spank/node_kept.h"
#include "spank/options.h"
#include "spank/user_dirs.h"

namespace nopfs::spank {
namespace {

using namespace std::chrono_literals;

constexpr uint32_t kUnknownIndex = UINT32_MAX;

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

Result<uint64_t> Number(std::string_view key, std::string_view v) {
  uint64_t n = 0;
  const auto r = std::from_chars(v.data(), v.data() + v.size(), n);
  if (v.empty() || r.ec != std::errc() || r.ptr != v.data() + v.size()) {
    return Status::InvalidArgument(std::string(key) + "=" + std::string(v) + ": not a number");
  }
  return n;
}

Result<Job> ParseCommandLine(int argc, char** argv) {
  if (argc < 2) return Status::InvalidArgument("usage: nopfs-job prolog|epilog --job-id=J ...");
  Job job;
  job.mode = argv[1];
  if (job.mode != "prolog" && job.mode != "epilog") {
    return Status::InvalidArgument("unknown mode '" + job.mode + "'; write prolog or epilog");
  }
  std::vector<std::string> plugin_args;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    const size_t eq = a.find('=');
    const std::string key = a.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : a.substr(eq + 1);
    if (key.rfind("--nopfs", 0) == 0) {
      NOPFS_RETURN_IF_ERROR(ApplyOption(&job.opts, key.substr(2), value));
    } else if (key == "--job-id" || key == "--uid" || key == "--gid") {
      Result<uint64_t> n = Number(key, value);
      if (!n.ok()) return n.status();
      if (key == "--job-id") job.job_id = *n;
      if (key == "--uid") job.uid = static_cast<uid_t>(*n);
      if (key == "--gid") job.gid = static_cast<gid_t>(*n);
    } else if (key == "--node") {
      job.node = value;
    } else if (key == "--nodelist") {
      job.nodelist = value;
    } else if (key == "--user") {
      job.user = value;
    } else if (key.rfind("--", 0) != 0) {
      plugin_args.push_back(a);
    } else {
      return Status::InvalidArgument("unknown argument " + a);
    }
  }
  Result<PluginArgs> pa = ParsePluginArgs(plugin_args);
  if (!pa.ok()) return pa.status();
  job.args = *pa;
  NOPFS_RETURN_IF_ERROR(CheckComponent("node name", job.node));
  if (job.job_id == 0) return Status::InvalidArgument("--job-id is missing");
  if (job.uid == 0) return Status::InvalidArgument("refusing a job of uid 0 (root)");
  if (job.user.empty()) {
    const passwd* pw = ::getpwuid(job.uid);
    if (pw != nullptr) job.user = pw->pw_name;
  }
  Result<std::vector<std::string>> names = ExpandHostlist(job.nodelist);
  Result<uint32_t> index = NodeIndex(job.nodelist, job.node);
  if (names.ok() && index.ok()) {
    job.nodes = static_cast<uint32_t>(names->size());
    job.node_index = *index;
    job.names = std::move(*names);
  } else if (job.mode == "prolog") {
    return !names.ok() ? names.status() : index.status();
  } else {
    job.node_index = kUnknownIndex;  // the epilog takes it from the ledger entry
  }
  job.node_dir = job.args.rundir + "/" + job.node;
  job.run_dir = RunDir(job.args.rundir, job.node, job.job_id);
  job.ledger_dir = job.node_dir + "/.ledger";
  return job;
}

// mkdir -p for root-owned directories: every component from "/" is checked (job_files.h
// MakeTrustedDir), so that no user can swap one for a link while root works below it.
Status EnsureRootDir(const std::string& path, mode_t mode) {
  Result<UniqueFd> fd = MakeTrustedDir(path, mode);
  if (!fd.ok()) return Status(fd.status().code(), "rundir: " + fd.status().message());
  return Status::Ok();
}

// Slurm's view of the job: its account, partition, QOS, memory on this node and task layout.
struct SlurmJob {
  bool known = false;
  bool active = true;  // pending, running, suspended or completing
  std::string account, partition, qos;
  uint64_t memory = 0;  // bytes on this node; 0: unknown/unlimited
  TaskLayout layout;    // nodes 0: unknown
};

SlurmJob QuerySlurm(uint64_t job_id, const std::string& node) {
  SlurmJob out;
  // libslurm exits the process when it finds no configuration: ask only when there is one.
  const char* conf = std::getenv("SLURM_CONF");
  if ((conf == nullptr || ::access(conf, R_OK) != 0) &&
      ::access("/etc/slurm/slurm.conf", R_OK) != 0) {
    return out;
  }
  job_info_msg_t* msg = nullptr;
  if (slurm_load_job(&msg, static_cast<uint32_t>(job_id), SHOW_DETAIL) != SLURM_SUCCESS) {
    // A purged job is gone; any other error (controller unreachable) counts as alive, so that
    // a reservation is never released on a guess.
    out.active = slurm_get_errno() != ESLURM_INVALID_JOB_ID;
    return out;
  }
  if (msg != nullptr && msg->record_count > 0) {
    const slurm_job_info_t& j = msg->job_array[0];
    out.known = true;
    const uint32_t base = j.job_state & JOB_STATE_BASE;
    out.active = base == JOB_PENDING || base == JOB_RUNNING || base == JOB_SUSPENDED ||
                 (j.job_state & JOB_COMPLETING) != 0;
    if (j.account != nullptr) out.account = j.account;
    if (j.partition != nullptr) out.partition = j.partition;
    if (j.qos != nullptr) out.qos = j.qos;
    uint64_t mb = j.pn_min_memory;
    if ((mb & MEM_PER_CPU) != 0) {
      mb &= ~MEM_PER_CPU;
      int cpus = j.job_resrcs != nullptr
                     ? slurm_job_cpus_allocated_on_node(j.job_resrcs, node.c_str())
                     : 0;
      if (cpus <= 0 && j.num_nodes != 0) cpus = static_cast<int>(j.num_cpus / j.num_nodes);
      mb *= static_cast<uint64_t>(cpus > 0 ? cpus : 1);
    }
    out.memory = mb * 1024 * 1024;  // Slurm's MB are MiB
    // A count the user did not ask for is 0 or NO_VAL (-n) and 0 or NO_VAL16
    // (--ntasks-per-node).
    out.layout.nodes = j.num_nodes;
    out.layout.tasks = j.num_tasks == NO_VAL ? 0 : j.num_tasks;
    out.layout.tasks_per_node =
        j.ntasks_per_node == NO_VAL16 || j.ntasks_per_node == INFINITE16 ? 0 : j.ntasks_per_node;
  }
  slurm_free_job_info_msg(msg);
  return out;
}

Result<lua::NodeConfig> LoadConfig(const Job& job) {
  if (job.args.config.empty()) return lua::DefaultNodeConfig(lua::HostMemoryBytes());
  return lua::LoadNodeConfig(job.args.config);
}

// The SSD class paths of `config`: where the job's SSD directories are.
std::vector<std::string> SsdPaths(const lua::NodeConfig& config) {
  std::vector<std::string> out;
  for (const policy::StorageClass& c : config.model().classes) {
    if (c.kind == policy::ClassKind::kSsd && !c.path.empty()) out.push_back(c.path);
  }
  return out;
}

// Removes the job's SSD directory under each of `paths`.
Status RemoveSsd(const std::vector<std::string>& paths, uint64_t job_id, uid_t uid,
                 uint32_t index) {
  Status first;
  for (const std::string& path : paths) {
    Status s = RemoveBelowUserDir(path, "nopfs-" + std::to_string(uid), uid,
                                  std::to_string(job_id) + "." + std::to_string(index));
    if (!s.ok() && first.ok()) first = s;
  }
  return first;
}

// What a teardown needs, all of it recorded in root-owned state (the ledger entry) or given by
// Slurm; nothing from the node config nor from the user's files.
struct Target {
  uint64_t job_id = 0;
  uid_t uid = 0;
  uint32_t index = kUnknownIndex;  // the job's node index here; unknown: SSD not touched
  ProcessId daemon;                // pid 0: none recorded
  std::vector<std::string> ssd_paths;
  std::string metrics_dir;  // where the job's metrics file is; "": none
};

Target FromEntry(const LedgerEntry& e) {
  Target t;
  t.job_id = e.job_id;
  t.uid = e.uid;
  t.index = e.node_index;
  t.daemon = {static_cast<pid_t>(e.pid), e.start_time};
  t.ssd_paths = e.ssd_paths;
  t.metrics_dir = e.metrics_dir;
  return t;
}

// The ledger entry of `job_id`, if the ledger exists and has one.
std::optional<LedgerEntry> FindEntry(const std::string& ledger_dir, uint64_t job_id,
                                     std::string* error) {
  struct stat st {};
  if (::lstat(ledger_dir.c_str(), &st) != 0) return std::nullopt;
  Result<Ledger> l = Ledger::Lock(ledger_dir, 30s);
  if (!l.ok()) {
    *error = l.status().message();
    return std::nullopt;
  }
  Result<std::vector<LedgerEntry>> entries = l->Entries();
  if (!entries.ok()) {
    *error = entries.status().message();
    return std::nullopt;
  }
  for (const LedgerEntry& e : *entries) {
    if (e.job_id == job_id) return e;
  }
  return std::nullopt;
}

// Everything the epilog does for one job; also used on a stale ledger entry. Depends on nothing
// that can fail but the removals themselves: the process is the one the ledger names (pid and
// start time, never its command line), the run directory is reached through a checked walk of
// `node_dir`, the metrics file is the one in the directory the ledger recorded.
// Returns what is left (empty when nothing).
std::string Teardown(const std::string& node_dir, const Target& t,
                     std::chrono::milliseconds grace) {
  const std::string& metrics_dir = t.metrics_dir;
  const std::string job = std::to_string(t.job_id);
  std::string left;
  if (t.daemon.pid > 0) {
    for (pid_t p : StopProcesses({t.daemon}, grace))
      left += " process " + std::to_string(p);
  }
  if (t.index != kUnknownIndex) {
    if (Status s = RemoveSsd(t.ssd_paths, t.job_id, t.uid, t.index); !s.ok()) {
      left += " " + s.message();
    }
  }
  Result<UniqueFd> dir = OpenTrustedDir(node_dir);
  if (!dir.ok()) {
    if (dir.status().code() != StatusCode::kNotFound)
      left += " run directory (" + dir.status().message() + ")";
  } else {
    if (Status s = RemoveBelowAt(dir->get(), job, node_dir + "/" + job); !s.ok()) {
      left += " " + s.message();
    }
    struct stat st {};
    if (::fstatat(dir->get(), job.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
      left += " " + node_dir + "/" + job;
    }
  }
  // The job's metrics file (docs/admin.md, "Metrics"), after nopfsd's last write.
  if (!metrics_dir.empty()) {
    const std::string prom = metrics_dir + "/" + launch::MetricsFileName(job);
    struct stat st {};
    if (::unlink(prom.c_str()) != 0 && errno != ENOENT) {
      left += " " + prom + " (" + std::strerror(errno) + ")";
    } else if (::lstat(prom.c_str(), &st) == 0) {
      left += " " + prom;
    }
  }
  // Look again (StopProcesses has looked at the process).
  if (t.index != kUnknownIndex) {
    for (const std::string& path : t.ssd_paths) {
      const std::string d =
          path + "/nopfs-" + std::to_string(t.uid) + "/" + job + "." + std::to_string(t.index);
      struct stat st {};
      if (::lstat(d.c_str(), &st) == 0) left += " " + d;
    }
  }
  return left;
}

// Writes <run dir>/<name> with `text` (a line), owned by the job's user.
void WriteStatus(const Job& job, const char* name, const std::string& text) {
  const bool line = !text.empty() && text.back() == '\n';
  (void)WriteFileAs(job.run_dir, name, line ? text : text + "\n", job.uid, job.gid);
}

std::string LastLine(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' '))
    text.pop_back();
  const size_t nl = text.rfind('\n');
  std::string line = nl == std::string::npos ? text : text.substr(nl + 1);
  return line.substr(0, 400);
}

std::string DaemonPath(const Job& job, const char* self) {
  if (!job.args.nopfsd.empty()) return job.args.nopfsd;
  std::string me = self;
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n > 0) me.assign(buf, static_cast<size_t>(n));
  const size_t slash = me.rfind('/');
  const std::string beside =
      (slash == std::string::npos ? std::string(".") : me.substr(0, slash)) + "/nopfsd";
  // The build tree has nopfsd beside nopfs-job; an installed nopfs-job (libexec) has it in sbin.
  if (::access(beside.c_str(), X_OK) == 0) return beside;
  return NOPFS_INSTALLED_NOPFSD;
}

// The job's peer secret: HMAC-SHA256 under the site key (`peer_key`, a file only root may read)
// of the job id and the user id. Every node of the job derives the same 32 bytes without talking
// to the others; no other job and no user can derive it without the key.
Result<std::string> PeerSecret(const std::string& key_path, uint64_t job_id, uid_t uid) {
  const int fd = ::open(key_path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "peer_key " + key_path);
  struct stat st {};
  std::string key(4096, '\0');
  ssize_t n = -1;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == 0 && (st.st_mode & 077) == 0) {
    n = ::read(fd, key.data(), key.size());
  }
  ::close(fd);
  if (n < 16) {
    return Status::InvalidArgument("peer_key " + key_path +
                                   ": must be a regular file of 16 to 4095 bytes owned by root "
                                   "with mode 0600 (create it with: head -c 32 /dev/urandom > " +
                                   key_path + "; chmod 600 " + key_path + ")");
  }
  key.resize(static_cast<size_t>(n));
  const std::string msg =
      "nopfs peer secret v1:" + std::to_string(job_id) + ":" + std::to_string(uid);
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out, &len) == nullptr) {
    return Status::Internal("HMAC-SHA256 failed");
  }
  return std::string(reinterpret_cast<const char*>(out), len);
}

// Where the job's peer ports start in the range (spank/options.h PeerPort): HMAC-SHA256 under
// the job's secret, so that only who can read the secret can compute them.
uint32_t PeerPortOffset(const std::string& secret) {
  constexpr std::string_view kLabel = "nopfs peer ports v1";
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
           reinterpret_cast<const unsigned char*>(kLabel.data()), kLabel.size(), out,
           &len) == nullptr ||
      len < 4) {
    return 0;
  }
  return (uint32_t{out[0]} | uint32_t{out[1]} << 8 | uint32_t{out[2]} << 16) % kPeerPortRange;
}

// Sets the nopfsd arguments that make this node serve its peers, or leaves them unset (with the
// reason in *why) for a one-node job or a cluster without peer_key.
void SetPeers(const Job& job, launch::DaemonArgs* args, std::string* why) {
  if (job.nodes < 2) return;
  if (job.args.peer_key.empty()) {
    *why = "no peers (peer_key is not set in plugstack.conf)";
    return;
  }
  Result<std::string> secret = PeerSecret(job.args.peer_key, job.job_id, job.uid);
  if (!secret.ok()) {
    *why = "no peers: " + secret.status().message();
    return;
  }
  if (Status s = WriteFileAs(job.run_dir, launch::kSecretName, *secret, job.uid, job.gid, 0600);
      !s.ok()) {
    *why = "no peers: " + s.message();
    return;
  }
  const std::vector<std::string> peers =
      PeerEndpoints(job.args, job.names, PeerPortOffset(*secret));
  std::string list;
  for (const std::string& p : peers)
    list += (list.empty() ? "" : ",") + p;
  *why = "peers: " + std::to_string(peers.size()) + " nodes, listening on " + peers[job.node_index];
  args->peer_listen = peers[job.node_index];
  args->peers = list;
  args->peer_secret_file = job.run_dir + "/" + launch::kSecretName;
}

// The ranks per node of nopfsd's plan, from the job's task layout (spank/options.h
// RanksPerNode). The answer goes to the job's tasks in <run dir>/layout: task_init sets
// NOPFS_RANKS_PER_NODE from it, or fails every task with the message.
Result<uint32_t> DecideRanksPerNode(const Job& job, const SlurmJob& sj) {
  Result<uint32_t> rpn = Status::Unavailable(
      "cannot ask slurmctld for the job's task layout; give --nopfs-ranks-per-node");
  if (sj.layout.nodes != 0) {
    rpn = RanksPerNode(sj.layout, job.opts);
  } else if (OptionGiven(job.opts, "nopfs-ranks-per-node")) {
    rpn = job.opts.ranks_per_node;
  }
  if (!rpn.ok()) {
    WriteStatus(job, launch::kLayoutName,
                launch::FormatLayoutError("nopfs: layout: " + rpn.status().message()));
    return rpn.status();
  }
  WriteStatus(job, launch::kLayoutName, launch::FormatLayout(*rpn));
  return rpn;
}

// Asks the admission policy with the node's reservations (cleaning up after stale ones), and
// reserves what it grants in the ledger, under the ledger's lock. A refusal is an Admission
// that is not admitted; an error is a Status. *entry is the reservation written (naming this
// launcher until nopfsd runs); *keep what nopfsd may keep at exit.
Result<lua::Admission> Reserve(const Job& job, const lua::NodeConfig& config,
                               const lua::JobRequest& req, LedgerEntry* entry, KeepPlan* keep) {
  lua::Admission adm;
  Result<Ledger> ledger = Ledger::Lock(job.ledger_dir, 30s);
  if (!ledger.ok()) return ledger.status();
  Result<std::vector<LedgerEntry>> entries = ledger->Entries();
  if (!entries.ok()) return entries.status();
  lua::NodeState ns;
  ns.name = job.node;
  ns.ram_total = config.CapacityOf(policy::ClassKind::kRam);
  ns.ssd_total = config.CapacityOf(policy::ClassKind::kSsd);
  const std::string boot = BootId();
  for (const LedgerEntry& e : *entries) {
    if (e.job_id == job.job_id) continue;
    // An entry of an earlier boot is stale; so is one whose job slurmctld reports over or
    // unknown, even if its process still lives (an epilog that could not finish). Only when
    // slurmctld cannot be asked is an entry kept (QuerySlurm says active then).
    const bool live = e.boot_id == boot && QuerySlurm(e.job_id, job.node).active;
    if (!live) {
      // Stale: its job is over and its epilog did not finish. Clean up after it.
      Target t = FromEntry(e);
      if (t.ssd_paths.empty()) t.ssd_paths = SsdPaths(config);
      if (t.metrics_dir.empty()) t.metrics_dir = config.metrics_dir();
      (void)Teardown(job.node_dir, t, 2s);
      (void)ledger->Remove(e.job_id);
      continue;
    }
    ns.ram_reserved += e.ram;
    ns.ssd_reserved += e.ssd;
    ++ns.jobs;
  }
  NodeKept kept(KeepJob{job.uid, job.opts.dataset, job.opts.keep, job.args.policy}, config,
                SsdPaths(config), &ns);
  Result<lua::Admission> a = lua::Admit(job.args.policy, config, req, ns);
  if (!a.ok()) {
    adm.admitted = false;
    adm.reason = "policy error: " + a.status().message();
  } else {
    adm = *a;
  }
  if (adm.admitted) {
    LedgerEntry& e = *entry;
    e.job_id = job.job_id;
    e.uid = job.uid;
    e.node_index = job.node_index;
    e.ram = adm.ram;
    e.ssd = adm.ssd;
    e.boot_id = boot;
    e.pid = ::getpid();
    e.start_time = ProcessStartTime(::getpid()).value_or(0);
    e.ssd_paths = SsdPaths(config);
    e.metrics_dir = config.metrics_dir();
    if (Status s = ledger->Put(e); !s.ok()) return s;
    *keep = kept.Admitted(ns, adm);
  }

  return adm;
}

// nopfsd's arguments for this node of the job; *peers_note says how it reaches its peers.
launch::DaemonArgs DaemonArgsFor(const Job& job, uint32_t ranks_per_node, const lua::Admission& adm,
                                 const KeepPlan& keep, std::string* peers_note) {
  launch::DaemonArgs dargs;
  dargs.run_dir = job.run_dir;
  dargs.dataset = job.opts.dataset;
  dargs.job.job.seed = job.opts.seed;
  dargs.job.job.epochs = job.opts.epochs;
  dargs.job.job.ranks = job.nodes * ranks_per_node;
  dargs.job.job.batch = job.opts.batch;
  dargs.job.job.drop_last = job.opts.drop_last;
  dargs.job.job.ranks_per_node = ranks_per_node;
  dargs.job.scheme = job.opts.scheme;
  dargs.node = job.node_index;
  dargs.job_id = std::to_string(job.job_id);
  dargs.ram = std::to_string(adm.ram);
  dargs.ssd = std::to_string(adm.ssd);
  dargs.config = job.args.config;
  dargs.keep = keep.keep;
  dargs.keep_max_bytes = keep.max_bytes;
  dargs.share_running = job.opts.share_running;
  SetPeers(job, &dargs, peers_note);
  // The nodes wait for each other at most half of the time nopfsd has to become ready.
  dargs.peer_startup_timeout_ms = static_cast<uint32_t>(
      std::min<uint64_t>(launch::kDefaultPeerStartupTimeoutMs, uint64_t{job.args.timeout} * 500));
  return dargs;
}

// Starts nopfsd as the job's user and waits until it says ready. The ledger entry (`entry`, with
// the grant) is rewritten to name nopfsd as soon as it runs. Returns nopfsd's pid; on failure
// nopfsd is stopped and the Status says why.
Result<pid_t> StartNopfsd(const Job& job, const std::string& nopfsd, launch::DaemonArgs dargs,
                          LedgerEntry entry) {
  // nopfsd says ready or failed on a pipe this launcher made (nopfsd --ready-fd), never through
  // a file in the user's run directory that the user could swap for a link or a FIFO.
  int ready_pipe[2];
  if (::pipe2(ready_pipe, O_CLOEXEC) != 0) return Status::FromErrno(errno, "pipe");
  const UniqueFd ready_in(ready_pipe[0]);
  // nopfsd runs as the user with the user's groups, in its own session, in the run directory,
  // with a clean environment; its output goes to nopfsd.out, created there as the user.
  dargs.ready_fd = ready_pipe[1];
  std::vector<std::string> argv = dargs.ToArgv();
  argv.insert(argv.begin(), nopfsd);
  const passwd* pw = ::getpwuid(job.uid);
  const std::string name = pw != nullptr ? pw->pw_name : job.user;
  launch::Child::Options o;
  o.clear_env = true;
  o.env = {{"PATH", "/usr/local/bin:/usr/bin:/bin"},
           {"HOME", pw != nullptr ? pw->pw_dir : "/"},
           {"USER", name},
           {"LOGNAME", name},
           {"LANG", "C.UTF-8"}};
  o.new_session = true;
  o.switch_user = true;
  o.uid = job.uid;
  o.gid = job.gid;
  Result<std::vector<gid_t>> groups = launch::GroupsOf(name, job.gid);
  if (groups.ok()) o.groups = std::move(*groups);
  o.cwd = job.run_dir;
  o.output_path = launch::kOutputName;
  const UniqueFd null_fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  o.stdin_fd = null_fd.get();
  o.keep_fds = {ready_pipe[1]};
  std::fflush(nullptr);
  Result<launch::Child> spawned =
      groups.ok() ? launch::Child::Spawn(argv, o) : Result<launch::Child>(groups.status());
  ::close(ready_pipe[1]);
  if (!spawned.ok()) return spawned.status();
  // nopfsd outlives this launcher: the ledger names it, the epilog stops it.
  const pid_t child = spawned->Release();
  // From here the reservation names nopfsd (by pid and start time, fixed at fork), so that an
  // epilog stops it even if this launcher is killed while nopfsd starts.
  const ProcessId daemon{child, ProcessStartTime(child).value_or(0)};
  if (Result<Ledger> l = Ledger::Lock(job.ledger_dir, 30s); l.ok()) {
    entry.pid = daemon.pid;
    entry.start_time = daemon.start_time;
    (void)l->Put(entry);
  }

  auto give_up = [&](const std::string& why) {
    (void)StopProcesses({daemon}, std::chrono::seconds(job.args.grace));
    ::waitpid(child, nullptr, WNOHANG);
    return Status::Unavailable(why);
  };
  Result<launch::ReadyInfo> ready = launch::WaitReady(
      ready_in.get(), std::chrono::steady_clock::now() + std::chrono::seconds(job.args.timeout),
      nullptr);
  if (ready.status().code() == StatusCode::kTimedOut) {
    return give_up("not ready within timeout=" + std::to_string(job.args.timeout) + " s");
  }
  if (ready.status().code() == StatusCode::kFailedPrecondition) {
    return give_up(Printable(ready.status().message()));
  }
  if (!ready.ok()) {
    // Closed without a word: nopfsd exited early (a bad argument, a crash). Its exit status and
    // the last line of its output say why; nopfsd.out is read with ReadUserFile (never a link
    // or a FIFO, only the user's own regular file).
    int status = 0;
    pid_t waited = 0;
    for (int i = 0; i < 40 && waited == 0; ++i) {
      waited = ::waitpid(child, &status, WNOHANG);
      if (waited == 0) std::this_thread::sleep_for(50ms);
    }
    std::string why = "closed its ready pipe without saying ready";
    if (waited == child) {
      why = WIFEXITED(status) ? "exited with status " + std::to_string(WEXITSTATUS(status))
                              : "killed by signal " + std::to_string(WTERMSIG(status));
    }
    Result<std::string> out =
        ReadUserFile(job.run_dir + "/" + launch::kOutputName, job.uid, 1 << 20);
    if (out.ok() && !LastLine(*out).empty()) why += ": " + Printable(LastLine(*out));
    return give_up(why);
  }
  return child;
}

int Prolog(const Job& job, const char* self) {
  const std::string where = "nopfs: prolog: " + job.node + ": ";
  auto fail = [&](const std::string& why, int code) {
    std::printf("%s%s\n", where.c_str(), why.c_str());
    return code;
  };
  if (job.opts.dataset.empty()) return fail("no --nopfs=DATASET given", 1);
  if (Status s = EnsureRootDir(job.node_dir, 0755); !s.ok()) return fail(s.message(), 1);
  Result<lua::NodeConfig> config = LoadConfig(job);
  if (!config.ok()) {
    // Tell the job too: it gets a run directory with the reason in `failed`.
    if (::mkdir(job.run_dir.c_str(), 0700) == 0 &&
        ::lchown(job.run_dir.c_str(), job.uid, job.gid) == 0) {
      WriteStatus(job, launch::kFailedName, where + "config: " + config.status().message());
    }
    return fail("config: " + config.status().message(), 1);
  }

  // A leftover of an earlier run of this job (a requeue) goes first.
  {
    std::string error;
    const std::optional<LedgerEntry> old = FindEntry(job.ledger_dir, job.job_id, &error);
    Target t = old ? FromEntry(*old) : Target{job.job_id, job.uid, job.node_index, {}, {}, {}};
    if (t.ssd_paths.empty()) t.ssd_paths = SsdPaths(*config);
    if (t.metrics_dir.empty()) t.metrics_dir = config->metrics_dir();
    (void)Teardown(job.node_dir, t, std::chrono::seconds(job.args.grace));
  }
  if (::mkdir(job.run_dir.c_str(), 0700) != 0 ||
      ::lchown(job.run_dir.c_str(), job.uid, job.gid) != 0) {
    return fail(Status::FromErrno(errno, "create " + job.run_dir).message(), 1);
  }
  for (const std::string& line : PrepareUserDirs(*config, job.uid, job.gid))
    std::printf("%suser directories: %s\n", where.c_str(), line.c_str());

  const SlurmJob sj = QuerySlurm(job.job_id, job.node);
  Result<uint32_t> ranks_per_node = DecideRanksPerNode(job, sj);
  if (!ranks_per_node.ok()) return fail("layout: " + ranks_per_node.status().message(), 3);
  lua::JobRequest req;
  req.job_id = job.job_id;
  req.uid = job.uid;
  req.gid = job.gid;
  req.user = job.user;
  req.account = sj.account;
  req.partition = sj.partition;
  req.qos = sj.qos;
  req.dataset = job.opts.dataset;
  req.nodes = job.nodes;
  req.ram = job.opts.ram;
  req.ssd = job.opts.ssd;
  req.memory = sj.memory;

  LedgerEntry entry;
  KeepPlan keep;
  Result<lua::Admission> admission = Reserve(job, *config, req, &entry, &keep);
  if (!admission.ok()) return fail(admission.status().message(), 1);
  const lua::Admission& adm = *admission;
  if (!adm.admitted) {
    const std::string msg = where + "refused: " + adm.reason;
    WriteStatus(job, launch::kRefusedName, msg);
    return fail("refused: " + adm.reason, 3);
  }

  std::string peers_note;
  const launch::DaemonArgs dargs = DaemonArgsFor(job, *ranks_per_node, adm, keep, &peers_note);
  const std::vector<std::string> ssd_paths = SsdPaths(*config);
  // Releases the reservation of a job that gets no cache after all.
  auto release = [&] {
    (void)RemoveSsd(ssd_paths, job.job_id, job.uid, job.node_index);
    if (!entry.metrics_dir.empty())
      (void)RemoveBelow(entry.metrics_dir, launch::MetricsFileName(dargs.job_id));
    if (Result<Ledger> l = Ledger::Lock(job.ledger_dir, 30s); l.ok()) {
      (void)l->Remove(job.job_id);
    }
  };
  // The metrics file's name is the user's before nopfsd starts: in the sticky metrics directory
  // another user could otherwise hold it and stand in for the job's figures (docs/security.md).
  if (!entry.metrics_dir.empty()) {
    if (Status s =
            ClaimFileAs(entry.metrics_dir, launch::MetricsFileName(dargs.job_id), job.uid, job.gid);
        !s.ok()) {
      std::printf("%smetrics: %s (the job goes on; nopfsd may not write its metrics)\n",
                  where.c_str(), s.message().c_str());
    }
  }
  Result<pid_t> started = StartNopfsd(job, DaemonPath(job, self), dargs, entry);
  if (!started.ok()) {
    WriteStatus(job, launch::kFailedName, where + started.status().message());
    release();
    return fail("nopfsd failed: " + started.status().message(), 4);
  }
  const pid_t child = *started;
  // Under cgroups nopfsd joins the job's extern step once slurmd has made it (after the prolog).
  if (SlurmContainsJobs())
    (void)AdoptLater(JobCgroupOptions{.node = job.node}, job.job_id, job.uid, child,
                     ProcessStartTime(child).value_or(0), std::chrono::seconds(job.args.timeout));
  std::printf("%sserving %s (partition %s, job memory %s) with RAM %s, SSD %s%s%s%s%s%s%s\n",
              where.c_str(), job.opts.dataset.c_str(),
              req.partition.empty() ? "?" : req.partition.c_str(),
              req.memory == 0 ? "unlimited" : FormatBytes(static_cast<double>(req.memory)).c_str(),
              FormatBytes(static_cast<double>(adm.ram)).c_str(),
              FormatBytes(static_cast<double>(adm.ssd)).c_str(), adm.reason.empty() ? "" : "; ",
              adm.reason.c_str(), peers_note.empty() ? "" : "; ", peers_note.c_str(),
              keep.note.empty() ? "" : "; ", keep.note.c_str());
  return 0;
}

int Epilog(const Job& job) {
  const std::string where = "nopfs: epilog: " + job.node + ": ";
  // Teardown depends on nothing that can fail: the ledger entry written at prolog time names
  // nopfsd, the node index and the SSD paths. The node config is only a fallback for the SSD
  // paths of an entry that has none; a config that no longer loads is reported, not obeyed.
  // The run directory and the ledger are reached only through a checked walk: a rundir that a
  // user could rename or replace is refused, never followed.
  if (Result<UniqueFd> dir = OpenTrustedDir(job.node_dir);
      !dir.ok() && dir.status().code() != StatusCode::kNotFound) {
    std::printf("%sleft behind: run directory, nopfsd and reservation, not looked at: %s\n",
                where.c_str(), dir.status().message().c_str());
    return 1;
  }
  std::string notes;
  std::string left;
  std::string error;
  const std::optional<LedgerEntry> entry = FindEntry(job.ledger_dir, job.job_id, &error);
  if (!error.empty()) left += " reservation (" + error + ")";
  Target t = entry ? FromEntry(*entry) : Target{job.job_id, job.uid, job.node_index, {}, {}, {}};
  if (t.ssd_paths.empty()) {
    if (Result<lua::NodeConfig> config = LoadConfig(job); config.ok()) {
      t.ssd_paths = SsdPaths(*config);
    } else if (entry) {
      // An entry without SSD paths was written by an older launcher; nothing else knows them.
      left += " SSD directory (config: " + config.status().message() + ")";
    } else {
      // No entry: the job was never admitted here, or its prolog released it after removing
      // the SSD directory, so there is none to remove.
      notes = "config: " + config.status().message() + "; ";
    }
  }
  // An unknown index means no entry (an entry has one) and a node list without this node: the
  // job was never admitted here, so it has no SSD directory here either.
  if (t.index == kUnknownIndex) t.ssd_paths.clear();
  // The metrics file's directory comes from the entry (no entry: nopfsd never ran here).
  left += Teardown(job.node_dir, t, std::chrono::seconds(job.args.grace));
  if (entry) {
    Result<Ledger> l = Ledger::Lock(job.ledger_dir, 30s);
    if (!l.ok()) {
      left += " reservation (" + l.status().message() + ")";
    } else if (Status s = l->Remove(job.job_id); !s.ok()) {
      left += " reservation (" + s.message() + ")";
    }
  }
  // nopfsd has kept what it kept: the user's quota and lifetimes apply to the user's kept
  // datasets now.
  if (entry && !t.ssd_paths.empty()) {
    if (Result<lua::NodeConfig> config = LoadConfig(job); config.ok()) {
      notes += AfterJob(job.args.policy, *config, job.node, t.ssd_paths, t.uid);
    }
  }
  if (!left.empty()) {
    std::printf("%s%sleft behind:%s\n", where.c_str(), notes.c_str(), left.c_str());
    return 1;
  }
  std::printf("%s%sclean\n", where.c_str(), notes.c_str());
  return 0;
}

}  // namespace
}  // namespace nopfs::spank

int main(int argc, char** argv) {
  using namespace nopfs::spank;
  ::umask(022);
  nopfs::Result<Job> job = ParseCommandLine(argc, argv);
  if (!job.ok()) {
    std::printf("nopfs: %s: %s\n", argc > 1 ? argv[1] : "nopfs-job",
                job.status().message().c_str());
    return 1;
  }
  const int rc = job->mode == "prolog" ? Prolog(*job, argv[0]) : Epilog(*job);
  std::fflush(stdout);
  return rc;
}
