// nopfs-job's prolog: the admission policy and the ledger's reservation, the job's run directory,
// nopfsd started as the user and waited for until ready, and the status files task_init reads.
#include <linux/capability.h>

#include <cctype>

#include "common/printable.h"
#include "spank/kept_live.h"
#include "spank/launcher.h"
#include "spank/placement.h"
#include "spank/shared_decl.h"

namespace nopfs::spank::launcher {

using namespace std::chrono_literals;

Status EnsureRootDir(const std::string& path, mode_t mode) {
  Result<UniqueFd> fd = MakeTrustedDir(path, mode);
  if (!fd.ok()) return Status(fd.status().code(), "rundir: " + fd.status().message());
  return Status::Ok();
}

Result<lua::NodeConfig> LoadConfig(const Job& job) {
  if (job.args.config.empty()) return lua::DefaultNodeConfig(lua::HostMemoryBytes());
  return lua::LoadNodeConfig(job.args.config);
}

std::vector<std::string> SsdPaths(const lua::NodeConfig& config) {
  std::vector<std::string> out;
  for (const policy::StorageClass& c : config.model().classes) {
    if (c.kind == policy::ClassKind::kSsd && !c.path.empty()) out.push_back(c.path);
  }
  return out;
}

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
  ns.ssd_total = config.SsdForJobs();
  const std::string boot = BootId();
  std::vector<kept::LiveJob> live_jobs;
  for (const LedgerEntry& e : *entries) {
    if (e.job_id == job.job_id) continue;
    // An entry of an earlier boot is stale; so is one whose job slurmctld reports over or
    // unknown, even if its process still lives (an epilog that could not finish). Only when
    // slurmctld cannot be asked is an entry kept (QuerySlurm says active then).
    const bool live = e.boot_id == boot && QuerySlurm(e.job_id, job.node).active;
    if (!live) {
      // Stale: its job is over and its epilog did not finish. Clean up after it.
      Target t = FromEntry(e);
      t.node = job.node;
      if (t.ssd_paths.empty()) t.ssd_paths = SsdPaths(config);
      if (t.metrics_dir.empty()) t.metrics_dir = config.metrics_dir();
      (void)Teardown(job.node_dir, t, 2s);
      (void)ledger->Remove(e.job_id);
      continue;
    }
    ns.ram_reserved += e.ram;
    ns.ssd_reserved += e.ssd;
    ++ns.jobs;
    live_jobs.push_back(LiveJobOf(e));
  }
  NodeKept kept(KeepJob{job.uid, job.opts.dataset, job.opts.keep, job.args.policy}, config,
                SsdPaths(config), live_jobs, &ns);
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
    *keep = kept.Admitted(ns, adm);
    // The epilog keeps within this grant when nopfsd is killed before it kept.
    e.keep = keep->keep;
    e.keep_max_bytes = keep->max_bytes;
    e.keep_dataset = job.opts.dataset;
    // A job with tiers that may serve a sibling marks the node for its user's next job on the
    // dataset while it runs (spank/placement.h).
    if (job.opts.share_running && adm.ram + adm.ssd > 0) e.sibling_dataset = job.opts.dataset;
    if (Status s = ledger->Put(e); !s.ok()) return s;
  }

  return adm;
}

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
  dargs.ram = SizeArg(adm.ram);
  dargs.ssd = SizeArg(adm.ssd);
  dargs.config = job.args.config;
  dargs.keep = keep.keep;
  dargs.keep_max_bytes = keep.max_bytes;
  dargs.share_running = job.opts.share_running;
  dargs.summary = true;  // the epilog's record of the job
  SetPeers(job, &dargs, peers_note);
  // The nodes wait for each other at most half of the time nopfsd has to become ready.
  dargs.peer_startup_timeout_ms = static_cast<uint32_t>(
      std::min<uint64_t>(launch::kDefaultPeerStartupTimeoutMs, uint64_t{job.args.timeout} * 500));
  return dargs;
}

