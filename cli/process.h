// Child processes for `nopfs run`: spawn with an environment, wait with a deadline, signal.
//
// Thread safety: functions are reentrant; a Child is owned by one thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"

namespace nopfs::cli {

class Child {
 public:
  Child() = default;
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  Child(Child&& o) noexcept : pid_(o.pid_) { o.pid_ = -1; }
  Child& operator=(Child&& o) noexcept;
  // Kills (SIGKILL) and reaps a child still running when its owner goes away.
  ~Child();

  struct Options {
    std::map<std::string, std::string> env;  // added to this process's environment (these win)
    std::vector<int> keep_fds;               // descriptors the child keeps besides 0, 1, 2
    bool new_group = true;         // own process group, so that a signal to it reaches its children
    bool die_with_parent = false;  // SIGTERM when this process dies (PR_SET_PDEATHSIG)
    // Network namespace to enter before exec (an open descriptor of e.g. /run/netns/NAME; needs
    // CAP_SYS_ADMIN), or -1.
    int netns_fd = -1;
    // User to become before exec (needs root): supplementary groups cleared, then gid, then uid.
    bool switch_user = false;
    uid_t uid = 0;
    gid_t gid = 0;
  };
  // Starts argv[0] (searched in PATH when it has no '/'). Descriptors other than 0, 1, 2 and
  // keep_fds are closed in the child. An exec failure is returned as the errno it got.
  static Result<Child> Spawn(const std::vector<std::string>& argv, const Options& options);

  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0; }

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

// "exited 3", "killed by SIGSEGV".
std::string DescribeWaitStatus(int status);

// The exit code a shell would give for a wait status (128 + signal for a signal).
int ExitCodeOf(int status);

}  // namespace nopfs::cli
