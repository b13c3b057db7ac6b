#include "common/lock_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include "common/unique_fd.h"

namespace nopfs {

Result<int> LockFileIn(const std::string& dir, const std::string& name) {
  const std::string path = dir + "/" + name;
  // A few rounds: another process may make the file between our open and our link.
  for (int round = 0; round < 8; ++round) {
    UniqueFd fd(::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC));
    if (fd.valid()) {
      if (::flock(fd.get(), LOCK_EX | LOCK_NB) == 0) return fd.Release();
      if (errno == EWOULDBLOCK) return -1;
      return Status::FromErrno(errno, "flock " + path);
    }
    if (errno != ENOENT) return Status::FromErrno(errno, "opening lock " + path);
    std::string tmp = dir + "/." + name + ".XXXXXX";
    UniqueFd made(::mkostemp(tmp.data(), O_CLOEXEC));  // mode 0600
    if (!made.valid()) return Status::FromErrno(errno, "making a lock file in " + dir);
    const int locked = ::flock(made.get(), LOCK_EX | LOCK_NB);
    const int lock_err = errno;
    const int linked = locked == 0 ? ::link(tmp.c_str(), path.c_str()) : -1;
    const int link_err = errno;
    ::unlink(tmp.c_str());
    if (locked != 0) return Status::FromErrno(lock_err, "flock " + tmp);
    if (linked == 0) return made.Release();
    if (link_err != EEXIST) return Status::FromErrno(link_err, "linking " + tmp + " to " + path);
    // Someone else made it meanwhile: lock theirs.
  }
  return Status::Unavailable("lock " + path + " keeps appearing and vanishing");
}

}  // namespace nopfs
