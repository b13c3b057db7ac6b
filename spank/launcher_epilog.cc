// nopfs-job's epilog, and the teardown of one job that it and the prolog (on a stale ledger entry)
// use: the job's nopfsd stopped, its SSD directories, run directory and metrics file removed,
// looked for again.
#include "spank/kept_live.h"
#include "spank/launcher.h"

#include <dirent.h>

#include "common/units.h"
#include "kept/area.h"
#include "kept/finish.h"

namespace nopfs::spank::launcher {

using namespace std::chrono_literals;

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

// The job's record (docs/admin.md, "A record of every job"): one line in slurmd's log, and the
// same line, with a warning for a job that read nothing through nopfs, in the job's output.
void Record(const Job& job, const report::StatusReport& summary) {
  const std::string line = DescribeSummary(summary);
  std::printf("nopfs: epilog: %s: job %llu: %s\n", job.node.c_str(),
              static_cast<unsigned long long>(job.job_id), line.c_str());
  const SlurmJob sj = QuerySlurm(job.job_id, job.node);
  if (sj.std_out.empty()) return;
  std::string text = "nopfs: " + job.node + ": " + line + "\n";
  if (const std::string w = UnusedWarning(summary); !w.empty())
    text += "nopfs: " + job.node + ": " + w + "\n";
  if (Status s = AppendAsUser(sj.std_out, job.uid, job.gid, text); !s.ok()) {
    std::printf("nopfs: epilog: %s: job output: %s\n", job.node.c_str(), s.message().c_str());
  }
}

namespace {

// The user's directory <path>/nopfs-<uid>, reached from a trusted `path` without following a link
// and checked to be the uid's; NotFound when there is none.
Result<UniqueFd> OpenUserDir(const std::string& path, uid_t uid) {
  Result<UniqueFd> rfd = OpenTrustedDir(path, /*last_may_be_sticky=*/true);
  if (!rfd.ok()) return rfd.status();
  const std::string name = "nopfs-" + std::to_string(uid);
  UniqueFd ufd(::openat(rfd->get(), name.c_str(),
                        O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK));
  if (ufd.get() < 0) {
    if (errno == ENOENT) return Status::NotFound(path + "/" + name + " does not exist");
    return Status::FromErrno(errno, "open " + path + "/" + name);
  }
  struct stat st {};
  if (::fstat(ufd.get(), &st) != 0) return Status::FromErrno(errno, "stat " + path + "/" + name);
  if (st.st_uid != uid) {
    return Status::PermissionDenied(path + "/" + name + " belongs to uid " +
                                    std::to_string(st.st_uid) + "; not touching it");
  }
  return ufd;
}

// Kept entries made from the keep records a killed nopfsd left beside its SSD tiers, within the
// grant (all SSD paths together, in order). Returns the note for the epilog's line.
std::string FinishKeeps(const Target& t) {
  std::string note;
  uint64_t used = 0;
  for (const std::string& path : t.ssd_paths) {
    if (t.keep_max_bytes != 0 && used >= t.keep_max_bytes) break;
    Result<UniqueFd> ufd = OpenUserDir(path, t.uid);
    if (!ufd.ok()) {
      if (ufd.status().code() != StatusCode::kNotFound)
        note += "kept area: not finished: " + Printable(ufd.status().message()) + "; ";
      continue;
    }
    kept::FinishRequest r;
    r.user_dir_fd = ufd->get();
    r.user_dir = path + "/nopfs-" + std::to_string(t.uid);
    r.uid = t.uid;
    r.tier_name = std::to_string(t.job_id) + "." + std::to_string(t.index);
    r.dataset = t.keep_dataset;
    r.max_bytes = t.keep_max_bytes == 0 ? 0 : t.keep_max_bytes - used;
    r.now = static_cast<int64_t>(::time(nullptr));
    Result<kept::FinishResult> f = kept::FinishKept(r);
    if (!f.ok()) {
      note += "kept area: nothing kept from nopfsd's keep record in " + Printable(r.user_dir) +
              ": " + Printable(f.status().message()) + "; ";
      continue;
    }
    if (!f->found) continue;
    used += f->bytes;
    note += "kept area: " + std::to_string(f->samples) + " samples (" +
            FormatBytes(static_cast<double>(f->bytes)) + ") in " + Printable(f->dir) +
            ", finished by the epilog from nopfsd's keep record";
    if (f->dropped != 0) note += " (" + std::to_string(f->dropped) + " beyond the grant not kept)";
    note += "; ";
  }
  return note;
}

// Removes the job's entries <key>.<job>.<index> from each SSD path's <user dir>/live (the
// sibling registry, service/reader/sibling.h), which a killed nopfsd leaves; by name in the
// user's directory, never following a link. Best effort: a reader skips an entry whose process is
// gone, and removes it.
void RemoveLiveEntries(const Target& t) {
  const std::string suffix = "." + std::to_string(t.job_id) + "." + std::to_string(t.index);
  for (const std::string& path : t.ssd_paths) {
    Result<UniqueFd> ufd = OpenUserDir(path, t.uid);
    if (!ufd.ok()) continue;
    const int lfd =
        ::openat(ufd->get(), "live", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (lfd < 0) continue;
    struct stat st {};
    DIR* d = ::fstat(lfd, &st) == 0 && st.st_uid == t.uid ? ::fdopendir(lfd) : nullptr;
    if (d == nullptr) {
      ::close(lfd);
      continue;
    }
    std::vector<std::string> names;
    while (const dirent* e = ::readdir(d)) {
      const std::string_view n = e->d_name;
      if (n.size() == 16 + suffix.size() && kept::IsKeptKey(n.substr(0, 16)) &&
          n.substr(16) == suffix) {
        names.emplace_back(n);
      }
    }
    for (const std::string& n : names)
      (void)::unlinkat(::dirfd(d), n.c_str(), 0);
    ::closedir(d);
    (void)::unlinkat(ufd->get(), "live", AT_REMOVEDIR);  // only when empty
  }
}

}  // namespace

Target FromEntry(const LedgerEntry& e) {
  Target t;
  t.job_id = e.job_id;
  t.uid = e.uid;
  t.index = e.node_index;
  t.daemon = {static_cast<pid_t>(e.pid), e.start_time};
  t.ssd_paths = e.ssd_paths;
  t.metrics_dir = e.metrics_dir;
  t.keep = e.keep;
  t.keep_max_bytes = e.keep_max_bytes;
  t.keep_dataset = e.keep_dataset;
  return t;
}

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

std::string Teardown(const std::string& node_dir, const Target& t, std::chrono::milliseconds grace,
                     const std::function<void()>& while_stopped, std::string* notes) {
  const std::string& metrics_dir = t.metrics_dir;
  const std::string job = std::to_string(t.job_id);
  std::string left;
  if (t.daemon.pid > 0) {
    for (pid_t p : StopProcesses({t.daemon}, grace))
      left += " process " + std::to_string(p);
  }
  // nopfsd is gone (a clean stop kept already and removed its tiers with their records): what a
  // killed nopfsd committed is kept now, from the SSD tiers, before they are removed.
  if (left.empty() && t.index != kUnknownIndex) {
    if (t.keep) {
      const std::string note = FinishKeeps(t);
      if (notes != nullptr) *notes += note;
    }
    RemoveLiveEntries(t);
  }
  if (while_stopped) while_stopped();
  // What slurmd could not remove of the job's cgroup while nopfsd was in it.
  if (!t.node.empty()) {
    if (std::string cg = RemoveJobCgroup(JobCgroupOptions{.node = t.node}, t.job_id, t.uid);
        !cg.empty()) {
      left += " cgroup " + cg;
    }
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
  Target t = entry ? FromEntry(*entry)
                   : Target{job.job_id, job.uid, job.node_index, {}, {}, {}, {}, false, 0, {}};
  t.node = job.node;
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
  // The job's record, read while nopfsd is stopped and its run directory still there.
  std::optional<report::StatusReport> summary;
  std::string log_note;
  auto record = [&] {
    std::string why;
    summary = ReadSummary(job.node_dir, job.job_id, job.uid, &why);
    if (!entry) return;
    if (Result<lua::NodeConfig> config = LoadConfig(job);
        config.ok() && !config->job_log_dir().empty()) {
      log_note = KeepJobLog(job, config->job_log_dir(), config->job_log_days());
    }
  };
  left += Teardown(job.node_dir, t, std::chrono::seconds(job.args.grace), record, &notes);
  if (summary) Record(job, *summary);
  if (!log_note.empty()) {
    std::printf("%sjob %llu: %s\n", where.c_str(), static_cast<unsigned long long>(job.job_id),
                log_note.c_str());
  }
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
      // The ledger's other jobs: their SSD directories are theirs, not the user's kept bytes.
      std::string ledger_error;
      const std::vector<kept::LiveJob> live = LiveJobs(job.ledger_dir, &ledger_error);
      if (ledger_error.empty()) {
        notes += AfterJob(job.args.policy, *config, job.node, t.ssd_paths, t.uid, job.opts.dataset,
                          live);
      } else {
        notes += "kept datasets not looked at (ledger: " + ledger_error + "); ";
      }
    }
  }
  if (!left.empty()) {
    std::printf("%s%sleft behind:%s\n", where.c_str(), notes.c_str(), left.c_str());
    return 1;
  }
  std::printf("%s%sclean\n", where.c_str(), notes.c_str());
  return 0;
}

}  // namespace nopfs::spank::launcher
