#include "cli/process.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

extern char** environ;  // NOLINT: POSIX

namespace nopfs::cli {

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
  const std::map<std::string, std::string>& env = options.env;
  const std::vector<int>& keep_fds = options.keep_fds;
  const bool new_group = options.new_group;
  const pid_t parent = getpid();
  if (argv.empty()) return Status::InvalidArgument("no command to run");
  // Everything the child needs is built before fork: after fork only async-signal-safe calls.
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    const char* eq = std::strchr(*e, '=');
    const std::string name = eq ? std::string(*e, static_cast<size_t>(eq - *e)) : std::string(*e);
    if (env.count(name) == 0) env_strings.emplace_back(*e);
  }
  for (const auto& [k, v] : env)
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

  // The child reports an exec failure through a close-on-exec pipe.
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
    if (new_group) setpgid(0, 0);
    const auto fail = [&](int e) {
      ssize_t ignored = write(err_pipe[1], &e, sizeof(e));
      (void)ignored;
      _exit(127);
    };
    if (options.netns_fd >= 0 && setns(options.netns_fd, CLONE_NEWNET) != 0) fail(errno);
    if (options.switch_user) {
      // Groups first: once the uid is dropped they can no longer be changed.
      if (setgroups(0, nullptr) != 0) fail(errno);
      if (setresgid(options.gid, options.gid, options.gid) != 0) fail(errno);
      if (setresuid(options.uid, options.uid, options.uid) != 0) fail(errno);
    }
    // After the credentials change: a change of credentials clears the parent-death signal.
    if (options.die_with_parent) {
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (getppid() != parent) _exit(127);  // the parent died before prctl took effect
    }
    // Close inherited descriptors except stdio, the error pipe and the ones asked for.
    const int max_fd = static_cast<int>(sysconf(_SC_OPEN_MAX) > 0 ? sysconf(_SC_OPEN_MAX) : 1024);
    for (int fd = 3; fd < max_fd && fd < 65536; ++fd) {
      if (fd == err_pipe[1]) continue;
      if (std::find(keep_fds.begin(), keep_fds.end(), fd) != keep_fds.end()) continue;
      close(fd);
    }
    for (int fd : keep_fds) {
      const int flags = fcntl(fd, F_GETFD);
      if (flags >= 0) fcntl(fd, F_SETFD, flags & ~FD_CLOEXEC);
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execvpe(argp[0], argp.data(), envp.data());
    fail(errno);
  }
  if (new_group) setpgid(pid, pid);  // also from the parent: no race with Signal()
  close(err_pipe[1]);
  int child_errno = 0;
  ssize_t n;
  do {
    n = read(err_pipe[0], &child_errno, sizeof(child_errno));
  } while (n < 0 && errno == EINTR);
  close(err_pipe[0]);
  Child child(pid);
  if (n == static_cast<ssize_t>(sizeof(child_errno))) {
    (void)child.Wait();
    return Status::FromErrno(child_errno, "cannot run '" + argv[0] + "'");
  }
  return child;
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

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) return "exited " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const char* name = sigabbrev_np(WTERMSIG(status));
    return std::string("killed by SIG") + (name ? name : std::to_string(WTERMSIG(status)).c_str());
  }
  return "ended with status " + std::to_string(status);
}

int ExitCodeOf(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace nopfs::cli
