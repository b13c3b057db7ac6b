// Child processes: spawn with an identity, an environment, descriptors and a directory; wait
// with a deadline; signal. Every program that starts another uses this: `nopfs run` (nopfsd and
// the ranks), nopfs-job (nopfsd as the job's user) and the SPANK plugin (nopfs-job with a time
// limit).
//
// Thread safety: functions are reentrant; a Child is owned by one thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"

namespace nopfs::launch {

class Child {
 public:
  Child() = default;
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  Child(Child&& o) noexcept : pid_(o.pid_) { o.pid_ = -1; }
  Child& operator=(Child&& o) noexcept;
  // Kills (SIGKILL) and reaps a child still running when its owner goes away (see Release).
  ~Child();

  struct Options {
    // Added to this process's environment (these win); with clear_env the child's whole
    // environment.
    std::map<std::string, std::string> env;
    bool clear_env = false;
    std::vector<int> keep_fds;     // descriptors the child keeps besides 0, 1, 2
    bool new_group = true;         // own process group, so that a signal to it reaches its children
    bool new_session = false;      // own session (setsid): no controlling terminal; implies a group
    bool die_with_parent = false;  // SIGTERM when this process dies (PR_SET_PDEATHSIG)
    // Descriptors of cgroup.procs files (opened for writing) the child joins first, while it
    // still has this process's credentials, so that everything it allocates is charged there.
    std::vector<int> cgroup_fds;
    // Network namespace to enter before exec (an open descriptor of e.g. /run/netns/NAME; needs
    // CAP_SYS_ADMIN), or -1.
    int netns_fd = -1;
    // User to become before exec (needs root): supplementary groups set to `groups` (none when
    // empty), then gid, then uid; the child checks that root cannot be regained.
    bool switch_user = false;
    uid_t uid = 0;
    gid_t gid = 0;
    std::vector<gid_t> groups;
    // Capabilities (CAP_NET_BIND_SERVICE, ...) the child keeps across the user switch, as ambient
    // capabilities that the program it runs then holds (effective and permitted); every other
    // capability leaves its bounding set. Only with switch_user; empty: none (the default).
    std::vector<int> ambient_caps;
    // Directory to change to after the user switch (as the user); empty: stay.
    std::string cwd;
    // Standard descriptors: a descriptor of this process to give the child as 0, 1 or 2, or -1 to
    // keep this process's. A path for stdout and stderr instead: created (mode 0600, truncated,
    // never through a symbolic link) by the child after the user switch and cwd, as the user.
    int stdin_fd = -1;
    int stdout_fd = -1;
    int stderr_fd = -1;
    std::string output_path;
  };
  // Starts argv[0] (searched in PATH when it has no '/'). Descriptors other than 0, 1, 2 and
  // keep_fds are closed in the child. A failure before exec (the user switch, cwd, the output
  // file, exec itself) is returned as the errno it got, with the step that failed.
  static Result<Child> Spawn(const std::vector<std::string>& argv, const Options& options);

  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0; }

  // Gives up ownership: the child is neither killed nor reaped by this Child (a daemon that
  // outlives its launcher). Returns its pid.
  pid_t Release();

  // Sends `sig` to the child's process group (or to the child if it has none).
  void Signal(int sig) const;

  // Waits up to `timeout` for the child to exit. Returns its wait status (as from waitpid), or
  // TimedOut. After success the Child is no longer running.
  Result<int> Wait(std::chrono::milliseconds timeout);
  // Waits without a deadline.
  Result<int> Wait();

 private:
  explicit Child(pid_t pid) : pid_(pid) {}
  pid_t pid_ = -1;
};

// Starts a background process that outlives this one and any session it was in (a double fork):
// this process forks; the child starts a session (setsid), forks again and exits at once, so
// that the grandchild is reparented to init; this process reaps the child before it returns.
// The grandchild has /dev/null as 0, 1 and 2, no other descriptor, and SIGHUP ignored. Returns,
// like fork, in both: kCaller in this process (kFailed, with nothing started, when the first
// fork failed), kDetached in the grandchild, which must end with exec or _exit. Meant for a
// single-threaded process: the grandchild of a threaded one may only make async-signal-safe calls.
enum class Detached { kFailed, kCaller, kDetached };
Detached Detach();

// "exited 3", "killed by SIGSEGV".
std::string DescribeWaitStatus(int status);

// The exit code a shell would give for a wait status (128 + signal for a signal).
int ExitCodeOf(int status);

// Gives up every capability this process holds for good: ambient, inheritable, permitted and
// effective emptied, the bounding set emptied as far as the process may (that needs
// CAP_SETPCAP, which a process started with ambient_caps does not hold: its bounding set keeps
// only what was kept), and no_new_privs set, so that no exec can bring any back. Capabilities
// belong to threads: FailedPrecondition, with nothing dropped, when the process holds one and
// has more than one thread (a thread started before would keep it). A process that holds none
// only gets no_new_privs.
Status DropAllCapabilities();

// The supplementary groups of `user` with `gid` (getgrouplist), for Options::groups.
Result<std::vector<gid_t>> GroupsOf(const std::string& user, gid_t gid);

}  // namespace nopfs::launch
