#include "cli/cmd_run.h"

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
#include "client/status_report.h"
#include "common/units.h"
#include "launch/daemon_args.h"
#include "launch/job_flags.h"
#include "launch/process.h"
#include "launch/run_files.h"
#include "launch/task_env.h"
#include "service/daemon/run_dir.h"

namespace nopfs::cli {

using launch::AddJobFlags;
using launch::Child;
using launch::DescribeWaitStatus;
using launch::ExitCodeOf;
using launch::FinishJobFlags;
using launch::JobFlags;

namespace {

namespace fs = std::filesystem;

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

std::atomic<int> g_signal{0};
void OnSignal(int sig) {
  g_signal.store(sig);
}

// A job id as the Slurm prolog passes it to nopfsd: a Slurm job id in decimal (1 to 2^64-1,
// without leading zeros). "" when `id` is one, else what is wrong and what to write.
std::string CheckJobId(const std::string& id) {
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(id.data(), id.data() + id.size(), v);
  if (!id.empty() && ec == std::errc() && end == id.data() + id.size() && v != 0 && id[0] != '0') {
    return std::string();
  }
  // The value as given, cut short and with anything unprintable shown as '?'.
  std::string shown;
  for (size_t i = 0; i < id.size() && i < 64; ++i)
    shown += std::isprint(static_cast<unsigned char>(id[i])) ? id[i] : '?';
  return "\"" + shown + (id.size() > 64 ? "..." : "") +
         "\" is not a job id: write a Slurm job id, a decimal number from 1 to " +
         std::to_string(UINT64_MAX) + " without leading zeros (e.g. --job-id 4242)";
}

int Fail(const std::string& msg) {
  std::fprintf(stderr, "nopfs run: %s\n", msg.c_str());
  return 2;
}

// nopfsd beside nopfs (the build tree: both in <build>/bin), else where it is installed
// (<prefix>/sbin), else on PATH.
std::string DaemonPath() {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path beside = self.parent_path() / "nopfsd";
    if (access(beside.c_str(), X_OK) == 0) return beside.string();
  }
  if (access(NOPFS_INSTALLED_NOPFSD, X_OK) == 0) return NOPFS_INSTALLED_NOPFSD;
  return "nopfsd";
}

std::string LogTail(const std::string& run_dir) {
  std::ifstream in(run_dir + "/" + launch::kLogName);
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    lines.push_back(line);
    if (lines.size() > 20) lines.erase(lines.begin());
  }
  std::string out;
  for (const std::string& l : lines)
    out += "  " + l + "\n";
  return out;
}

