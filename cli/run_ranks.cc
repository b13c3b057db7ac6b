// `nopfs run` from its ranks on: one process per rank of each node, as srun would start them, the
// signals forwarded to them, and the end: what each service saw, the summary, the services
// stopped and what is left behind.
#include "cli/run_job.h"

namespace nopfs::cli::run {

using launch::DescribeWaitStatus;
using launch::ExitCodeOf;

int JobRun::Run(bool ranks_per_node_given, bool ranks_given) {
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

int JobRun::RunRanks() {
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
  if (as.switch_user && (::setgroups(0, nullptr) != 0 || ::setresgid(as.gid, as.gid, as.gid) != 0 ||
                         ::setresuid(as.uid, as.uid, as.uid) != 0)) {
    std::fprintf(stderr, "nopfs run: cannot become %s: %s\n", f.user.c_str(), std::strerror(errno));
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

int JobRun::Finish(int exit_code) {
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
  uint64_t served = 0;
  bool answered = true;
  for (NodeRun& r : nodes) {
    if (nodes.size() > 1) std::printf("node %u:\n", r.node);
    if (r.report) {
      pfs_total += r.report->pfs_bytes;
      for (const report::Source& s : r.report->sources)
        served += s.samples;
      std::printf("%s", report::RenderRunSummary(*r.report).c_str());
    } else {
      answered = false;
      std::printf("nopfs run: no figures (the service did not answer)\n");
    }
  }
  if (nodes.size() > 1) {
    std::printf("job: pfs read in all (every node, prefetch included): %s\n",
                FormatBytes(static_cast<double>(pfs_total)).c_str());
  }
  std::fflush(stdout);
  if (answered && served == 0 && pfs_total > 0) {
    // The usual cause: a script still reading with torch's own classes.
    std::fprintf(stderr,
                 "nopfs run: the job staged %s from the PFS but its ranks read no sample through "
                 "nopfs: the training script reads the files itself. To read through nopfs, "
                 "change three lines (docs/python.md, \"The three-line change\"):\n"
                 "  from nopfs.torch import DataLoader\n"
                 "  from nopfs.torch import DistributedSampler\n"
                 "  from nopfs.torch import ImageFolder\n",
                 FormatBytes(static_cast<double>(pfs_total)).c_str());
  }

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

}  // namespace nopfs::cli::run
