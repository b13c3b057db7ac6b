#include "common/small_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "common/unique_fd.h"

namespace nopfs {

std::string FileKind(mode_t mode) {
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  return "not a regular file";
}

Result<std::string> ReadSmallFileAt(int dir_fd, const std::string& name,
                                    const SmallFileRules& rules) {
  const UniqueFd fd(
      ::openat(dir_fd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY));
  if (fd.get() < 0) {
    const int err = errno;
    if (err == ENOENT) return Status::NotFound(name + " does not exist");
    if (err == ELOOP) return Status::PermissionDenied(name + " is a symbolic link; not reading it");
    return Status::FromErrno(err, "open " + name);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return Status::FromErrno(errno, "stat " + name);
  if (!S_ISREG(st.st_mode)) {
    return Status::PermissionDenied(name + " is " + FileKind(st.st_mode) + "; not reading it");
  }
  if (rules.owner && st.st_uid != *rules.owner) {
    return Status::PermissionDenied(name + " belongs to uid " + std::to_string(st.st_uid) +
                                    ", not " + std::to_string(*rules.owner) + "; not reading it");
  }
  if (static_cast<uint64_t>(st.st_size) > rules.max_bytes) {
    return Status::PermissionDenied(name + " holds " + std::to_string(st.st_size) +
                                    " bytes, more than " + std::to_string(rules.max_bytes) +
                                    "; not reading it");
  }
  // The file may grow after fstat (and /proc files show size 0): read at most the cap.
  std::string out(static_cast<size_t>(rules.max_bytes), '\0');
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t n = ::read(fd.get(), out.data() + got, out.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno(errno, "read " + name);
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  out.resize(got);
  return out;
}

}  // namespace nopfs