Result<pid_t> StartNopfsd(const Job& job, const std::string& nopfsd, launch::DaemonArgs dargs,
                          LedgerEntry entry, int cgroup_procs, launch::ReadyInfo* said) {
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
  // Its peer port is privileged, so that no user can take it (docs/security.md).
  if (!dargs.peers.empty()) o.ambient_caps = {CAP_NET_BIND_SERVICE};
  Result<std::vector<gid_t>> groups = launch::GroupsOf(name, job.gid);
  if (groups.ok()) o.groups = std::move(*groups);
  o.cwd = job.run_dir;
  o.output_path = launch::kOutputName;
  const UniqueFd null_fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  o.stdin_fd = null_fd.get();
  o.keep_fds = {ready_pipe[1]};
  if (cgroup_procs >= 0) o.cgroup_fds = {cgroup_procs};
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
  *said = *ready;
  return child;
}

std::string PlacementNote(const Job& job, const SlurmJob& sj, const lua::NodeConfig& config) {
  if (job.args.placement_key.empty()) return "";
  Result<std::string> key = ReadPlacementKey(job.args.placement_key);
  if (!key.ok()) return "placement: " + key.status().message();
  const std::string mark = PlacementMark(*key, job.uid, job.opts.dataset);
  // A shared dataset's nodes are those with the user's mark or the dataset's shared one.
  const bool shared = SharedDeclFor(config, job.opts.dataset) != nullptr;
  const std::string shared_mark = shared ? SharedMark(*key, job.opts.dataset) : "";
  auto holds = [&](const std::string& list) {
    for (const std::string* m : {&mark, &shared_mark}) {
      if (m->empty()) continue;
      for (size_t pos = list.find(*m); pos != std::string::npos; pos = list.find(*m, pos + 1)) {
        const size_t end = pos + m->size();
        if (end == list.size() || !std::isxdigit(static_cast<unsigned char>(list[end])))
          return true;
      }
    }
    return false;
  };
  // A running job's features are its prefer when Slurm could meet it; a prefer it could not meet
  // is not reported, but job_submit.lua's note in the AdminComment (which the job's user cannot
  // write) says that it asked. It asks unless the job is off or names its nodes.
  const bool placed = holds(sj.features) || holds(sj.prefer);
  const bool noted = sj.admin_comment.find(kPlacementAsked) != std::string::npos;
  const bool would_ask = job.opts.placement != "off" && sj.req_nodes.empty();
  if (!placed && !noted && !would_ask) return "";
  const kept::KeptNode mine = kept::KeptNode::Scan(SsdPaths(config), job.uid);
  bool warm = false;
  for (const kept::KeptEntry& e : mine.entries()) {
    warm = warm || (e.Complete() && MarkPath(e.data.dataset) == MarkPath(job.opts.dataset));
  }
  const std::string dataset = Printable(job.opts.dataset, 200);
  // What the nodes hold; of a shared dataset, the node's shared copy (the share service's, whose
  // fill the prolog does not read) is said by the job's shared line.
  const std::string copy =
      (shared ? "your kept copy or the node's shared copy of " : "your kept copy of ") + dataset;
  const std::string here =
      shared ? (warm ? "this node holds your kept copy" : "this node holds no kept copy of yours")
             : (warm ? "this node holds one" : "this node holds none");
  if (!placed && !noted) {
    return "placement: the job did not ask for the nodes holding " + copy +
           ": placement is not set up on slurmctld's side (docs/admin.md, \"Placement\"); " + here;
  }
  const char* how = job.opts.placement == "require" ? "required" : "preferred";
  return std::string("placement: ") + how + " the nodes holding " + copy + "; " + here +
         (warm ? "" : " (no node holding one was free, or none holds one yet)");
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
    Target t = old ? FromEntry(*old)
                   : Target{job.job_id, job.uid, job.node_index, {}, {}, {}, {}, false, 0, {}};
    t.node = job.node;
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
  req.no_ram = job.opts.ram == 0 && OptionGiven(job.opts, "nopfs-ram");
  req.no_ssd = job.opts.ssd == 0 && OptionGiven(job.opts, "nopfs-ssd");
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

  // Whether the job came to its kept copy (before nopfsd starts, which may adopt it).
  const std::string placement_note = PlacementNote(job, sj, *config);
  if (!placement_note.empty()) {
    WriteStatus(job, launch::kPlacementName, "nopfs: " + job.node + ": " + placement_note);
  }

  std::string peers_note;
  launch::DaemonArgs dargs = DaemonArgsFor(job, *ranks_per_node, adm, keep, &peers_note);
  // A dataset the node shares is read through the node's one copy (docs/tiers.md, "Shared
  // datasets"): the job keeps its RAM tier, and needs no SSD tier of its own.
  std::string shared_note;
  if (const lua::SharedDecl* decl = SharedDeclFor(*config, job.opts.dataset)) {
    Result<std::string> socket = EnsureShareService(job, self);
    if (socket.ok()) {
      dargs.shared_socket = *socket;
      dargs.shared_dataset = decl->path;
      dargs.ssd = "0";
      shared_note = "shared copy of " + decl->path;
      // Its SSD reservation goes back to the node.
      entry.ssd = 0;
      if (Result<Ledger> l = Ledger::Lock(job.ledger_dir, 30s); l.ok()) (void)l->Put(entry);
    } else {
      shared_note = "no shared copy (" + socket.status().message() + "): the job reads the PFS";
    }
  }
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
  // The job's metrics file, made by root for the job's user before nopfsd starts: the directory
  // takes files from root alone, so every series under the job's labels is its own (security.md).
  if (!entry.metrics_dir.empty()) {
    if (Status s =
            MakeFileAs(entry.metrics_dir, launch::MetricsFileName(dargs.job_id), job.uid, job.gid);
        !s.ok()) {
      std::printf("%smetrics: %s (the job goes on without a metrics file)\n", where.c_str(),
                  s.message().c_str());
    }
  }
  // Where Slurm holds jobs in cgroups, nopfsd starts in its job's (docs/admin.md, "The job's
  // cgroup"), and on v1 joins the job's other controllers once slurmd has set them up.
  const SlurmCgroups slurm_cgroups = AskSlurmCgroups();
  const JobCgroupOptions cgroup_options{.node = job.node};
  std::string cgroup_note;
  Result<JobCgroup> cgroup = Status::NotFound("Slurm does not run jobs in cgroups");
  if (slurm_cgroups.task_cgroup) {
    cgroup = PrepareJobCgroup(cgroup_options, job.job_id, job.uid, req.memory);
    cgroup_note = cgroup.ok() ? cgroup->note
                              : "cgroup: " + cgroup.status().message() +
                                    "; nopfsd runs outside the job's cgroup";
  }
  launch::ReadyInfo said;
  Result<pid_t> started = StartNopfsd(job, DaemonPath(job, self), dargs, entry,
                                      cgroup.ok() ? cgroup->procs.get() : -1, &said);
  if (!started.ok()) {
    WriteStatus(job, launch::kFailedName, where + started.status().message());
    release();
    (void)RemoveJobCgroup(cgroup_options, job.job_id, job.uid);
    return fail("nopfsd failed: " + started.status().message(), 4);
  }
  const pid_t child = *started;
  if (!dargs.peers.empty()) {
    std::string for_job;
    peers_note = PeersOutcome(job, dargs, said, &for_job);
    if (!for_job.empty()) WriteStatus(job, launch::kPeersName, for_job);
  }
  if (slurm_cgroups.task_cgroup && slurm_cgroups.contain)
    (void)AdoptLater(cgroup_options, job.job_id, job.uid, child,
                     ProcessStartTime(child).value_or(0), std::chrono::seconds(job.args.timeout));
  std::printf(
      "%sserving %s (partition %s, job memory %s) with RAM %s, SSD %s%s%s%s%s%s%s%s%s%s%s%s%s; "
      "nopfs "
      "%s\n",
      where.c_str(), job.opts.dataset.c_str(), req.partition.empty() ? "?" : req.partition.c_str(),
      req.memory == 0 ? "unlimited" : FormatBytes(static_cast<double>(req.memory)).c_str(),
      FormatBytes(static_cast<double>(adm.ram)).c_str(),
      FormatBytes(static_cast<double>(adm.ssd)).c_str(), adm.reason.empty() ? "" : "; ",
      adm.reason.c_str(), peers_note.empty() ? "" : "; ", peers_note.c_str(),
      keep.note.empty() ? "" : "; ", keep.note.c_str(), shared_note.empty() ? "" : "; ",
      shared_note.c_str(), placement_note.empty() ? "" : "; ", placement_note.c_str(),
      cgroup_note.empty() ? "" : "; ", cgroup_note.c_str(), kVersion);
  return 0;
}

}  // namespace nopfs::spank::launcher
