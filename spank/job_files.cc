#include "spank/job_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <charconv>
#include <fstream>
#include <thread>

#include "spank/ledger.h"

namespace nopfs::spank {
namespace {

constexpr int kMaxDepth = 64;

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

}  // namespace

Status RemoveBelow(const std::string& parent, const std::string& name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) {
    return Status::InvalidArgument("remove: bad name '" + name + "'");
  }
  const int pfd = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (pfd < 0) {
    if (errno == ENOENT) return Status::Ok();
    return Status::FromErrno(errno, "open " + parent);
  }
  Status s = RemoveAt(pfd, name, parent + "/" + name, 0);
  ::close(pfd);
  return s;
}

Status RemoveBelowUserDir(const std::string& root, const std::string& user_dir, uid_t uid,
                          const std::string& name) {
  for (const std::string* n : {&user_dir, &name}) {
    if (n->empty() || *n == "." || *n == ".." || n->find('/') != std::string::npos) {
      return Status::InvalidArgument("remove: bad name '" + *n + "'");
    }
  }
  const int rfd = ::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (rfd < 0) {
    if (errno == ENOENT) return Status::Ok();
    return Status::FromErrno(errno, "open " + root);
  }
  const std::string shown = root + "/" + user_dir;
  const int ufd =
      ::openat(rfd, user_dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (ufd < 0) {
    const int err = errno;
    ::close(rfd);
    if (err == ENOENT) return Status::Ok();
    if (err == ENOTDIR || err == ELOOP) {
      return Status::PermissionDenied(shown + " is not a directory; not touching it");
    }
    return Status::FromErrno(err, "open " + shown);
  }
  struct stat st {};
  Status s;
  if (::fstat(ufd, &st) != 0) {
    s = Status::FromErrno(errno, "stat " + shown);
  } else if (st.st_uid != uid) {
    s = Status::PermissionDenied(shown + " belongs to uid " + std::to_string(st.st_uid) + ", not " +
                                 std::to_string(uid) + "; not touching it");
  } else {
    s = RemoveAt(ufd, name, shown + "/" + name, 0);
  }
  ::close(ufd);
  if (s.ok()) ::unlinkat(rfd, user_dir.c_str(), AT_REMOVEDIR);  // only when empty
  ::close(rfd);
  return s;
}

Status WriteFileAs(const std::string& dir, const std::string& name, const std::string& text,
                   uid_t uid, gid_t gid, mode_t mode) {
  const std::string tmp = dir + "/." + name + ".nopfs-job." + std::to_string(::getpid());
  ::unlink(tmp.c_str());
  const int fd =
      ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode & 0600);
  if (fd < 0) return Status::FromErrno(errno, "create " + tmp);
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
                  ::fchown(fd, uid, gid) == 0 && ::fchmod(fd, mode) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), (dir + "/" + name).c_str()) != 0) {
    const int e = ok ? errno : err;
    ::unlink(tmp.c_str());
    return Status::FromErrno(e, "write " + dir + "/" + name);
  }
  return Status::Ok();
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string out(64 * 1024, '\0');
  in.read(out.data(), static_cast<std::streamsize>(out.size()));
  out.resize(static_cast<size_t>(in.gcount()));
  return out;
}

std::vector<pid_t> FindDaemons(uid_t uid, const std::string& run_dir) {
  std::vector<pid_t> out;
  DIR* d = ::opendir("/proc");
  if (d == nullptr) return out;
  while (dirent* ent = ::readdir(d)) {
    const std::string_view name = ent->d_name;
    pid_t pid = 0;
    const auto r = std::from_chars(name.data(), name.data() + name.size(), pid);
    if (r.ec != std::errc() || r.ptr != name.data() + name.size() || pid <= 0) continue;
    struct stat st {};
    const std::string base = "/proc/" + std::string(name);
    if (::stat(base.c_str(), &st) != 0 || st.st_uid != uid) continue;
    if (!ProcessStartTime(pid).has_value()) continue;  // gone or a zombie
    const std::string cmdline = ReadText(base + "/cmdline");
    const std::string want = std::string("--run-dir") + '\0' + run_dir + '\0';
    const std::string want_eq = "--run-dir=" + run_dir + '\0';
    if (cmdline.find(want) != std::string::npos || cmdline.find(want_eq) != std::string::npos) {
      out.push_back(pid);
    }
  }
  ::closedir(d);
  return out;
}

std::vector<pid_t> StopProcesses(const std::vector<pid_t>& pids, std::chrono::milliseconds grace) {
  struct Proc {
    pid_t pid;
    uint64_t start;
  };
  std::vector<Proc> procs;
  for (pid_t p : pids) {
    if (auto s = ProcessStartTime(p)) {
      procs.push_back({p, *s});
      ::kill(p, SIGTERM);
    }
  }
  auto alive = [&] {
    std::vector<pid_t> left;
    for (const Proc& p : procs) {
      ::waitpid(p.pid, nullptr, WNOHANG);  // reaps our own children (tests); others: no-op
      if (IsProcessAlive(p.pid, p.start)) left.push_back(p.pid);
    }
    return left;
  };
  const auto term_deadline = std::chrono::steady_clock::now() + grace;
  while (!alive().empty() && std::chrono::steady_clock::now() < term_deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (pid_t p : alive())
    ::kill(p, SIGKILL);
  const auto kill_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  std::vector<pid_t> left = alive();
  while (!left.empty() && std::chrono::steady_clock::now() < kill_deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    left = alive();
  }
  return left;
}

}  // namespace nopfs::spank
