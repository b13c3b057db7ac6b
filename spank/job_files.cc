#include "spank/job_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include "common/small_file.h"
#include "spank/ledger.h"

namespace nopfs::spank {
namespace {

constexpr int kMaxDepth = 64;

// glibc 2.36's <sys/pidfd.h> lacks extern "C"; the system calls are called directly.
int PidfdOpen(pid_t pid) {
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
}
int PidfdSignal(int pidfd, int sig) {
  return static_cast<int>(::syscall(SYS_pidfd_send_signal, pidfd, sig, nullptr, 0));
}

Status CheckName(const std::string& name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) {
    return Status::InvalidArgument("bad name '" + name + "'");
  }
  return Status::Ok();
}

Status RemoveAt(int parent_fd, const std::string& name, const std::string& shown, int depth) {
  if (depth > kMaxDepth) return Status::FailedPrecondition(shown + ": nested too deeply");
  const int fd = ::openat(parent_fd, name.c_str(),
                          O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) return Status::Ok();
    if (errno == ENOTDIR || errno == ELOOP) {  // a file or a link: unlink the entry itself
      if (::unlinkat(parent_fd, name.c_str(), 0) != 0 && errno != ENOENT) {
        return Status::FromErrno(errno, "unlink " + shown);
      }
      return Status::Ok();
    }
    return Status::FromErrno(errno, "open " + shown);
  }
  DIR* d = ::fdopendir(fd);
  if (d == nullptr) {
    const int err = errno;
    ::close(fd);
    return Status::FromErrno(err, "opendir " + shown);
  }
  Status first;
  std::vector<std::string> names;
  while (dirent* ent = ::readdir(d)) {
    const std::string child = ent->d_name;
    if (child != "." && child != "..") names.push_back(child);
  }
  for (const std::string& child : names) {
    Status s = RemoveAt(::dirfd(d), child, shown + "/" + child, depth + 1);
    if (!s.ok() && first.ok()) first = s;
  }
  ::closedir(d);
  if (::unlinkat(parent_fd, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT && first.ok()) {
    first = Status::FromErrno(errno, "rmdir " + shown);
  }
  return first;
}

Result<UniqueFd> WalkTrusted(const std::string& path, bool create, mode_t mode,
                             bool last_may_be_sticky) {
  if (path.empty() || path[0] != '/') {
    return Status::InvalidArgument("'" + path + "': not an absolute path");
  }
  const uid_t me = ::geteuid();
  const std::string fix =
      ": every directory of it must be owned by root and writable only by root (or have the "
      "sticky bit, like /tmp, above the last one); fix its owner and mode, or choose another "
      "path";
  UniqueFd fd(::open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) return Status::FromErrno(errno, "open /");
  std::string shown;
  size_t pos = 0;
  while (true) {
    // The current component is checked before descending (the first round checks "/").
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) return Status::FromErrno(errno, "stat " + shown + "/");
    const size_t next = path.find_first_not_of('/', pos);
    const bool last = next == std::string::npos;
    const bool sticky_ok = !last || last_may_be_sticky;
    const std::string here = shown.empty() ? "/" : shown;
    if (st.st_uid != 0 && st.st_uid != me) {
      return Status::FailedPrecondition(path + ": " + here + " belongs to uid " +
                                        std::to_string(st.st_uid) + fix);
    }
    if ((st.st_mode & 022) != 0 && !(sticky_ok && (st.st_mode & S_ISVTX) != 0)) {
      return Status::FailedPrecondition(path + ": " + here + " is writable by group or others" +
                                        fix);
    }
    if (last) return fd;
    const size_t end = path.find('/', next);
    const std::string name = path.substr(next, end == std::string::npos ? end : end - next);
    pos = end == std::string::npos ? path.size() : end;
    shown += "/" + name;
    if (name == "." || name == "..") {
      return Status::InvalidArgument(path + ": '" + name + "' in the path; write it without");
    }
    if (create && ::mkdirat(fd.get(), name.c_str(), mode) != 0 && errno != EEXIST) {
      return Status::FromErrno(errno, "mkdir " + shown);
    }
    const int child =
        ::openat(fd.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (child < 0) {
      const int err = errno;
      if (err == ENOENT) return Status::NotFound(shown + " does not exist");
      if (err == ELOOP || err == ENOTDIR) {
        return Status::FailedPrecondition(path + ": " + shown +
                                          " is not a directory (a symbolic link or a file)" + fix);
      }
      return Status::FromErrno(err, "open " + shown);
    }
    fd = UniqueFd(child);
  }
}

}  // namespace

