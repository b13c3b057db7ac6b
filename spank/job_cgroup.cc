#include "spank/job_cgroup.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <syslog.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

extern "C" {
#include <slurm/slurm.h>
}

#include "common/units.h"
#include "launch/process.h"

namespace nopfs::spank {
namespace {

bool IsDir(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool IsFile(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string ReadSmall(const std::string& path) {
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return text.substr(0, 4096);
}

// Field 22 of /proc/<pid>/stat (after the parenthesized command, which may hold anything).
uint64_t StartTime(pid_t pid) {
  const std::string text = ReadSmall("/proc/" + std::to_string(pid) + "/stat");
  const size_t close = text.rfind(')');
  if (close == std::string::npos || close + 2 > text.size()) return 0;
  std::istringstream rest(text.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && rest >> field; ++i) {
    if (i == 22) return std::stoull(field);
  }
  return 0;
}

// Writes `text` to an existing control file (never creating one, never through a link).
Status WriteControl(const std::string& file, const std::string& text) {
  const UniqueFd fd(::open(file.c_str(), O_WRONLY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) return Status::FromErrno(errno, file);
  const ssize_t n = ::write(fd.get(), text.data(), text.size());
  if (n != static_cast<ssize_t>(text.size())) {
    return Status::FromErrno(n < 0 ? errno : EIO, "writing '" + text + "' to " + file);
  }
  return Status::Ok();
}

// mkdir that takes an existing directory (never a link) as made.
Status MakeDir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0755) == 0 || (errno == EEXIST && IsDir(dir))) return Status::Ok();
  return Status::FromErrno(errno == EEXIST ? ENOTDIR : errno, "mkdir " + dir);
}

// The flock slurmstepd takes on a hierarchy's top while it makes or removes a job's directories
// (common_cgroup_lock): held for the object's life.
class TopLock {
 public:
  explicit TopLock(const std::string& top)
      : fd_(::open(top.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) {
    if (fd_.valid()) {
      while (::flock(fd_.get(), LOCK_EX) != 0 && errno == EINTR) {
      }
    }
  }
  ~TopLock() {
    if (fd_.valid()) ::flock(fd_.get(), LOCK_UN);
  }
  TopLock(const TopLock&) = delete;
  TopLock& operator=(const TopLock&) = delete;

 private:
  UniqueFd fd_;
};

// The directory below a v1 controller that slurmd puts its jobs in: slurm_<node> or slurm,
// whichever exists (slurm_<node> when neither does yet: the build of several slurmd per host).
std::string V1Top(const JobCgroupOptions& o, const std::string& controller) {
  const std::string base = o.root + "/" + controller + "/";
  if (!o.node.empty() && IsDir(base + "slurm_" + o.node)) return base + "slurm_" + o.node;
  if (IsDir(base + "slurm")) return base + "slurm";
  return base + (o.node.empty() ? "slurm" : "slurm_" + o.node);
}

std::string V1JobDir(const JobCgroupOptions& o, const std::string& controller, uint64_t job_id,
                     uid_t uid) {
  return V1Top(o, controller) + "/uid_" + std::to_string(uid) + "/job_" + std::to_string(job_id);
}

// The scope slurmd makes at its start for its slurmstepds on v2 ("" when there is none).
std::string V2Scope(const JobCgroupOptions& o) {
  const std::string slice = o.root + "/system.slice/";
  if (!o.node.empty() && IsDir(slice + o.node + "_slurmstepd.scope"))
    return slice + o.node + "_slurmstepd.scope";
  if (IsDir(slice + "slurmstepd.scope")) return slice + "slurmstepd.scope";
  return "";
}

constexpr const char* kV2Leaf = "nopfs";

Result<JobCgroup> PrepareV1(const JobCgroupOptions& o, uint64_t job_id, uid_t uid,
                            uint64_t memory) {
  JobCgroup cg;
  cg.version = CgroupVersion::kV1;
  const std::string top = V1Top(o, "memory");
  const std::string user = top + "/uid_" + std::to_string(uid);
  cg.dir = user + "/job_" + std::to_string(job_id);
  {
    const TopLock lock(o.root + "/memory");
    for (const std::string& d : {top, user, cg.dir}) {
      if (Status s = MakeDir(d); !s.ok()) return s;
    }
  }
  if (memory > 0) {
    if (Status s = WriteControl(cg.dir + "/memory.limit_in_bytes", std::to_string(memory));
        !s.ok()) {
      return s;
    }
    cg.limit = memory;
  }
  cg.procs.Reset(::open((cg.dir + "/cgroup.procs").c_str(), O_WRONLY | O_NOFOLLOW | O_CLOEXEC));
  if (!cg.procs.valid()) return Status::FromErrno(errno, cg.dir + "/cgroup.procs");
  cg.note = "cgroup v1 memory:" + cg.dir.substr(o.root.size() + std::strlen("/memory"));
  return cg;
}

Result<JobCgroup> PrepareV2(const JobCgroupOptions& o, uint64_t job_id, uint64_t memory) {
  const std::string scope = V2Scope(o);
  if (scope.empty()) {
    return Status::NotFound("no slurmstepd scope under " + o.root +
                            "/system.slice (is slurmd running with CgroupPlugin=cgroup/v2?)");
  }
  JobCgroup cg;
  cg.version = CgroupVersion::kV2;
  const std::string job = scope + "/job_" + std::to_string(job_id);
  cg.dir = job + "/" + kV2Leaf;
  // The controllers slurmd enabled for its jobs; the job's directory passes them on to its
  // children, as slurmd does for it (a directory with processes could not: hence the leaf).
  std::istringstream enabled(ReadSmall(scope + "/cgroup.subtree_control"));
  std::vector<std::string> controllers;
  for (std::string c; enabled >> c;)
    controllers.push_back(c);
  {
    const TopLock lock(scope);
    if (Status s = MakeDir(job); !s.ok()) return s;
    for (const std::string& c : controllers) {
      if (Status s = WriteControl(job + "/cgroup.subtree_control", "+" + c); !s.ok()) return s;
    }
    if (Status s = MakeDir(cg.dir); !s.ok()) return s;
  }
  const bool has_memory =
      std::find(controllers.begin(), controllers.end(), "memory") != controllers.end();
  if (memory > 0 && has_memory) {
    if (Status s = WriteControl(job + "/memory.max", std::to_string(memory)); !s.ok()) return s;
    cg.limit = memory;
  }
  cg.procs.Reset(::open((cg.dir + "/cgroup.procs").c_str(), O_WRONLY | O_NOFOLLOW | O_CLOEXEC));
  if (!cg.procs.valid()) return Status::FromErrno(errno, cg.dir + "/cgroup.procs");
  cg.note = "cgroup v2 " + cg.dir.substr(o.root.size());
  if (!has_memory) cg.note += " (no memory controller enabled in " + scope + ")";
  return cg;
}

// rmdir that counts a directory already gone as removed and one still in use (processes,
// children) as `busy`.
Status RemoveCgroupDir(const std::string& dir, bool* busy) {
  if (::rmdir(dir.c_str()) == 0 || errno == ENOENT) return Status::Ok();
  if (errno == EBUSY || errno == ENOTEMPTY) {
    *busy = true;
    return Status::Ok();
  }
  return Status::FromErrno(errno, "rmdir " + dir);
}

}  // namespace

CgroupVersion DetectCgroupVersion(const std::string& root) {
  if (IsFile(root + "/cgroup.controllers")) return CgroupVersion::kV2;
  if (IsDir(root + "/memory")) return CgroupVersion::kV1;
  return CgroupVersion::kNone;
}

SlurmCgroups AskSlurmCgroups() {
  SlurmCgroups out;
  slurm_conf_t* conf = nullptr;
  if (slurm_load_ctl_conf(0, &conf) != SLURM_SUCCESS || conf == nullptr) return out;
  out.contain = (conf->prolog_flags & PROLOG_FLAG_CONTAIN) != 0;
  out.task_cgroup =
      conf->task_plugin != nullptr && std::strstr(conf->task_plugin, "task/cgroup") != nullptr;
  slurm_free_ctl_conf(conf);
  return out;
}

Result<JobCgroup> PrepareJobCgroup(const JobCgroupOptions& o, uint64_t job_id, uid_t uid,
                                   uint64_t memory) {
  Result<JobCgroup> cg =
      Status::NotFound("no cgroup v1 memory controller and no cgroup v2 under " + o.root);
  switch (DetectCgroupVersion(o.root)) {
    case CgroupVersion::kV1:
      cg = PrepareV1(o, job_id, uid, memory);
      break;
    case CgroupVersion::kV2:
      cg = PrepareV2(o, job_id, memory);
      break;
    case CgroupVersion::kNone:
      break;
  }
  if (cg.ok() && cg->limit > 0) {
    cg->note += ", memory limit " + FormatBytes(static_cast<double>(cg->limit));
  }
  return cg;
}

std::string RemoveJobCgroup(const JobCgroupOptions& o, uint64_t job_id, uid_t uid) {
  std::string left;
  bool busy = false;
  const std::string job = "job_" + std::to_string(job_id);
  switch (DetectCgroupVersion(o.root)) {
    case CgroupVersion::kV1:
      for (const std::string& c : o.controllers) {
        if (!IsDir(o.root + "/" + c)) continue;
        const TopLock lock(o.root + "/" + c);
        const std::string user = V1Top(o, c) + "/uid_" + std::to_string(uid);
        // The job's directory is slurmd's too: still busy means processes of the job that
        // slurmd has not ended, not nopfs's to report.
        if (Status s = RemoveCgroupDir(user + "/" + job, &busy); !s.ok()) left += " " + s.message();
        if (Status s = RemoveCgroupDir(user, &busy); !s.ok()) left += " " + s.message();
      }
      break;
    case CgroupVersion::kV2: {
      const std::string scope = V2Scope(o);
      if (scope.empty()) break;
      const TopLock lock(scope);
      const std::string leaf = scope + "/" + job + "/" + kV2Leaf;
      bool leaf_busy = false;
      if (Status s = RemoveCgroupDir(leaf, &leaf_busy); !s.ok()) left += " " + s.message();
      if (leaf_busy) left += " " + leaf + " (still has processes)";
      if (Status s = RemoveCgroupDir(scope + "/" + job, &busy); !s.ok()) left += " " + s.message();
      break;
    }
    case CgroupVersion::kNone:
      break;
  }
  return left.empty() ? left : left.substr(1);
}

std::vector<std::string> FindJobCgroups(const JobCgroupOptions& o, uint64_t job_id, uid_t uid,
                                        bool extern_step) {
  std::vector<std::string> found;
  for (const std::string& c : o.controllers) {
    if (!IsDir(o.root + "/" + c)) continue;
    const std::string d = V1JobDir(o, c, job_id, uid) + (extern_step ? "/step_extern" : "");
    if (IsDir(d)) found.push_back(d);
  }
  return found;
}

Status AdoptInto(const std::vector<std::string>& dirs, pid_t pid) {
  for (const std::string& d : dirs) {
    if (Status s = WriteControl(d + "/cgroup.procs", std::to_string(pid) + "\n"); !s.ok()) {
      return s;
    }
  }
  return Status::Ok();
}

bool AdoptLater(const JobCgroupOptions& o, uint64_t job_id, uid_t uid, pid_t pid,
                uint64_t start_time, std::chrono::milliseconds wait) {
  if (DetectCgroupVersion(o.root) != CgroupVersion::kV1) return false;
  // The detached process, reparented to init, waits for the cgroup.
  switch (launch::Detach()) {
    case launch::Detached::kFailed:
      return false;
    case launch::Detached::kCaller:
      return true;
    case launch::Detached::kDetached:
      break;
  }
  ::openlog("nopfs-job", LOG_PID, LOG_DAEMON);
  const auto deadline = std::chrono::steady_clock::now() + wait;
  // The extern step tells that slurmd has set the job's directories up (the cpuset's cpus and
  // mems, the memory limit). memory and cpuset are the point: wait for each by name where it is
  // mounted. slurmd makes a step's directories one controller after another (freezer, then
  // cpuset, then memory), so a count of what exists could be met before memory is there.
  std::vector<std::string> required;
  for (const std::string& c : o.controllers) {
    if ((c == "memory" || c == "cpuset") && IsDir(o.root + "/" + c)) required.push_back(c);
  }
  std::vector<std::string> dirs;
  while (true) {
    const std::vector<std::string> steps = FindJobCgroups(o, job_id, uid, true);
    std::string missing;
    for (const std::string& c : required) {
      const std::string under = o.root + "/" + c + "/";
      bool found = false;
      for (const std::string& d : steps)
        found = found || d.compare(0, under.size(), under) == 0;
      if (!found) missing += (missing.empty() ? "" : " and ") + c;
    }
    const bool late = std::chrono::steady_clock::now() >= deadline;
    if (missing.empty() || (late && !steps.empty())) {
      if (StartTime(pid) != start_time) _exit(0);  // nopfsd is gone; its pid means someone else
      dirs = FindJobCgroups(o, job_id, uid, false);
      // A cpuset directory refuses tasks (ENOSPC) until slurmd has written its cpus and mems:
      // try again until the deadline. Writing a pid where it already is changes nothing.
      const Status s = AdoptInto(dirs, pid);
      if (s.ok() && !missing.empty()) {
        ::syslog(LOG_WARNING,
                 "job %llu: nopfsd %d adopted into %zu cgroups of the job, but the job has no "
                 "%s extern step after %lld ms (ConstrainRAMSpace/ConstrainCores in cgroup.conf?)",
                 static_cast<unsigned long long>(job_id), static_cast<int>(pid), dirs.size(),
                 missing.c_str(), static_cast<long long>(wait.count()));
        _exit(0);
      }
      if (s.ok()) break;
      if (late) {
        ::syslog(LOG_ERR, "job %llu: adopting nopfsd %d: %s",
                 static_cast<unsigned long long>(job_id), static_cast<int>(pid),
                 s.message().c_str());
        _exit(1);
      }
    } else if (late) {
      ::syslog(LOG_WARNING,
               "job %llu: no step_extern cgroup within %lld ms (PrologFlags=Contain and "
               "task/cgroup?); nopfsd %d stays in the cgroups it started in",
               static_cast<unsigned long long>(job_id), static_cast<long long>(wait.count()),
               static_cast<int>(pid));
      _exit(1);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::syslog(LOG_INFO, "job %llu: nopfsd %d adopted into %zu cgroups of the job",
           static_cast<unsigned long long>(job_id), static_cast<int>(pid), dirs.size());
  _exit(0);
}

}  // namespace nopfs::spank
