#include "spank/job_cgroup.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <syslog.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <thread>

extern "C" {
#include <slurm/slurm.h>
}

namespace nopfs::spank {
namespace {

bool IsDir(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Field 22 of /proc/<pid>/stat (after the parenthesized command, which may hold anything).
uint64_t StartTime(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(text.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && rest >> field; ++i) {
    if (i == 22) return std::stoull(field);
  }
  return 0;
}

}  // namespace

std::vector<std::string> FindExternCgroups(const JobCgroupOptions& o, uint64_t job_id, uid_t uid) {
  std::vector<std::string> found;
  const std::string below =
      "/uid_" + std::to_string(uid) + "/job_" + std::to_string(job_id) + "/step_extern";
  for (const std::string& c : o.controllers) {
    for (const std::string& top : {"slurm_" + o.node, std::string("slurm")}) {
      if (top == "slurm_") continue;  // no node name given
      const std::string d = o.root + "/" + c + "/" + top + below;
      if (IsDir(d)) {
        found.push_back(d);
        break;
      }
    }
  }
  return found;
}

Status AdoptInto(const std::vector<std::string>& dirs, pid_t pid) {
  for (const std::string& d : dirs) {
    const std::string file = d + "/cgroup.procs";
    const int fd = ::open(file.c_str(), O_WRONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return Status::FromErrno(errno, file);
    const std::string text = std::to_string(pid) + "\n";
    const ssize_t n = ::write(fd, text.data(), text.size());
    const int err = errno;
    ::close(fd);
    if (n != static_cast<ssize_t>(text.size())) {
      return Status::FromErrno(n < 0 ? err : EIO,
                               "writing pid " + std::to_string(pid) + " to " + file);
    }
  }
  return Status::Ok();
}

bool SlurmContainsJobs() {
  slurm_conf_t* conf = nullptr;
  if (slurm_load_ctl_conf(0, &conf) != SLURM_SUCCESS || conf == nullptr) return true;
  const bool contain = (conf->prolog_flags & PROLOG_FLAG_CONTAIN) != 0;
  slurm_free_ctl_conf(conf);
  return contain;
}

bool AdoptLater(const JobCgroupOptions& o, uint64_t job_id, uid_t uid, pid_t pid,
                uint64_t start_time, std::chrono::milliseconds wait) {
  if (!IsDir(o.root + "/memory")) return false;
  const pid_t child = ::fork();
  if (child < 0) return false;
  if (child > 0) {
    int status = 0;
    while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
    }
    return true;
  }
  // The middle process exits at once; its child, reparented to init, waits for the cgroup.
  ::setsid();
  if (::fork() != 0) _exit(0);
  const int null_fd = ::open("/dev/null", O_RDWR);
  if (null_fd >= 0) {
    ::dup2(null_fd, 0);
    ::dup2(null_fd, 1);
    ::dup2(null_fd, 2);
  }
  ::close_range(3, ~0U, 0);
  ::signal(SIGHUP, SIG_IGN);
  ::openlog("nopfs-job", LOG_PID, LOG_DAEMON);
  const auto deadline = std::chrono::steady_clock::now() + wait;
  // memory and cpuset are the point: wait for each by name where it is mounted. slurmd makes a
  // step's directories one controller after another (freezer, then cpuset, then memory), so a
  // count of what exists could be met by freezer and cpuset before memory is there.
  std::vector<std::string> required;
  for (const std::string& c : o.controllers) {
    if ((c == "memory" || c == "cpuset") && IsDir(o.root + "/" + c)) required.push_back(c);
  }
  std::vector<std::string> dirs;
  while (true) {
    dirs = FindExternCgroups(o, job_id, uid);
    std::string missing;
    for (const std::string& c : required) {
      const std::string under = o.root + "/" + c + "/";
      bool found = false;
      for (const std::string& d : dirs)
        found = found || d.compare(0, under.size(), under) == 0;
      if (!found) missing += (missing.empty() ? "" : " and ") + c;
    }
    const bool late = std::chrono::steady_clock::now() >= deadline;
    if (missing.empty() || (late && !dirs.empty())) {
      if (StartTime(pid) != start_time) _exit(0);  // nopfsd is gone; its pid means someone else
      // A cpuset directory refuses tasks (ENOSPC) until slurmd has written its cpus and mems:
      // try again until the deadline. Writing a pid where it already is changes nothing.
      const Status s = AdoptInto(dirs, pid);
      if (s.ok() && !missing.empty()) {
        ::syslog(LOG_WARNING,
                 "job %llu: nopfsd %d adopted into %zu cgroups of step_extern, but the job has no "
                 "%s cgroup after %lld ms (ConstrainRAMSpace/ConstrainCores in cgroup.conf?)",
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
               "proctrack/cgroup?); nopfsd %d stays outside the job's cgroup",
               static_cast<unsigned long long>(job_id), static_cast<long long>(wait.count()),
               static_cast<int>(pid));
      _exit(1);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::syslog(LOG_INFO, "job %llu: nopfsd %d adopted into %zu cgroups of step_extern",
           static_cast<unsigned long long>(job_id), static_cast<int>(pid), dirs.size());
  _exit(0);
}

}  // namespace nopfs::spank
