// Job cgroup: moves nopfsd into its job's own cgroup, the way pam_slurm_adopt adopts an ssh
// session, so that the kernel holds it to the job's memory limit and cpuset and Slurm counts it.
//
// With cgroup v1 and `ProctrackType=proctrack/cgroup`, `TaskPlugin=task/cgroup` and
// `PrologFlags=Contain`, slurmd makes, for each controller, after the job prolog has returned:
//   <root>/<controller>/slurm[_<node>]/uid_<uid>/job_<job>/step_extern/
// (`slurm_<node>` when several slurmd share a host, as in contrib/slurm/local-cluster). Adopting
// a process is writing its pid to `cgroup.procs` there, for every controller that has the
// directory. Because the extern step appears only after the prolog, AdoptLater() leaves a
// detached root child that waits for it and adopts nopfsd then.
//
// Thread safety: reentrant. AdoptLater forks.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace nopfs::spank {

struct JobCgroupOptions {
  std::string root = "/sys/fs/cgroup";  // where the v1 controllers are mounted
  std::vector<std::string> controllers = {"memory", "cpuset", "cpuacct", "freezer", "devices"};
  std::string node;  // this slurmd's node name (for slurm_<node>)
};

// The job's step_extern directories that exist now, one per controller that has one.
std::vector<std::string> FindExternCgroups(const JobCgroupOptions& options, uint64_t job_id,
                                           uid_t uid);

// Writes `pid` to cgroup.procs of every directory in `dirs`. An error names the file.
Status AdoptInto(const std::vector<std::string>& dirs, pid_t pid);

// Whether slurmctld's configuration has PrologFlags=Contain (an extern step per job, the only
// cgroup nopfsd can join). True when slurmctld cannot be asked (AdoptLater then just waits).
bool SlurmContainsJobs();

// Forks a detached child (its own session, stdio on /dev/null) that waits up to `wait` for the
// job's step_extern cgroups, adopts `pid` (if it still has `start_time`, its start in clock ticks
// from /proc/<pid>/stat, so that a recycled pid is never moved) and logs the outcome to syslog.
// Returns at once; false when no cgroup v1 memory controller is mounted (nothing to wait for).
bool AdoptLater(const JobCgroupOptions& options, uint64_t job_id, uid_t uid, pid_t pid,
                uint64_t start_time, std::chrono::milliseconds wait);

}  // namespace nopfs::spank
