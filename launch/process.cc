#include "launch/process.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

extern char** environ;  // NOLINT: POSIX

namespace nopfs::launch {
namespace {

// What the child did when it failed before exec, reported on the error pipe.
enum class Step : int {
  kCgroup,
  kSession,
  kNetns,
  kGroups,
  kGid,
  kUid,
  kRootKept,
  kCaps,
  kCwd,
  kOutput,
  kStdio,
  kExec
};

const char* StepName(Step s) {
  switch (s) {
    case Step::kCgroup:
      return "joining its cgroup";
    case Step::kSession:
      return "setsid";
    case Step::kNetns:
      return "entering the network namespace";
    case Step::kGroups:
      return "setgroups";
    case Step::kGid:
      return "setresgid";
    case Step::kUid:
      return "setresuid";
    case Step::kRootKept:
      return "dropping root for good";
    case Step::kCaps:
      return "keeping its ambient capabilities";
    case Step::kCwd:
      return "changing directory";
    case Step::kOutput:
      return "creating the output file";
    case Step::kStdio:
      return "dup2";
    case Step::kExec:
      break;
  }
  return "exec";
}

// The capabilities in `caps` as the two 32-bit words of capset's version 3.
void CapWords(const std::vector<int>& caps, uint32_t words[2]) {
  words[0] = words[1] = 0;
  for (int c : caps) {
    if (c >= 0 && c < 64) words[c / 32] |= uint32_t{1} << (c % 32);
  }
}

struct ChildError {
  Step step;
  int err;
};

}  // namespace

Child& Child::operator=(Child&& o) noexcept {
  if (this != &o) {
    if (pid_ > 0) {
      Signal(SIGKILL);
      (void)Wait();
    }
    pid_ = o.pid_;
    o.pid_ = -1;
  }
  return *this;
}

Child::~Child() {
  if (pid_ > 0) {
    Signal(SIGKILL);
    (void)Wait();
  }
}

Result<Child> Child::Spawn(const std::vector<std::string>& argv, const Options& options) {
  const pid_t parent = getpid();
  if (argv.empty()) return Status::InvalidArgument("no command to run");
  // Everything the child needs is built before fork: after fork only async-signal-safe calls.
  std::vector<std::string> env_strings;
  if (!options.clear_env) {
    for (char** e = environ; *e != nullptr; ++e) {
      const char* eq = std::strchr(*e, '=');
      const std::string name = eq ? std::string(*e, static_cast<size_t>(eq - *e)) : std::string(*e);
      if (options.env.count(name) == 0) env_strings.emplace_back(*e);
    }
  }
  for (const auto& [k, v] : options.env)
    env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (std::string& s : env_strings)
    envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = argv;
  std::vector<char*> argp;
  for (std::string& s : args)
    argp.push_back(s.data());
  argp.push_back(nullptr);
  const std::vector<int>& keep_fds = options.keep_fds;
  const bool keep_caps = options.switch_user && !options.ambient_caps.empty();
  uint32_t cap_words[2];
  CapWords(options.ambient_caps, cap_words);
  const int max_fd = static_cast<int>(
      std::min<long>(sysconf(_SC_OPEN_MAX) > 0 ? sysconf(_SC_OPEN_MAX) : 1024, 65536));

  // The child reports a failure before exec through a close-on-exec pipe.
  int err_pipe[2];
  if (pipe2(err_pipe, O_CLOEXEC) != 0) return Status::FromErrno(errno, "pipe2");
  const pid_t pid = fork();
  if (pid < 0) {
    const int e = errno;
    close(err_pipe[0]);
    close(err_pipe[1]);
    return Status::FromErrno(e, "fork");
  }
  if (pid == 0) {
    const auto fail = [&](Step step, int e) {
      const ChildError ce{step, e};
      ssize_t ignored = write(err_pipe[1], &ce, sizeof(ce));
      (void)ignored;
      _exit(127);
    };
    for (int fd : options.cgroup_fds) {
      // "0": the writing process (cgroup v1 and v2).
      if (write(fd, "0\n", 2) != 2) fail(Step::kCgroup, errno);
    }
    if (options.new_session) {
      if (setsid() < 0) fail(Step::kSession, errno);
    } else if (options.new_group) {
      setpgid(0, 0);
    }
    if (options.netns_fd >= 0 && setns(options.netns_fd, CLONE_NEWNET) != 0) {
      fail(Step::kNetns, errno);
    }
    if (options.switch_user) {
      if (keep_caps) {
        // While still root: every capability but the kept ones leaves the bounding set (no
        // later exec can bring one back), and the permitted set survives the uid change.
        for (int c = 0; c < 64; ++c) {
          const bool kept = (cap_words[c / 32] >> (c % 32) & 1) != 0;
          if (!kept && prctl(PR_CAPBSET_DROP, c, 0, 0, 0) != 0 && errno != EINVAL) {
            fail(Step::kCaps, errno);
          }
        }
        if (prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0) != 0) fail(Step::kCaps, errno);
      }
      // Groups first: once the uid is dropped they can no longer be changed.
      if (setgroups(options.groups.size(), options.groups.data()) != 0) fail(Step::kGroups, errno);
      if (setresgid(options.gid, options.gid, options.gid) != 0) fail(Step::kGid, errno);
      if (setresuid(options.uid, options.uid, options.uid) != 0) fail(Step::kUid, errno);
      if (options.uid != 0 && setuid(0) == 0) fail(Step::kRootKept, EPERM);
      if (keep_caps) {
        // The kept capabilities only: permitted, effective and inheritable (which the ambient
        // set requires), then raised as ambient so that they survive exec of a plain program.
        __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
        __user_cap_data_struct data[2] = {};
        for (int w = 0; w < 2; ++w)
          data[w].effective = data[w].permitted = data[w].inheritable = cap_words[w];
        if (syscall(SYS_capset, &header, data) != 0) fail(Step::kCaps, errno);
        for (int c : options.ambient_caps) {
          if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, c, 0, 0) != 0) fail(Step::kCaps, errno);
        }
        if (prctl(PR_SET_KEEPCAPS, 0, 0, 0, 0) != 0) fail(Step::kCaps, errno);
      }
    }
    // After the credentials change: a change of credentials clears the parent-death signal.
    if (options.die_with_parent) {
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (getppid() != parent) _exit(127);  // the parent died before prctl took effect
    }
    if (!options.cwd.empty() && chdir(options.cwd.c_str()) != 0) fail(Step::kCwd, errno);
    int out_fd = options.stdout_fd;
    int err_fd = options.stderr_fd;
    if (!options.output_path.empty()) {
      out_fd = open(options.output_path.c_str(),
                    O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
      if (out_fd < 0) fail(Step::kOutput, errno);
      err_fd = out_fd;
    }
    for (auto [from, to] :
         {std::pair{options.stdin_fd, 0}, std::pair{out_fd, 1}, std::pair{err_fd, 2}}) {
      if (from >= 0 && from != to && dup2(from, to) != to) fail(Step::kStdio, errno);
      if (from == to) fcntl(to, F_SETFD, 0);
    }
    // Close inherited descriptors except stdio, the error pipe and the ones asked for.
    for (int fd = 3; fd < max_fd; ++fd) {
      if (fd == err_pipe[1]) continue;
      if (std::find(keep_fds.begin(), keep_fds.end(), fd) != keep_fds.end()) continue;
      close(fd);
    }
    for (int fd : keep_fds) {
      const int flags = fcntl(fd, F_GETFD);
      if (flags >= 0) fcntl(fd, F_SETFD, flags & ~FD_CLOEXEC);
    }
    // A clean start: the signals this process handles or ignores are the defaults again.
    for (int sig : {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGCHLD})
      signal(sig, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execvpe(argp[0], argp.data(), envp.data());
    fail(Step::kExec, errno);
  }
  if (options.new_group && !options.new_session) setpgid(pid, pid);  // no race with Signal()
  close(err_pipe[1]);
  ChildError ce{};
  ssize_t n;
  do {
    n = read(err_pipe[0], &ce, sizeof(ce));
  } while (n < 0 && errno == EINTR);
  close(err_pipe[0]);
  Child child(pid);
  if (n == static_cast<ssize_t>(sizeof(ce))) {
    (void)child.Wait();
    if (ce.step == Step::kExec) return Status::FromErrno(ce.err, "cannot run '" + argv[0] + "'");
    return Status::FromErrno(ce.err, "cannot run '" + argv[0] + "': " + StepName(ce.step));
  }
  return child;
}

