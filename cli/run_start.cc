// `nopfs run` up to its ranks: the job's shape from the flags, the identity the processes run as,
// the run directories, ports and secret of the nodes started here, and their nopfsd started and
// waited for until ready.
#include "cli/run_job.h"

namespace nopfs::cli::run {

using launch::DescribeWaitStatus;
using launch::ExitCodeOf;

Status JobRun::Resolve(bool ranks_per_node_given, bool ranks_given) {
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
                                   " is out of range: the job has " + std::to_string(job.nodes()) +
                                   " nodes");
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

Status JobRun::CheckIdentity() {
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

Status JobRun::Own(const std::string& path) const {
  if (!as.switch_user) return Status::Ok();
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "opening " + path + " to hand it to " + f.user);
  struct stat st {};
  Status s = Status::Ok();
  if (::fstat(fd, &st) != 0) {
    s = Status::FromErrno(errno, "fstat " + path);
  } else if (st.st_uid != 0 ||
             !(S_ISDIR(st.st_mode) || (S_ISREG(st.st_mode) && st.st_nlink == 1))) {
    s = Status::PermissionDenied(path + " is not the directory or file nopfs run made (it is uid " +
                                 std::to_string(st.st_uid) +
                                 "'s): something replaced it; remove it and run again");
  } else if (::fchown(fd, as.uid, as.gid) != 0) {
    s = Status::FromErrno(errno, "chown " + path);
  }
  ::close(fd);
  return s;
}

Status JobRun::PrepareNodes() {
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

void JobRun::InstallSignalHandlers() {
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGHUP, &sa, nullptr);
}

void JobRun::StopDaemons() {
  for (NodeRun& r : nodes)
    if (r.daemon) r.daemon->Signal(SIGTERM);
  for (NodeRun& r : nodes) {
    if (r.daemon) {
      (void)r.daemon->Wait(std::chrono::milliseconds(static_cast<int64_t>(f.stop_timeout * 1000)));
    }
  }
}

Status JobRun::StartDaemons() {
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

Status JobRun::WaitForDaemons() {
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
      msg += "\nlast lines of " + r.run_dir + "/" + launch::kLogName +
             (remove_run_dir ? " (removed with the run directory; --keep-run-dir keeps it)" : "") +
             ":\n" + LogTail(r.run_dir);
      return Status::Unavailable(msg);
    }
    r.ready = *ready;
    if (!f.quiet) {
      std::fprintf(stderr, "nopfs run: nopfsd%s ready (pid %d, %s samples) in %.1f s; run dir %s\n",
                   nodes.size() > 1 ? (" of node " + std::to_string(r.node)).c_str() : "",
                   r.daemon->pid(), std::to_string(r.ready.samples).c_str(),
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                   r.run_dir.c_str());
    }
  }
  return Status::Ok();
}

}  // namespace nopfs::cli::run
