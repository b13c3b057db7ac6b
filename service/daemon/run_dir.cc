#include "service/daemon/run_dir.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

namespace nopfs::service {
namespace {

std::string Join(const std::string& dir, const std::string& name) {
  return dir + "/" + name;
}

bool IsNopfsd(pid_t pid) {
  std::ifstream comm("/proc/" + std::to_string(pid) + "/comm");
  std::string name;
  return comm && std::getline(comm, name) && name == "nopfsd";
}

}  // namespace

Status PrepareRunDir(const std::string& dir) {
  if (dir.empty() || dir.front() != '/') {
    return Status::InvalidArgument("run directory \"" + dir + "\" must be an absolute path");
  }
  std::error_code ec;
  const std::filesystem::path parent = std::filesystem::path(dir).parent_path();
  std::filesystem::create_directories(parent, ec);
  if (ec) return Status::IoError("creating " + parent.string() + ": " + ec.message());
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return Status::FromErrno(errno, "creating run directory " + dir);
  }
  struct stat st {};
  if (lstat(dir.c_str(), &st) != 0) return Status::FromErrno(errno, dir);
  if (!S_ISDIR(st.st_mode)) {
    return Status::PermissionDenied("run directory " + dir +
                                    " is not a directory (a symlink?); remove it");
  }
  if (st.st_uid != geteuid()) {
    return Status::PermissionDenied("run directory " + dir + " belongs to uid " +
                                    std::to_string(st.st_uid) + ", not to uid " +
                                    std::to_string(geteuid()) + " who runs nopfsd");
  }
  if ((st.st_mode & 077) != 0) {
    // Our own directory with loose permissions: tighten it rather than refuse.
    if (chmod(dir.c_str(), 0700) != 0) return Status::FromErrno(errno, "chmod 0700 " + dir);
  }
  return Status::Ok();
}

pid_t ReadPid(const std::string& dir) {
  std::ifstream in(Join(dir, kPidName));
  long pid = 0;
  if (!(in >> pid) || pid <= 0) return 0;
  return static_cast<pid_t>(pid);
}

Status ClearStaleState(const std::string& dir, LocalIo* io) {
  if (io == nullptr) io = LocalIo::Default();
  const pid_t old = ReadPid(dir);
  if (old > 0 && old != getpid() && kill(old, 0) == 0 && IsNopfsd(old)) {
    return Status::FailedPrecondition("nopfsd (pid " + std::to_string(old) + ") already runs in " +
                                      dir + "; stop it first (kill " + std::to_string(old) + ")");
  }
  for (const char* name : {kSocketName, kPidName, kReadyName, kFailedName}) {
    if (io->Unlink(Join(dir, name)) != 0 && errno != ENOENT) {
      return Status::FromErrno(errno, "removing " + Join(dir, name));
    }
  }
  const std::string log = Join(dir, kLogName);
  if (access(log.c_str(), F_OK) == 0 && io->Rename(log, log + ".1") != 0) {
    return Status::FromErrno(errno, "rotating " + log);
  }
  return Status::Ok();
}

Status WriteFileAtomically(const std::string& dir, const std::string& name, const std::string& text,
                           LocalIo* io) {
  if (io == nullptr) io = LocalIo::Default();
  const std::string path = Join(dir, name);
  const std::string tmp = Join(dir, "." + name + ".tmp");
  // Every failure: the temporary file goes, and the message names the file a reader looks for.
  auto fail = [&](int err, int fd, const std::string& what) {
    if (fd >= 0) io->Close(fd);
    io->Unlink(tmp);
    return Status::FromErrno(err, what + " " + path + " (as " + tmp + ")");
  };
  const int fd = io->Open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, 0600);
  if (fd < 0) return fail(errno, -1, "creating");
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = io->Write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail(errno, fd, "writing");
    if (n == 0) return fail(EIO, fd, "writing (no progress)");
    done += static_cast<size_t>(n);
  }
  if (io->Close(fd) != 0) return fail(errno, -1, "closing");
  if (io->Rename(tmp, path) != 0) return fail(errno, -1, "renaming to");
  return Status::Ok();
}

}  // namespace nopfs::service