// A base port with `count` consecutive ports that this host can bind on 127.0.0.1 right now.
Result<uint16_t> FreePorts(uint32_t count) {
  for (int attempt = 0; attempt < 64; ++attempt) {
    const int probe = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (probe < 0) return Status::FromErrno(errno, "socket");
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    const bool got = ::bind(probe, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                     ::getsockname(probe, reinterpret_cast<sockaddr*>(&a), &len) == 0;
    ::close(probe);
    if (!got) continue;
    const uint32_t base = ntohs(a.sin_port);
    if (base + count > 65535) continue;
    bool free = true;
    for (uint32_t p = base; p < base + count && free; ++p) {
      const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in b{};
      b.sin_family = AF_INET;
      b.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      b.sin_port = htons(static_cast<uint16_t>(p));
      free = s >= 0 && ::bind(s, reinterpret_cast<sockaddr*>(&b), sizeof b) == 0;
      if (s >= 0) ::close(s);
    }
    if (free) return static_cast<uint16_t>(base);
  }
  return Status::Unavailable("no free range of " + std::to_string(count) + " local ports");
}

// 32 random bytes in a new file of mode 0600: the job's peer secret.
Status WriteSecret(const std::string& path) {
  std::array<unsigned char, 32> key{};
  if (::getrandom(key.data(), key.size(), 0) != static_cast<ssize_t>(key.size())) {
    return Status::FromErrno(errno, "getrandom");
  }
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return Status::FromErrno(errno, "create " + path);
  const bool ok = ::write(fd, key.data(), key.size()) == static_cast<ssize_t>(key.size());
  ::close(fd);
  return ok ? Status::Ok() : Status::FromErrno(errno, "write " + path);
}

std::vector<std::string> SplitList(const std::string& list) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(list);
  while (std::getline(in, item, ','))
    out.push_back(item);
  return out;
}

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

  int Run(bool ranks_per_node_given, bool ranks_given) {
    if (Status s = Resolve(ranks_per_node_given, ranks_given); !s.ok()) return Fail(s.message());
    if (Status s = CheckIdentity(); !s.ok()) return Fail(s.message());
    // From here on, every way out (a failed start included) removes the run directory this
    // command made, unless --keep-run-dir: a failure quotes the log's tail in its message.
    remove_run_dir = made_run_dir && !f.keep_run_dir;
    remove_on_exit.path = remove_run_dir ? f.run_dir : std::string();
    if (Status s = PrepareNodes(); !s.ok()) return Fail(s.message());
    InstallSignalHandlers();
    if (Status s = StartDaemons(); !s.ok()) {
      StopDaemons();
      return Fail(s.message());
    }
    if (Status s = WaitForDaemons(); !s.ok()) {
      StopDaemons();
      return Fail(s.message());
    }
    int exit_code = RunRanks();
    return Finish(exit_code);
  }

  // The job's shape from the flags (--nodes K --ranks-per-node L infer --ranks), checked; the
  // dataset's absolute path.
  Status Resolve(bool ranks_per_node_given, bool ranks_given) {
    // --nodes K --ranks-per-node L without --ranks: the job has K*L ranks.
    if (ranks_per_node_given && !ranks_given) {
      f.job.job.ranks = std::max<uint32_t>(f.nodes, 1) * f.job.job.ranks_per_node;
    }
    if (f.nodes > 1 && !ranks_per_node_given) {
      if (f.job.job.ranks % f.nodes != 0) {
        return Status::InvalidArgument("--ranks " + std::to_string(f.job.job.ranks) +
                                       " is not a multiple of --nodes " + std::to_string(f.nodes) +
                                       "; give --ranks-per-node");
      }
      f.job.job.ranks_per_node = f.job.job.ranks / f.nodes;
    } else if (!ranks_per_node_given) {
      f.job.job.ranks_per_node = f.job.job.ranks;
    }
    // F comes from the dataset; validate the rest with a placeholder (nopfsd checks the real F).
    const uint64_t given_samples = f.job.job.samples;
    if (f.job.job.samples == 0) f.job.job.samples = policy::kMaxSamples;
    if (Status s = FinishJobFlags(&f.job); !s.ok()) return s;
    f.job.job.samples = given_samples;
    if (f.nodes > 1 && job.nodes() != f.nodes) {
      return Status::InvalidArgument("--nodes " + std::to_string(f.nodes) + " but --ranks " +
                                     std::to_string(job.ranks) + " / --ranks-per-node " +
                                     std::to_string(job.ranks_per_node) + " make " +
                                     std::to_string(job.nodes()) + " nodes");
    }
    if (f.node >= job.nodes()) {
      return Status::InvalidArgument("--node " + std::to_string(f.node) +
                                     " is out of range: the job has " +
                                     std::to_string(job.nodes()) + " nodes");
    }
    std::error_code ec;
    dataset = fs::absolute(f.dataset, ec);
    if (ec || !fs::exists(dataset)) {
      return Status::InvalidArgument("--dataset " + f.dataset + ": no such file or directory");
    }

    if (f.run_dir.empty()) {
      const char* tmp = std::getenv("TMPDIR");
      f.run_dir = std::string(tmp != nullptr && *tmp == '/' ? tmp : "/tmp") + "/nopfs-run-" +
                  std::to_string(getuid()) + "-" + std::to_string(getpid());
      made_run_dir = true;
    } else {
      f.run_dir = fs::absolute(f.run_dir).string();
      made_run_dir = !fs::exists(f.run_dir);
    }
    return Status::Ok();
  }

  // --hosts, --netns and --user, checked before anything is created.
  Status CheckIdentity() {
    const uint32_t started = f.nodes > 1 ? f.nodes : 1;
    hosts = SplitList(f.hosts);
    const std::vector<std::string> netns = SplitList(f.netns);
    if (!f.hosts.empty() && (f.nodes < 2 || hosts.size() != f.nodes)) {
      return Status::InvalidArgument(
          "--hosts lists " + std::to_string(hosts.size()) +
          " addresses; give one per node of --nodes N (N >= 2), e.g. --hosts "
          "10.0.0.1,10.0.0.2");
    }
    if (!f.netns.empty() && netns.size() != started) {
      return Status::InvalidArgument("--netns lists " + std::to_string(netns.size()) +
                                     " namespaces for " + std::to_string(started) +
                                     " node(s); give one per node, e.g. --netns ns0,ns1");
    }
    if (!f.user.empty()) {
      if (::geteuid() != 0) {
        return Status::InvalidArgument("--user needs root; without it nopfs runs as you");
      }
      const passwd* pw = ::getpwnam(f.user.c_str());
      if (pw == nullptr) return Status::InvalidArgument("--user " + f.user + ": no such user");
      if (pw->pw_uid == 0) {
        return Status::InvalidArgument("--user " + f.user + ": nopfsd never runs as root");
      }
      as = {true, pw->pw_uid, pw->pw_gid};
    }
    if (!f.netns.empty() && (::geteuid() != 0 || f.user.empty())) {
      return Status::InvalidArgument(
          "--netns needs root (to enter the namespaces) and --user USER (the daemons and "
          "ranks run as that user, never root)");
    }
    for (const std::string& name : netns) {
      const std::string path = name.find('/') == std::string::npos ? "/run/netns/" + name : name;
      const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) {
        return Status::InvalidArgument("--netns " + name + ": cannot open " + path + ": " +
                                       std::strerror(errno) + " (create it with `ip netns add " +
                                       name + "`)");
      }
      netns_fds.push_back(fd);
    }
    return Status::Ok();
  }

  // Hands a path this command made as root to --user: opened without following a symbolic link
  // (O_NONBLOCK: a FIFO put there does not block us), checked to be what was made (root's, a
  // directory or a regular file with one link) and changed through that descriptor, so that a
  // name the user swapped for a link to another file changes nothing but is refused. The run
  // directory itself is handed over last: until then the user cannot replace anything inside.
  Status Own(const std::string& path) const {
    if (!as.switch_user) return Status::Ok();
    const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return Status::FromErrno(errno, "opening " + path + " to hand it to " + f.user);
    struct stat st {};
    Status s = Status::Ok();
    if (::fstat(fd, &st) != 0) {
      s = Status::FromErrno(errno, "fstat " + path);
    } else if (st.st_uid != 0 ||
               !(S_ISDIR(st.st_mode) || (S_ISREG(st.st_mode) && st.st_nlink == 1))) {
      s = Status::PermissionDenied(
          path + " is not the directory or file nopfs run made (it is uid " +
          std::to_string(st.st_uid) + "'s): something replaced it; remove it and run again");
    } else if (::fchown(fd, as.uid, as.gid) != 0) {
      s = Status::FromErrno(errno, "chown " + path);
    }
    ::close(fd);
    return s;
  }

  // The run directories (one per node started here), the peers' ports and secret, nopfsd's
  // arguments.
  Status PrepareNodes() {
    if (Status s = service::PrepareRunDir(f.run_dir); !s.ok()) return s;
    // The nodes started here: --node alone, or with --nodes every node of the job, each with its
    // own run directory, all serving each other over loopback.
    if (f.nodes > 1) {
      for (uint32_t n = 0; n < f.nodes; ++n) {
        NodeRun r;
        r.node = n;
        r.run_dir = f.run_dir + "/node" + std::to_string(n);
        if (!hosts.empty()) r.host = hosts[n];
        if (Status s = service::PrepareRunDir(r.run_dir); !s.ok()) return s;
        if (Status s = Own(r.run_dir); !s.ok()) return s;
        nodes.push_back(std::move(r));
      }
    } else {
      NodeRun r;
      r.node = f.node;
      r.run_dir = f.run_dir;
      nodes.push_back(std::move(r));
    }
    for (size_t n = 0; n < nodes.size(); ++n) {
      nodes[n].socket = nodes[n].run_dir + "/" + launch::kSocketName;
      if (n < netns_fds.size()) nodes[n].netns_fd = netns_fds[n];
    }
    handed_netns = true;
    dargs.dataset = dataset.string();
    dargs.job = f.job;
    dargs.keep = f.keep;
    dargs.keep_max_bytes = f.keep_max_bytes;
    dargs.share_running = f.share_running;
    if (!f.job_id.empty()) dargs.job_id = f.job_id;
    if (!f.config.empty()) dargs.config = fs::absolute(f.config).string();
    if (f.nodes > 1) {
      Result<uint16_t> base = FreePorts(f.nodes);
      if (!base.ok()) return base.status();
      std::string list;
      for (uint32_t n = 0; n < f.nodes; ++n) {
        list += (n == 0 ? "" : ",") + nodes[n].host + ":" + std::to_string(*base + n);
      }
      secret = f.run_dir + "/" + launch::kSecretName;
      ::unlink(secret.c_str());
      if (Status s = WriteSecret(secret); !s.ok()) return s;
      if (Status s = Own(secret); !s.ok()) return s;
      dargs.peers = list;
      dargs.peer_secret_file = secret;
    }
    return Own(f.run_dir);
  }

  void InstallSignalHandlers() {
    struct sigaction sa {};
    sa.sa_handler = OnSignal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    sigaction(SIGHUP, &sa, nullptr);
  }

  // Asks every nopfsd started so far to stop, and waits for it.
  void StopDaemons() {
    for (NodeRun& r : nodes)
      if (r.daemon) r.daemon->Signal(SIGTERM);
    for (NodeRun& r : nodes) {
      if (r.daemon) {
        (void)r.daemon->Wait(
            std::chrono::milliseconds(static_cast<int64_t>(f.stop_timeout * 1000)));
      }
    }
  }

  // One nopfsd per node started here, each with a ready pipe.
  Status StartDaemons() {
    start = std::chrono::steady_clock::now();
    for (NodeRun& r : nodes) {
      // nopfsd says ready or failed on a pipe (nopfsd --ready-fd): its answer, and its death
      // before one (the pipe closes), arrive at once.
      int pipe_fds[2];
      if (::pipe2(pipe_fds, O_CLOEXEC) != 0) return Status::FromErrno(errno, "pipe");
      r.ready_fd = pipe_fds[0];
      dargs.run_dir = r.run_dir;
      dargs.node = r.node;
      dargs.ready_fd = pipe_fds[1];
      std::vector<std::string> dargv = dargs.ToArgv();
      dargv.insert(dargv.begin(), DaemonPath());
      Child::Options dopt;
      dopt.die_with_parent = true;
      dopt.netns_fd = r.netns_fd;
      dopt.keep_fds = {pipe_fds[1]};
      as.Apply(&dopt);
      Result<Child> daemon = Child::Spawn(dargv, dopt);
      ::close(pipe_fds[1]);
      if (!daemon.ok()) return daemon.status();
      r.daemon = std::move(*daemon);
    }
    return Status::Ok();
  }

  // Every node's `ready` (or its `failed`, or its death, with the log's tail).
  Status WaitForDaemons() {
    const auto deadline = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                      std::chrono::duration<double>(f.start_timeout));
    for (NodeRun& r : nodes) {
      Result<launch::ReadyInfo> ready =
          launch::WaitReady(r.ready_fd, deadline, [] { return g_signal.load() != 0; });
      ::close(std::exchange(r.ready_fd, -1));
      if (!ready.ok()) {
        if (ready.status().code() == StatusCode::kUnavailable ||
            ready.status().code() == StatusCode::kTimedOut) {
          return Status(ready.status().code(), ready.status().code() == StatusCode::kUnavailable
                                                   ? "interrupted while nopfsd was starting"
                                                   : "nopfsd was not ready within --start-timeout");
        }
        // It said failed, or closed the pipe without a word: it exits (or has exited).
        Result<int> exited = r.daemon->Wait(std::chrono::seconds(2));
        if (exited.ok()) r.daemon.reset();
        std::string msg = "nopfsd did not start";
        if (nodes.size() > 1) msg += " (node " + std::to_string(r.node) + ")";
        if (ready.status().code() == StatusCode::kFailedPrecondition) {
          msg += ": " + ready.status().message();
        }
        if (exited.ok()) msg += " (" + DescribeWaitStatus(*exited) + ")";
        msg +=
            "\nlast lines of " + r.run_dir + "/" + launch::kLogName +
            (remove_run_dir ? " (removed with the run directory; --keep-run-dir keeps it)" : "") +
            ":\n" + LogTail(r.run_dir);
        return Status::Unavailable(msg);
      }
      r.ready = *ready;
      if (!f.quiet) {
        std::fprintf(
            stderr, "nopfs run: nopfsd%s ready (pid %d, %s samples) in %.1f s; run dir %s\n",
            nodes.size() > 1 ? (" of node " + std::to_string(r.node)).c_str() : "", r.daemon->pid(),
            std::to_string(r.ready.samples).c_str(),
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
            r.run_dir.c_str());
      }
    }
    return Status::Ok();
  }

  // One process per rank of each node, as srun would start them; waits for them all and
  // forwards a signal. Returns the first failing exit code, or 0.
  int RunRanks() {
    std::vector<Child> ranks;
    std::vector<uint32_t> rank_ids;
    int exit_code = 0;
    for (NodeRun& r : nodes) {
      const uint32_t first = job.first_rank(r.node);
      const uint32_t local = job.ranks_on_node(r.node);
      for (uint32_t i = 0; i < local && exit_code == 0; ++i) {
        Child::Options o;
        o.new_group = false;
        // A launcher killed outright (SIGKILL, the OOM killer) takes its ranks with it, as it
        // takes nopfsd, instead of leaving them to run on without their service.
        o.die_with_parent = true;
        o.netns_fd = r.netns_fd;
        as.Apply(&o);
        launch::TaskEnv env;
        env.socket = r.socket;
        env.run_dir = r.run_dir;
        env.dataset = dataset.string();
        env.node = r.node;
        env.nodes = job.nodes();
        env.local_rank = i;
        env.ranks = job.ranks;
        env.ranks_per_node = job.ranks_per_node;
        env.seed = job.seed;
        env.epochs = job.epochs;
        env.batch = job.batch;
        env.scheme = f.job.scheme;
        env.drop_last = job.drop_last;
        env.samples = r.ready.samples;
        for (auto& [name, value] : env.Variables())
          o.env[name] = std::move(value);
        Result<Child> c = Child::Spawn(f.command, o);
        if (!c.ok()) {
          std::fprintf(stderr, "nopfs run: rank %u: %s\n", first + i, c.status().message().c_str());
          exit_code = 127;
          break;
        }
        ranks.push_back(std::move(*c));
        rank_ids.push_back(first + i);
      }
    }
    // Everything is started: from here on this process is the user too (the daemons answer the
    // status request of their own user only, and what is left to remove is the user's).
    if (as.switch_user &&
        (::setgroups(0, nullptr) != 0 || ::setresgid(as.gid, as.gid, as.gid) != 0 ||
         ::setresuid(as.uid, as.uid, as.uid) != 0)) {
      std::fprintf(stderr, "nopfs run: cannot become %s: %s\n", f.user.c_str(),
                   std::strerror(errno));
      if (exit_code == 0) exit_code = 1;
    }
    // The plan of each node, one line each, as the job starts (as the user: a daemon answers
    // its own user only).
    for (NodeRun& r : nodes) {
      Result<std::unique_ptr<client::Client>> c = client::Client::Connect(r.socket);
      Result<report::StatusReport> rep =
          c.ok() ? (*c)->Report() : Result<report::StatusReport>(c.status());
      if (rep.ok() && !f.quiet) std::fprintf(stderr, "%s", report::RenderPlanLine(*rep).c_str());
    }
    // Wait for every rank; forward a signal to all of them.
    std::vector<int> statuses(ranks.size(), -1);
    size_t running = ranks.size();
    bool forwarded = false;
    while (running > 0) {
      if (g_signal.load() != 0 && !forwarded) {
        for (Child& c : ranks)
          c.Signal(SIGTERM);
        forwarded = true;
      }
      for (size_t i = 0; i < ranks.size(); ++i) {
        if (!ranks[i].running()) continue;
        Result<int> st = ranks[i].Wait(std::chrono::milliseconds(10));
        if (st.ok()) {
          statuses[i] = *st;
          --running;
          if (exit_code == 0 && ExitCodeOf(*st) != 0) exit_code = ExitCodeOf(*st);
        }
      }
    }
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (statuses[i] >= 0 && ExitCodeOf(statuses[i]) != 0) {
        std::fprintf(stderr, "nopfs run: rank %u %s\n", rank_ids[i],
                     DescribeWaitStatus(statuses[i]).c_str());
      }
    }
    return exit_code;
  }

  // What each service saw, then stop them all; the summary; what is left behind.
  int Finish(int exit_code) {
    // What each service saw, then stop them all.
    for (NodeRun& r : nodes) {
      Result<std::unique_ptr<client::Client>> c = client::Client::Connect(r.socket);
      if (c.ok()) {
        Result<report::StatusReport> rep = (*c)->Report();
        if (rep.ok()) r.report = std::move(*rep);
      }
    }
    for (NodeRun& r : nodes)
      r.daemon->Signal(SIGTERM);
    for (NodeRun& r : nodes) {
      Result<int> dstatus =
          r.daemon->Wait(std::chrono::milliseconds(static_cast<int64_t>(f.stop_timeout * 1000)));
      if (!dstatus.ok()) {
        std::fprintf(stderr, "nopfs run: nopfsd did not stop within %.0f s; killing it\n",
                     f.stop_timeout);
        r.daemon->Signal(SIGKILL);
        (void)r.daemon->Wait();
        if (exit_code == 0) exit_code = 1;
      } else if (ExitCodeOf(*dstatus) != 0) {
        std::fprintf(stderr, "nopfs run: nopfsd %s\nlast lines of its log:\n%s",
                     DescribeWaitStatus(*dstatus).c_str(), LogTail(r.run_dir).c_str());
        if (exit_code == 0) exit_code = 1;
      }
    }

    uint64_t pfs_total = 0;
    for (NodeRun& r : nodes) {
      if (nodes.size() > 1) std::printf("node %u:\n", r.node);
      if (r.report) {
        pfs_total += r.report->pfs_bytes;
        std::printf("%s", report::RenderRunSummary(*r.report).c_str());
      } else {
        std::printf("nopfs run: no figures (the service did not answer)\n");
      }
    }
    if (nodes.size() > 1) {
      std::printf("job: pfs read in all (every node, prefetch included): %s\n",
                  FormatBytes(static_cast<double>(pfs_total)).c_str());
    }
    std::fflush(stdout);

    // nopfsd removes its socket, shared memory and SSD files; what may remain is its log.
    for (NodeRun& r : nodes) {
      for (const char* name : {launch::kSocketName, launch::kPidName, launch::kReadyName}) {
        if (fs::exists(r.run_dir + "/" + name)) {
          std::fprintf(stderr, "nopfs run: nopfsd left %s/%s behind\n", r.run_dir.c_str(), name);
          if (exit_code == 0) exit_code = 1;
        }
      }
    }
    if (!secret.empty()) ::unlink(secret.c_str());
    return exit_code;  // remove_on_exit removes the run directory
  }

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