Result<std::string> ReadUserFile(int dir_fd, const std::string& name, uid_t owner,
                                 size_t max_bytes) {
  return ReadSmallFileAt(dir_fd, name, SmallFileRules{max_bytes, owner});
}

Result<std::string> ReadUserFile(const std::string& path, uid_t owner, size_t max_bytes) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ReadUserFile(AT_FDCWD, path, owner, max_bytes);
  const std::string dir = slash == 0 ? "/" : path.substr(0, slash);
  const UniqueFd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dfd.get() < 0) {
    if (errno == ENOENT) return Status::NotFound(dir + " does not exist");
    return Status::FromErrno(errno, "open " + dir);
  }
  Result<std::string> r = ReadUserFile(dfd.get(), path.substr(slash + 1), owner, max_bytes);
  if (!r.ok() && r.status().code() != StatusCode::kNotFound) {
    return Status(r.status().code(), dir + "/" + r.status().message());
  }
  return r;
}

Result<UniqueFd> OpenTrustedDir(const std::string& path, bool last_may_be_sticky) {
  return WalkTrusted(path, false, 0, last_may_be_sticky);
}

Result<UniqueFd> MakeTrustedDir(const std::string& path, mode_t mode) {
  return WalkTrusted(path, true, mode, false);
}

Status RemoveBelowAt(int dir_fd, const std::string& name, const std::string& shown) {
  NOPFS_RETURN_IF_ERROR(CheckName(name));
  return RemoveAt(dir_fd, name, shown, 0);
}

Status RemoveBelow(const std::string& parent, const std::string& name) {
  if (Status s = CheckName(name); !s.ok()) return Status::InvalidArgument("remove: " + s.message());
  Result<UniqueFd> pfd = OpenTrustedDir(parent, /*last_may_be_sticky=*/true);
  if (!pfd.ok()) {
    if (pfd.status().code() == StatusCode::kNotFound) return Status::Ok();
    return pfd.status();
  }
  return RemoveBelowAt(pfd->get(), name, parent + "/" + name);
}

Status RemoveBelowUserDir(const std::string& root, const std::string& user_dir, uid_t uid,
                          const std::string& name) {
  for (const std::string* n : {&user_dir, &name}) {
    if (Status s = CheckName(*n); !s.ok()) return Status::InvalidArgument("remove: " + s.message());
  }
  Result<UniqueFd> rfd = OpenTrustedDir(root, /*last_may_be_sticky=*/true);
  if (!rfd.ok()) {
    if (rfd.status().code() == StatusCode::kNotFound) return Status::Ok();
    return rfd.status();
  }
  const std::string shown = root + "/" + user_dir;
  const UniqueFd ufd(::openat(rfd->get(), user_dir.c_str(),
                              O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK));
  if (ufd.get() < 0) {
    const int err = errno;
    if (err == ENOENT) return Status::Ok();
    if (err == ENOTDIR || err == ELOOP) {
      return Status::PermissionDenied(shown + " is not a directory; not touching it");
    }
    return Status::FromErrno(err, "open " + shown);
  }
  struct stat st {};
  Status s;
  if (::fstat(ufd.get(), &st) != 0) {
    s = Status::FromErrno(errno, "stat " + shown);
  } else if (st.st_uid != uid) {
    s = Status::PermissionDenied(shown + " belongs to uid " + std::to_string(st.st_uid) + ", not " +
                                 std::to_string(uid) + "; not touching it");
  } else {
    s = RemoveBelowAt(ufd.get(), name, shown + "/" + name);
  }
  if (s.ok()) ::unlinkat(rfd->get(), user_dir.c_str(), AT_REMOVEDIR);  // only when empty
  return s;
}

