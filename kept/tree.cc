#include "kept/tree.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <unordered_set>
#include <vector>

#include "common/unique_fd.h"

namespace nopfs::kept {
namespace {

// Passes over one directory while it is emptied: a user who refills it faster than root empties
// it gets an error, not an endless walk.
constexpr int kMaxPasses = 64;
constexpr int kDirFlags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;

struct InodeKey {
  dev_t dev;
  ino_t ino;
  bool operator==(const InodeKey&) const = default;
};
struct InodeHash {
  size_t operator()(const InodeKey& k) const {
    return std::hash<uint64_t>()(uint64_t(k.ino) * 0x9e3779b97f4a7c15ULL ^ uint64_t(k.dev));
  }
};

struct Counter {
  TreeUsage usage;
  std::unordered_set<InodeKey, InodeHash> linked;
  void Add(const struct stat& st) {
    if (!S_ISDIR(st.st_mode) && st.st_nlink > 1 && linked.size() < kMaxLinkedInodes &&
        !linked.insert({st.st_dev, st.st_ino}).second) {
      return;  // another link of an inode already counted
    }
    usage.bytes += uint64_t(st.st_blocks) * 512;
    ++usage.inodes;
  }
};

struct DirCloser {
  void operator()(DIR* d) const { ::closedir(d); }
};
using DirPtr = std::unique_ptr<DIR, DirCloser>;

// One directory on the way down from the top of the walk.
struct Frame {
  dev_t dev = 0;
  ino_t ino = 0;
  long pos = 0;        // the readdir position after the child being walked
  std::string child;   // that child's name (removal only: to remove it once it is empty)
  int passes = 0;      // removal: passes over this directory so far
  bool dirty = false;  // removal: something was removed in this pass (look once more)
};

Status Walk(int dir_fd, const std::string& name, const std::string& shown, bool remove,
            Counter* c) {
  struct stat st {};
  if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    return errno == ENOENT ? Status::Ok() : Status::FromErrno(errno, shown);
  }
  struct stat parent {};
  if (!S_ISDIR(st.st_mode) || ::fstat(dir_fd, &parent) != 0 || parent.st_dev != st.st_dev) {
    // A file, a link, or a mount point: itself only.
    c->Add(st);
    if (remove && ::unlinkat(dir_fd, name.c_str(), S_ISDIR(st.st_mode) ? AT_REMOVEDIR : 0) != 0 &&
        errno != ENOENT) {
      return Status::FromErrno(errno, shown);
    }
    return Status::Ok();
  }
  UniqueFd top(::openat(dir_fd, name.c_str(), kDirFlags));
  if (!top.valid()) return errno == ENOENT ? Status::Ok() : Status::FromErrno(errno, shown);
  if (::fstat(top.get(), &st) != 0) return Status::FromErrno(errno, shown);
  c->Add(st);
  const dev_t dev = st.st_dev;
  std::vector<Frame> frames(1);
  frames[0].dev = st.st_dev;
  frames[0].ino = st.st_ino;
  auto where = [&] {
    return frames.size() == 1 ? shown
                              : shown + " (" + std::to_string(frames.size() - 1) + " levels down)";
  };
  DirPtr d(::fdopendir(top.get()));
  if (d == nullptr) return Status::FromErrno(errno, shown);
  top.Release();
  while (true) {
    errno = 0;
    const dirent* e = ::readdir(d.get());
    if (e == nullptr) {
      if (errno != 0) return Status::FromErrno(errno, where());
      Frame& f = frames.back();
      if (remove && f.dirty) {
        if (++f.passes > kMaxPasses) {
          return Status::Unavailable(where() + ": keeps refilling while it is removed");
        }
        f.dirty = false;
        ::rewinddir(d.get());
        continue;
      }
      if (frames.size() == 1) break;
      // Back up to the parent, which must be the directory the walk came down from.
      UniqueFd up(::openat(::dirfd(d.get()), "..", kDirFlags));
      if (!up.valid()) return Status::FromErrno(errno, where() + "/..");
      frames.pop_back();
      struct stat ust {};
      if (::fstat(up.get(), &ust) != 0) return Status::FromErrno(errno, where());
      if (ust.st_dev != frames.back().dev || ust.st_ino != frames.back().ino) {
        return Status::Unavailable(where() + ": moved while it was walked");
      }
      d.reset(::fdopendir(up.get()));
      if (d == nullptr) return Status::FromErrno(errno, where());
      up.Release();
      ::seekdir(d.get(), frames.back().pos);
      if (remove) {
        if (::unlinkat(::dirfd(d.get()), frames.back().child.c_str(), AT_REMOVEDIR) != 0 &&
            errno != ENOENT && errno != ENOTEMPTY && errno != EEXIST) {
          return Status::FromErrno(errno, where() + "/" + frames.back().child);
        }
        frames.back().dirty = true;  // refilled (ENOTEMPTY): the next pass goes in again
      }
      continue;
    }
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    struct stat s {};
    if (::fstatat(::dirfd(d.get()), e->d_name, &s, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) continue;
      return Status::FromErrno(errno, where() + "/" + e->d_name);
    }
    if (S_ISDIR(s.st_mode) && s.st_dev == dev) {
      UniqueFd child(::openat(::dirfd(d.get()), e->d_name, kDirFlags));
      if (!child.valid()) {
        // Gone, or swapped for a link or a file since the fstatat: the next pass sees it.
        if (errno == ENOENT || errno == ELOOP || errno == ENOTDIR) {
          frames.back().dirty = true;
          continue;
        }
        return Status::FromErrno(errno, where() + "/" + e->d_name);
      }
      struct stat cst {};
      if (::fstat(child.get(), &cst) != 0) return Status::FromErrno(errno, where());
      if (cst.st_dev != dev) {  // swapped for a mount point: never entered
        c->Add(cst);
        continue;
      }
      Frame& f = frames.back();
      f.pos = ::telldir(d.get());
      if (remove) f.child = e->d_name;
      c->Add(cst);
      DirPtr next(::fdopendir(child.get()));
      if (next == nullptr) return Status::FromErrno(errno, where() + "/" + e->d_name);
      child.Release();
      Frame down;
      down.dev = cst.st_dev;
      down.ino = cst.st_ino;
      frames.push_back(std::move(down));
      d = std::move(next);
      continue;
    }
    c->Add(s);
    if (remove) {
      if (::unlinkat(::dirfd(d.get()), e->d_name, S_ISDIR(s.st_mode) ? AT_REMOVEDIR : 0) != 0 &&
          errno != ENOENT) {
        // EISDIR: swapped for a directory meanwhile (the next pass walks it); anything else, a
        // mount point among them, is an error.
        if (errno != EISDIR) return Status::FromErrno(errno, where() + "/" + e->d_name);
      }
      frames.back().dirty = true;
    }
  }
  d.reset();
  if (remove && ::unlinkat(dir_fd, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
    if (errno == ENOTEMPTY || errno == EEXIST) {
      return Status::Unavailable(shown + ": refilled while it was removed");
    }
    return Status::FromErrno(errno, shown);
  }
  return Status::Ok();
}

}  // namespace

TreeUsage UsageAt(int dir_fd, const std::string& name, const std::string& shown) {
  Counter c;
  c.usage.status = Walk(dir_fd, name, shown, false, &c);
  return c.usage;
}

Status RemoveTreeAt(int dir_fd, const std::string& name, const std::string& shown) {
  Counter c;
  return Walk(dir_fd, name, shown, true, &c);
}

}  // namespace nopfs::kept