int RunJob(RunFlags& f, bool ranks_per_node_given, bool ranks_given) {
  JobRun run(f);
  return run.Run(ranks_per_node_given, ranks_given);
}

}  // namespace

void RegisterRun(CLI::App* app, int* exit_code) {
  auto f = std::make_shared<RunFlags>();
  CLI::App* sub = app->add_subcommand(
      "run", "Run a command once per rank with nopfsd serving the dataset (nopfs without Slurm)");
  sub->add_option("--dataset", f->dataset,
                  "The dataset: an ImageFolder directory or a manifest file")
      ->required();
  AddJobFlags(sub, &f->job, /*samples_required=*/false);
  sub->add_option("--node", f->node, "This node's index in the job (its ranks are started)")
      ->capture_default_str();
  sub->add_option("--nodes", f->nodes,
                  "Start all N nodes of the job on this machine, each with its own nopfsd, and "
                  "let them read from each other over loopback (libfabric)")
      ->check(CLI::Range(1u, 64u));
  sub->add_option("--hosts", f->hosts,
                  "With --nodes N: the address each node listens on, A0,A1,... (default "
                  "127.0.0.1 for all)");
  sub->add_option("--netns", f->netns,
                  "Run node n's nopfsd and ranks in the n-th network namespace, NS0,NS1,... (names "
                  "in /run/netns or paths; needs root and --user)");
  sub->add_option(
      "--user", f->user,
      "As root: run the daemons and ranks as USER (groups cleared), and finish as USER");
  sub->add_option("--config", f->config, "Node config (Lua); default: a RAM tier of 1/8 of memory")
      ->check(CLI::ExistingFile);
  sub->add_option("--run-dir", f->run_dir,
                  "Directory for nopfsd's socket and log (default: $TMPDIR/nopfs-run-UID-PID, "
                  "removed afterwards)");
  sub->add_flag("--keep-run-dir", f->keep_run_dir, "Keep the run directory (and the log)");
  sub->add_flag("--keep", f->keep,
                "Keep the SSD tier's samples on this machine for the next run on the dataset "
                "(nopfs cache ls shows them)");
  sub->add_option("--keep-max-bytes", f->keep_max_bytes,
                  "With --keep: keep at most this much (a size: 40GB, 512MiB, or bytes; 0: no "
                  "limit)")
      ->transform(CLI::Validator(
          [](std::string& value) -> std::string {
            Result<uint64_t> bytes = ParseSize(value);
            if (!bytes.ok()) return bytes.status().message();
            value = std::to_string(*bytes);
            return std::string();
          },
          "SIZE"))
      ->needs("--keep");
  sub->add_option("--share-running", f->share_running,
                  "yes: read samples through this user's other running jobs on the dataset, "
                  "and serve them, so that the PFS is read once; no: read alone")
      ->capture_default_str();
  sub->add_option("--job-id", f->job_id,
                  "The job id nopfsd runs under, as a Slurm job id (a number; default: local). "
                  "Two runs at once on one machine need two ids: it names their shared memory "
                  "and SSD directories")
      ->check(CLI::Validator(CheckJobId, "ID"));
  sub->add_option("--start-timeout", f->start_timeout, "Seconds to wait for nopfsd to be ready")
      ->capture_default_str();
  sub->add_option("--stop-timeout", f->stop_timeout, "Seconds to wait for nopfsd to stop")
      ->capture_default_str();
  sub->add_flag("-q,--quiet", f->quiet, "Print only the summary");
  sub->add_option("command", f->command, "The command each rank runs (after --)")
      ->required()
      ->expected(-1);
  sub->callback([f, exit_code, sub] {
    *exit_code = RunJob(*f, sub->count("--ranks-per-node") > 0, sub->count("--ranks") > 0);
  });
}

}  // namespace nopfs::cli