pid_t Child::Release() {
  const pid_t p = pid_;
  pid_ = -1;
  return p;
}

void Child::Signal(int sig) const {
  if (pid_ <= 0) return;
  if (kill(-pid_, sig) != 0) kill(pid_, sig);
}

Result<int> Child::Wait(std::chrono::milliseconds timeout) {
  if (pid_ <= 0) return Status::FailedPrecondition("no child to wait for");
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      pid_ = -1;
      return status;
    }
    if (r < 0 && errno != EINTR) return Status::FromErrno(errno, "waitpid");
    if (std::chrono::steady_clock::now() >= deadline) {
      return Status::TimedOut("process " + std::to_string(pid_) + " still running");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
}

Result<int> Child::Wait() {
  if (pid_ <= 0) return Status::FailedPrecondition("no child to wait for");
  int status = 0;
  pid_t r;
  do {
    r = waitpid(pid_, &status, 0);
  } while (r < 0 && errno == EINTR);
  if (r < 0) return Status::FromErrno(errno, "waitpid");
  pid_ = -1;
  return status;
}

Detached Detach() {
  const pid_t child = ::fork();
  if (child < 0) return Detached::kFailed;
  if (child > 0) {
    int status = 0;
    while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
    }
    return Detached::kCaller;
  }
  // The middle process exits at once; its child, reparented to init, goes on.
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
  return Detached::kDetached;
}

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) return "exited " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const char* name = sigabbrev_np(WTERMSIG(status));
    return std::string("killed by SIG") + (name ? name : std::to_string(WTERMSIG(status)).c_str());
  }
  return "ended with status " + std::to_string(status);
}

