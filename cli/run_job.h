// `nopfs run`'s inside, shared by its files: the flags, the nodes it starts on this machine, and
// JobRun, one run's steps and the state they share. cmd_run.cc registers the command and holds
// the helpers, run_start.cc the steps up to the ranks (shape, identity, run directories, nopfsd
// started and waited for), run_ranks.cc the ranks and the end (summary, stop, what is left).
// Private to cli/.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "client/client.h"
#include "common/units.h"
#include "launch/daemon_args.h"
#include "launch/job_flags.h"
#include "launch/process.h"
#include "launch/run_files.h"
#include "launch/task_env.h"
#include "protocol/status_report.h"
#include "service/daemon/run_dir.h"

namespace nopfs::cli::run {

namespace fs = std::filesystem;
using launch::Child;
using launch::JobFlags;

struct RunFlags {
  JobFlags job;
  std::string dataset;
  std::string config;
  std::string run_dir;
  uint32_t node = 0;
  uint32_t nodes = 0;  // > 1: start every node of the job on this machine, serving each other
  std::string hosts;   // with nodes > 1: node n listens on the n-th (default 127.0.0.1 for all)
  std::string netns;   // node n's daemon and ranks run in the n-th network namespace (root)
  std::string user;    // as root: the user the daemons and ranks run as
  double start_timeout = 3600;  // seconds: a first scan of a large dataset takes a while
  double stop_timeout = 30;
  bool keep_run_dir = false;
  bool keep = false;            // nopfsd keeps the SSD tier's samples for the next run
  uint64_t keep_max_bytes = 0;  // 0: no limit
  bool share_running = true;    // sibling reads with this user's other runs on the dataset
  std::string job_id;           // "": nopfsd's default ("local")
  bool quiet = false;
  std::vector<std::string> command;
};

// The signal `nopfs run` received (0: none), forwarded to the ranks.
extern std::atomic<int> g_signal;
void OnSignal(int sig);

// A job id as the Slurm prolog passes it to nopfsd: a Slurm job id in decimal (1 to 2^64-1,
// without leading zeros). "" when `id` is one, else what is wrong and what to write.
std::string CheckJobId(const std::string& id);

int Fail(const std::string& msg);

// nopfsd beside nopfs (the build tree: both in <build>/bin), else where it is installed
// (<prefix>/sbin), else on PATH.
std::string DaemonPath();

std::string LogTail(const std::string& run_dir);

// A base port with `count` consecutive ports that this host can bind on 127.0.0.1 right now.
Result<uint16_t> FreePorts(uint32_t count);

// 32 random bytes in a new file of mode 0600: the job's peer secret.
Status WriteSecret(const std::string& path);

std::vector<std::string> SplitList(const std::string& list);

// One node of the job on this machine: its nopfsd and its ranks.
struct NodeRun {
  uint32_t node = 0;
  std::string host = "127.0.0.1";
  int netns_fd = -1;  // owned by the NodeRun
  int ready_fd = -1;  // the read end of nopfsd's ready pipe (launch/run_files.h), owned
  std::string run_dir;
  std::string socket;
  std::optional<Child> daemon;
  launch::ReadyInfo ready;
  std::optional<report::StatusReport> report;  // what the service saw, taken before it stops
  NodeRun() = default;
  NodeRun(NodeRun&& o) noexcept
      : node(o.node),
        host(std::move(o.host)),
        netns_fd(std::exchange(o.netns_fd, -1)),
        ready_fd(std::exchange(o.ready_fd, -1)),
        run_dir(std::move(o.run_dir)),
        socket(std::move(o.socket)),
        daemon(std::move(o.daemon)),
        ready(o.ready),
        report(std::move(o.report)) {}
  NodeRun& operator=(NodeRun&&) = delete;
  ~NodeRun() {
    if (netns_fd >= 0) ::close(netns_fd);
    if (ready_fd >= 0) ::close(ready_fd);
  }
};

// The processes' identity: as root, --user's (nopfsd never runs as root).
struct RunAs {
  bool switch_user = false;
  uid_t uid = 0;
  gid_t gid = 0;
  void Apply(Child::Options* o) const {
    o->switch_user = switch_user;
    o->uid = uid;
    o->gid = gid;
  }
};

// One `nopfs run`: its steps in order, each a method, and the state they share (a struct: the
// steps read and write it freely; nothing outside RunJob sees it). A step that fails prints
// nothing: Run() reports its Status (exit code 2).
struct JobRun {
  explicit JobRun(RunFlags& flags) : f(flags), job(flags.job.job) {}
  JobRun(const JobRun&) = delete;
  JobRun& operator=(const JobRun&) = delete;
  ~JobRun() {
    for (int fd : netns_fds)
      if (fd >= 0 && !handed_netns) ::close(fd);
  }

  int Run(bool ranks_per_node_given, bool ranks_given);

  // The job's shape from the flags (--nodes K --ranks-per-node L infer --ranks), checked; the
  // dataset's absolute path.
  Status Resolve(bool ranks_per_node_given, bool ranks_given);

  // --hosts, --netns and --user, checked before anything is created.
  Status CheckIdentity();

  // Hands a path this command made as root to --user: opened without following a symbolic link
  // (O_NONBLOCK: a FIFO put there does not block us), checked to be what was made (root's, a
  // directory or a regular file with one link) and changed through that descriptor, so that a
  // name the user swapped for a link to another file changes nothing but is refused. The run
  // directory itself is handed over last: until then the user cannot replace anything inside.
  Status Own(const std::string& path) const;

  // The run directories (one per node started here), the peers' ports and secret, nopfsd's
  // arguments.
  Status PrepareNodes();

  void InstallSignalHandlers();

  // Asks every nopfsd started so far to stop, and waits for it.
  void StopDaemons();

  // One nopfsd per node started here, each with a ready pipe.
  Status StartDaemons();

  // Every node's `ready` (or its `failed`, or its death, with the log's tail).
  Status WaitForDaemons();

  // One process per rank of each node, as srun would start them; waits for them all and
  // forwards a signal. Returns the first failing exit code, or 0.
  int RunRanks();

  // What each service saw, then stop them all; the summary; what is left behind.
  int Finish(int exit_code);

  RunFlags& f;
  const policy::JobSpec& job;
  fs::path dataset;
  bool made_run_dir = false;
  bool remove_run_dir = false;
  struct RemoveOnExit {
    std::string path;
    ~RemoveOnExit() {
      std::error_code ignored;
      if (!path.empty()) fs::remove_all(path, ignored);
    }
  } remove_on_exit;
  std::vector<std::string> hosts;
  std::vector<int> netns_fds;
  bool handed_netns = false;  // the NodeRuns own netns_fds
  RunAs as;
  std::vector<NodeRun> nodes;
  launch::DaemonArgs dargs;
  std::string secret;
  std::chrono::steady_clock::time_point start;
};

}  // namespace nopfs::cli::run
