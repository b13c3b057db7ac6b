// Job cgroup: nopfsd lives in its job's own cgroup, so that the kernel charges every byte it
// allocates (the RAM tier, the rings) to the job and holds it to the job's --mem, and Slurm's end
// of the job does not kill it before it keeps anything.
//
// Slurm 22.05 lays a job's cgroup out, for cgroup v1 (one hierarchy per controller):
//   <root>/<controller>/slurm[_<node>]/uid_<uid>/job_<job>/step_<step>/
// and for cgroup v2 (one unified hierarchy, processes only in leaves):
//   <root>/system.slice/[<node>_]slurmstepd.scope/job_<job>/step_<step>/{slurm,user/task_<n>}
// (`slurm_<node>` and `<node>_` where the build runs several slurmd per host, as Debian's does).
// slurmd makes these after the job's prolog, and takes a directory that is already there as its
// own (mkdir's EEXIST is not an error to it). So the prolog makes the job's directory first
// (PrepareJobCgroup), with the job's memory limit, and nopfsd joins it before exec
// (launch::Child::Options::cgroup_fds): charged to the job from its first byte, since the kernel
// moves no charges with a process (v1's move_charge_at_immigrate is gone from current kernels,
// v2 never had it). Where it lives:
//   v1  the job's directory itself, in the memory controller at start; cpuset, cpuacct and
//       devices once slurmd has set them up (AdoptLater), never the freezer, which is the
//       container proctrack/cgroup SIGKILLs at the job's end
//   v2  a leaf `nopfs` of the job's directory (the job's own limits hold it; the steps are
//       siblings, whose end kills only their own leaves)
// slurmd cannot remove the job's directory while nopfsd is in it; the epilog, after stopping
// nopfsd, does (RemoveJobCgroup). Every change below a hierarchy's top is made under the flock
// slurmstepd takes on that top directory, so that a step starting meanwhile never loses its
// parent.
//
// Thread safety: reentrant. AdoptLater forks.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"

namespace nopfs::spank {

enum class CgroupVersion { kNone, kV1, kV2 };

struct JobCgroupOptions {
  std::string root = "/sys/fs/cgroup";  // where cgroups are mounted (cgroup.conf CgroupMountpoint)
  std::string node;                     // this slurmd's node name
  // v1: the controllers nopfsd joins, at the job's level (memory first, at its start).
  std::vector<std::string> controllers = {"memory", "cpuset", "cpuacct", "devices"};
};

// What the node mounts at `root`: v2 when it is the unified hierarchy (cgroup.controllers at
// its top), v1 when a memory controller is mounted below it, none otherwise.
CgroupVersion DetectCgroupVersion(const std::string& root);

// How slurmctld runs jobs on cgroups: task/cgroup (the memory limit) and PrologFlags=Contain (an
// extern step). Both false when slurmctld cannot be asked.
struct SlurmCgroups {
  bool task_cgroup = false;
  bool contain = false;
};
SlurmCgroups AskSlurmCgroups();

// The job's cgroup as PrepareJobCgroup made it: where nopfsd starts, and that place's
// cgroup.procs open for writing (for launch::Child::Options::cgroup_fds).
struct JobCgroup {
  CgroupVersion version = CgroupVersion::kNone;
  std::string dir;     // where nopfsd starts (v1: the memory controller's job directory)
  UniqueFd procs;      // <dir>/cgroup.procs
  uint64_t limit = 0;  // the memory limit written, in bytes (0: none)
  std::string note;    // for the prolog's line: "cgroup v2 job_7/nopfs, memory limit 300 MiB"
};

// Makes the job's cgroup directory as slurmd will (see above), writes `memory` (the job's memory
// on this node in bytes; 0: unknown, no limit written) as its limit, and makes nopfsd's place in
// it. NotFound when the node has no cgroup hierarchy Slurm would use (no v1 memory controller, no
// slurmstepd scope on v2); any other error names the file.
Result<JobCgroup> PrepareJobCgroup(const JobCgroupOptions& options, uint64_t job_id, uid_t uid,
                                   uint64_t memory);

// After the job's nopfsd has stopped: removes nopfsd's place (v2), and the job's and the user's
// directories where they are empty (what slurmd left because nopfsd was in them; a directory
// with processes, or another job's, stays). Returns what should have gone and did not (empty:
// nothing), naming each directory.
std::string RemoveJobCgroup(const JobCgroupOptions& options, uint64_t job_id, uid_t uid);

// v1: the job's directories (with `extern_step`, their step_extern) that exist now, one per
// controller of options.controllers that has one.
std::vector<std::string> FindJobCgroups(const JobCgroupOptions& options, uint64_t job_id, uid_t uid,
                                        bool extern_step);

// Writes `pid` to cgroup.procs of every directory in `dirs`. An error names the file.
Status AdoptInto(const std::vector<std::string>& dirs, pid_t pid);

// v1 with PrologFlags=Contain: forks a detached child (its own session, stdio on /dev/null) that
// waits up to `wait` for the job's extern step (slurmd has set the job's cpuset and memory up by
// then), adopts `pid` into the job's directory of every controller of options.controllers (if
// the pid still has `start_time`, its start in clock ticks from /proc/<pid>/stat, so that a
// recycled pid is never moved) and logs the outcome to syslog. Returns at once; false when no
// cgroup v1 memory controller is mounted (nothing to wait for).
bool AdoptLater(const JobCgroupOptions& options, uint64_t job_id, uid_t uid, pid_t pid,
                uint64_t start_time, std::chrono::milliseconds wait);

}  // namespace nopfs::spank