Status DropAllCapabilities() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  if (syscall(SYS_capget, &header, data) != 0) return Status::FromErrno(errno, "capget");
  bool held = false;
  for (const auto& d : data)
    held |= (d.permitted | d.effective | d.inheritable) != 0;
  for (int c = 0; c < 64 && !held; ++c)
    held = prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_IS_SET, c, 0, 0) == 1;
  if (held) {
    int threads = 0;
    if (DIR* d = opendir("/proc/self/task")) {
      while (const dirent* e = readdir(d))
        threads += e->d_name[0] != '.';
      closedir(d);
    }
    if (threads != 1) {
      return Status::FailedPrecondition(
          "cannot drop capabilities: the process has " + std::to_string(threads) +
          " threads, and a capability belongs to a thread (drop them before starting any)");
    }
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0) {
      return Status::FromErrno(errno, "clearing the ambient capabilities");
    }
    // Emptying the bounding set needs CAP_SETPCAP: a process that has it drops every one.
    for (int c = 0; c < 64; ++c)
      (void)prctl(PR_CAPBSET_DROP, c, 0, 0, 0);
    __user_cap_data_struct none[2] = {};
    if (syscall(SYS_capset, &header, none) != 0) {
      return Status::FromErrno(errno, "dropping the capabilities");
    }
  }
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
    return Status::FromErrno(errno, "setting no_new_privs");
  }
  return Status::Ok();
}

Result<std::vector<gid_t>> GroupsOf(const std::string& user, gid_t gid) {
  int n = 64;
  for (int attempt = 0; attempt < 4; ++attempt) {
    std::vector<gid_t> groups(static_cast<size_t>(n));
    int got = n;
    if (getgrouplist(user.c_str(), gid, groups.data(), &got) >= 0) {
      groups.resize(static_cast<size_t>(got));
      return groups;
    }
    n = std::max(got, n * 4);
  }
  return Status::ResourceExhausted("the groups of " + user + ": too many");
}

int ExitCodeOf(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace nopfs::launch