Status WriteFileAs(const std::string& dir, const std::string& name, const std::string& text,
                   uid_t uid, gid_t gid, mode_t mode) {
  NOPFS_RETURN_IF_ERROR(CheckName(name));
  const UniqueFd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (dfd.get() < 0) return Status::FromErrno(errno, "open " + dir);
  struct stat st {};
  if (::fstat(dfd.get(), &st) != 0) return Status::FromErrno(errno, "stat " + dir);
  if (st.st_uid != uid && st.st_uid != ::geteuid()) {
    return Status::PermissionDenied(dir + " belongs to uid " + std::to_string(st.st_uid) +
                                    "; not writing into it");
  }
  const std::string tmp = "." + name + ".nopfs-job." + std::to_string(::getpid());
  ::unlinkat(dfd.get(), tmp.c_str(), 0);
  const int fd = ::openat(dfd.get(), tmp.c_str(),
                          O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode & 0600);
  if (fd < 0) return Status::FromErrno(errno, "create " + dir + "/" + tmp);
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
                  ::fchown(fd, uid, gid) == 0 && ::fchmod(fd, mode) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok || ::renameat(dfd.get(), tmp.c_str(), dfd.get(), name.c_str()) != 0) {
    const int e = ok ? errno : err;
    ::unlinkat(dfd.get(), tmp.c_str(), 0);
    return Status::FromErrno(e, "write " + dir + "/" + name);
  }
  return Status::Ok();
}

Status MakeFileAs(const std::string& dir, const std::string& name, uid_t uid, gid_t gid,
                  mode_t mode) {
  NOPFS_RETURN_IF_ERROR(CheckName(name));
  Result<UniqueFd> dfd = MakeTrustedDir(dir, 0755);
  if (!dfd.ok()) return dfd.status();
  const std::string shown = dir + "/" + name;
  NOPFS_RETURN_IF_ERROR(RemoveBelowAt(dfd->get(), name, shown));
  const UniqueFd fd(::openat(dfd->get(), name.c_str(),
                             O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode & 0600));
  if (fd.get() < 0) return Status::FromErrno(errno, "create " + shown);
  if (::fchown(fd.get(), uid, gid) != 0 || ::fchmod(fd.get(), mode) != 0) {
    const int err = errno;
    ::unlinkat(dfd->get(), name.c_str(), 0);
    return Status::FromErrno(err, "create " + shown);
  }
  return Status::Ok();
}

std::vector<pid_t> StopProcesses(const std::vector<ProcessId>& procs,
                                 std::chrono::milliseconds grace) {
  struct Proc {
    pid_t pid;
    UniqueFd pidfd;
  };
  std::vector<Proc> open;
  for (const ProcessId& p : procs) {
    if (p.pid <= 0) continue;
    UniqueFd pidfd(PidfdOpen(p.pid));
    if (pidfd.get() < 0) continue;  // gone
    // The pidfd now holds whatever process has this pid; it is ours only if it started when the
    // ledger says. Checked after opening, so a pid reused in between is seen.
    if (!IsProcessAlive(p.pid, p.start_time)) continue;
    if (PidfdSignal(pidfd.get(), SIGTERM) != 0 && errno == ESRCH) continue;
    open.push_back({p.pid, std::move(pidfd)});
  }
  auto alive = [&] {
    std::vector<pid_t> left;
    for (const Proc& p : open) {
      ::waitpid(p.pid, nullptr, WNOHANG);  // reaps our own children (tests); others: no-op
      pollfd pfd{p.pidfd.get(), POLLIN, 0};
      if (::poll(&pfd, 1, 0) == 0) left.push_back(p.pid);  // readable once it has exited
    }
    return left;
  };
  const auto term_deadline = std::chrono::steady_clock::now() + grace;
  while (!alive().empty() && std::chrono::steady_clock::now() < term_deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (const Proc& p : open) {
    pollfd pfd{p.pidfd.get(), POLLIN, 0};
    if (::poll(&pfd, 1, 0) == 0) (void)PidfdSignal(p.pidfd.get(), SIGKILL);
  }
  const auto kill_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  std::vector<pid_t> left = alive();
  while (!left.empty() && std::chrono::steady_clock::now() < kill_deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    left = alive();
  }
  return left;
}

}  // namespace nopfs::spank
