#include "spank/user_dirs.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>

#include "spank/job_files.h"

namespace nopfs::spank {
namespace {

// Closes a descriptor when it goes out of scope.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

bool Ours(const struct stat& st, uid_t uid) {
  return S_ISDIR(st.st_mode) && st.st_uid == uid && (st.st_mode & 0022) == 0;
}

constexpr const char kAside[] = ".squatted.";

// The names in the directory `fd` that begin with `prefix` ("" : all but . and ..).
std::vector<std::string> NamesIn(int fd, const std::string& prefix) {
  std::vector<std::string> names;
  const int dup = ::openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dup < 0) return names;
  DIR* d = ::fdopendir(dup);
  if (d == nullptr) {
    ::close(dup);
    return names;
  }
  while (const dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != ".." && n.compare(0, prefix.size(), prefix) == 0) names.push_back(n);
  }
  ::closedir(d);
  return names;
}

// Removes every `.squatted.*` entry of the parent `pfd` (what an earlier prolog moved aside, or
// anything a user planted under such a name in a sticky parent): by directory descriptors, never
// following a link (RemoveBelowAt). Says what it removed, and what it could not, in *note.
void RemoveSquatted(int pfd, const std::string& parent, std::string* note) {
  for (const std::string& n : NamesIn(pfd, kAside)) {
    const std::string shown = parent + "/" + n;
    const Status s = RemoveBelowAt(pfd, n, shown);
    *note += (note->empty() ? "" : "; ") + (s.ok() ? "removed " + Printable(shown)
                                                   : "could not remove " + Printable(s.message()));
  }
}

}  // namespace

Status PrepareUserDir(const std::string& parent, const std::string& name, uid_t uid, gid_t gid,
                      std::string* note) {
  note->clear();
  const std::string path = parent + "/" + name;
  Fd pfd(::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (pfd.fd < 0) return Status::FromErrno(errno, parent);
  struct stat pst {};
  if (::fstat(pfd.fd, &pst) != 0) return Status::FromErrno(errno, parent);
  const bool others_write = (pst.st_mode & 0022) != 0;
  if (pst.st_uid != 0 || (others_write && (pst.st_mode & S_ISVTX) == 0)) {
    return Status::PermissionDenied(parent +
                                    " must be owned by root and writable by no one else "
                                    "(chown root:root " +
                                    parent + "; chmod 0755 " + parent + "; docs/admin.md)");
  }
  for (int attempt = 0; attempt < 3; ++attempt) {
    struct stat st {};
    if (::fstatat(pfd.fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
      if (S_ISDIR(st.st_mode) && st.st_uid == ::geteuid() && st.st_uid != uid &&
          (st.st_mode & 0022) == 0) {
        // Root's and empty: another prolog of this user's is making it right now (between its
        // mkdirat and its fchown). Both end with the same directory, the user's.
        Fd dfd(::openat(pfd.fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        if (dfd.fd < 0) continue;  // gone or replaced meanwhile: look again
        if (::fstat(dfd.fd, &st) != 0) return Status::FromErrno(errno, path);
        if (S_ISDIR(st.st_mode) && st.st_uid == ::geteuid() && (st.st_mode & 0022) == 0 &&
            NamesIn(dfd.fd, "").empty()) {
          if (::fchown(dfd.fd, uid, gid) != 0 || ::fchmod(dfd.fd, 0700) != 0) {
            return Status::FromErrno(errno, "chown/chmod " + path);
          }
          RemoveSquatted(pfd.fd, parent, note);
          return Status::Ok();
        }
        if (Ours(st, uid)) continue;  // the other prolog gave it to the user first
      }
      if (Ours(st, uid)) {
        Fd dfd(::openat(pfd.fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        if (dfd.fd < 0) return Status::FromErrno(errno, path);
        if (::fstat(dfd.fd, &st) != 0) return Status::FromErrno(errno, path);
        if (!Ours(st, uid)) continue;  // replaced meanwhile: look again
        if ((st.st_mode & 07777) != 0700 && ::fchmod(dfd.fd, 0700) != 0) {
          return Status::FromErrno(errno, "chmod 0700 " + path);
        }
        RemoveSquatted(pfd.fd, parent, note);
        return Status::Ok();
      }
      // Not the user's: someone else's directory, a file or a link. Never followed: moved aside
      // whole, then removed with the other .squatted.* entries (RemoveSquatted).
      const std::string aside = kAside + name + "." + std::to_string(::time(nullptr)) + "." +
                                std::to_string(::getpid()) + "." + std::to_string(attempt);
      if (::renameat(pfd.fd, name.c_str(), pfd.fd, aside.c_str()) != 0) {
        return Status::FromErrno(errno, "moving aside " + path);
      }
      char mode[8];
      std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
      *note += (note->empty() ? "" : "; ") + path + " (uid " + std::to_string(st.st_uid) +
               ", mode " + mode + ", not this user's directory) was moved aside to " + parent +
               "/" + aside;
    } else if (errno != ENOENT) {
      return Status::FromErrno(errno, path);
    }
    if (::mkdirat(pfd.fd, name.c_str(), 0700) != 0) {
      if (errno == EEXIST) continue;  // made meanwhile: look again
      return Status::FromErrno(errno, "creating " + path);
    }
    Fd dfd(::openat(pfd.fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (dfd.fd < 0) return Status::FromErrno(errno, path);
    if (::fstat(dfd.fd, &st) != 0) return Status::FromErrno(errno, path);
    if (!S_ISDIR(st.st_mode) || st.st_uid != ::geteuid()) continue;  // not the one we made
    if (::fchown(dfd.fd, uid, gid) != 0 || ::fchmod(dfd.fd, 0700) != 0) {
      return Status::FromErrno(errno, "chown/chmod " + path);
    }
    if (note->empty()) *note = "made " + path;
    RemoveSquatted(pfd.fd, parent, note);
    return Status::Ok();
  }
  return Status::Unavailable(path + " keeps being replaced by another user; make " + parent +
                             " root-owned, mode 0755 (docs/admin.md)");
}

std::vector<std::string> PrepareUserDirs(const lua::NodeConfig& config, uid_t uid, gid_t gid) {
  std::vector<std::string> lines;
  auto one = [&](const std::string& what, const std::string& parent, const std::string& name) {
    std::string note;
    const Status s = PrepareUserDir(parent, name, uid, gid, &note);
    if (!s.ok()) {
      lines.push_back(what + ": " + s.message());
    } else if (!note.empty() &&
               (note.rfind("made ", 0) != 0 || note.find("; ") != std::string::npos)) {
      lines.push_back(what + ": " + note);
    }
  };
  for (const policy::StorageClass& c : config.model().classes) {
    if (c.kind != policy::ClassKind::kSsd || c.path.empty()) continue;
    one("SSD class " + c.name, c.path, "nopfs-" + std::to_string(uid));
  }
  if (!config.catalog_cache().empty()) {
    one("catalog cache", config.catalog_cache(), std::to_string(uid));
  }
  return lines;
}

}  // namespace nopfs::spank
