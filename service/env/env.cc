// The POSIX Env and the fault-injecting wrapper (see env.h).
#include "service/env/env.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "common/mutex.h"

namespace nopfs::service {
namespace {

// Closes a descriptor when it goes out of scope.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) ::close(fd_);
  }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;
  // Hands the descriptor over: it is no longer closed here.
  int Release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

FileStat FromStat(const struct stat& st) {
  FileStat s;
  s.size = static_cast<uint64_t>(st.st_size);
  s.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
  s.ctime_ns = static_cast<int64_t>(st.st_ctim.tv_sec) * 1'000'000'000 + st.st_ctim.tv_nsec;
  s.inode = static_cast<uint64_t>(st.st_ino);
  s.device = static_cast<uint64_t>(st.st_dev);
  s.is_dir = S_ISDIR(st.st_mode);
  s.is_regular = S_ISREG(st.st_mode);
  return s;
}

// Calls each(name, d_type) for the entries of `d` but "." and "..", then closes `d`; a failed
// readdir is an error naming `dir`.
template <typename Each>
Status ReadEntries(DIR* d, const std::string& dir, Each&& each) {
  for (;;) {
    errno = 0;
    const dirent* e = ::readdir(d);
    if (e == nullptr) {
      const int err = errno;
      ::closedir(d);
      return err != 0 ? Status::FromErrno(err, dir) : Status::Ok();
    }
    const std::string_view name(e->d_name);
    if (name == "." || name == "..") continue;
    each(name, e->d_type);
  }
}

EntryType FromDType(unsigned char d_type) {
  switch (d_type) {
    case DT_DIR:
      return EntryType::kDirectory;
    case DT_REG:
      return EntryType::kRegular;
    case DT_LNK:
    case DT_UNKNOWN:
      return EntryType::kUnknown;
    default:
      return EntryType::kOther;  // FIFO, socket, device
  }
}

// A directory opened by PosixEnv::OpenDir: the descriptor is kept for fstatat.
class PosixOpenedDir final : public OpenedDir {
 public:
  PosixOpenedDir(std::string path, int fd, FileStat stat, std::vector<DirEntry> entries)
      : OpenedDir(stat, std::move(entries)), path_(std::move(path)), fd_(fd) {}
  ~PosixOpenedDir() override { ::close(fd_); }

  std::vector<Result<FileStat>> StatNames(const std::vector<std::string>& names) override {
    std::vector<Result<FileStat>> out;
    out.reserve(names.size());
    for (const std::string& name : names) {
      struct stat st {};
      if (::fstatat(fd_, name.c_str(), &st, 0) != 0) {
        out.emplace_back(Status::FromErrno(errno, path_ + "/" + name));
      } else {
        out.emplace_back(FromStat(st));
      }
    }
    return out;
  }

 private:
  const std::string path_;
  const int fd_;
};

int OpenRead(const std::string& path) {
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

class PosixEnv final : public Env {
 public:
  Result<FileStat> Stat(const std::string& path) override {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return Status::FromErrno(errno, path);
    return FromStat(st);
  }

  std::vector<Result<FileStat>> StatNames(const std::string& dir,
                                          const std::vector<std::string>& names) override {
    std::vector<Result<FileStat>> out;
    out.reserve(names.size());
    const int dfd = ::open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
      const Status err = Status::FromErrno(errno, dir);
      for (size_t i = 0; i < names.size(); ++i)
        out.emplace_back(err);
      return out;
    }
    for (const std::string& name : names) {
      struct stat st {};
      if (::fstatat(dfd, name.c_str(), &st, 0) != 0) {
        out.emplace_back(Status::FromErrno(errno, dir + "/" + name));
      } else {
        out.emplace_back(FromStat(st));
      }
    }
    ::close(dfd);
    return out;
  }

  Result<std::unique_ptr<OpenedDir>> OpenDir(const std::string& dir) override {
    int fd;
    do {
      fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) return Status::FromErrno(errno, dir);
    FdCloser closer(fd);  // until the OpenedDir owns it
    struct stat st {};
    if (::fstat(fd, &st) != 0) return Status::FromErrno(errno, dir);
    // The listing reads a duplicate, which closedir closes; `fd` stays for fstatat.
    const int list_fd = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (list_fd < 0) return Status::FromErrno(errno, dir);
    DIR* d = ::fdopendir(list_fd);
    if (d == nullptr) {
      const int err = errno;
      ::close(list_fd);
      return Status::FromErrno(err, dir);
    }
    std::vector<DirEntry> entries;
    NOPFS_RETURN_IF_ERROR(ReadEntries(d, dir, [&](std::string_view name, unsigned char type) {
      entries.push_back({std::string(name), FromDType(type)});
    }));
    return std::unique_ptr<OpenedDir>(
        std::make_unique<PosixOpenedDir>(dir, closer.Release(), FromStat(st), std::move(entries)));
  }

  Result<std::vector<std::string>> ListDir(const std::string& dir) override {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return Status::FromErrno(errno, dir);
    std::vector<std::string> names;
    NOPFS_RETURN_IF_ERROR(ReadEntries(
        d, dir, [&](std::string_view name, unsigned char) { names.emplace_back(name); }));
    return names;
  }

  Status ReadAt(const std::string& path, uint64_t offset, std::span<std::byte> dst) override {
    const int fd = OpenRead(path);
    if (fd < 0) return Status::FromErrno(errno, path);
    FdCloser closer(fd);
    uint64_t done = 0;
    while (done < dst.size()) {
      const ssize_t n =
          ::pread(fd, dst.data() + done, dst.size() - done, static_cast<off_t>(offset + done));
      if (n < 0) {
        if (errno == EINTR) continue;
        return Status::FromErrno(errno, path);
      }
      if (n == 0) {
        struct stat st {};
        const uint64_t size =
            ::fstat(fd, &st) == 0 ? static_cast<uint64_t>(st.st_size) : offset + done;
        return Status::FailedPrecondition(path + ": file is " + std::to_string(size) +
                                          " bytes, sample needs bytes " + std::to_string(offset) +
                                          ".." + std::to_string(offset + dst.size()));
      }
      done += static_cast<uint64_t>(n);
    }
    return Status::Ok();
  }

  Result<std::string> ReadFile(const std::string& path) override {
    const int fd = OpenRead(path);
    if (fd < 0) return Status::FromErrno(errno, path);
    FdCloser closer(fd);
    std::string out;
    char buf[65536];
    for (;;) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n < 0) {
        if (errno == EINTR) continue;
        return Status::FromErrno(errno, path);
      }
      if (n == 0) break;
      out.append(buf, static_cast<size_t>(n));
    }
    return out;
  }
};

}  // namespace

Env* Env::Default() {
  static PosixEnv* env = new PosixEnv();  // never deleted: usable during static destruction
  return env;
}

void FaultInjectionEnv::SetError(const std::string& path, Status error) {
  MutexLock lock(&mu_);
  if (error.ok()) error = Status::Internal("FaultInjectionEnv::SetError given an ok Status");
  errors_[path] = std::move(error);
}

void FaultInjectionEnv::SetCorrupt(const std::string& path) {
  MutexLock lock(&mu_);
  corrupt_.insert(path);
}

void FaultInjectionEnv::SetDelay(std::chrono::nanoseconds delay) {
  delay_ns_.store(delay.count(), std::memory_order_relaxed);
}

void FaultInjectionEnv::ClearError(const std::string& path) {
  MutexLock lock(&mu_);
  errors_.erase(path);
}

void FaultInjectionEnv::ClearCorrupt(const std::string& path) {
  MutexLock lock(&mu_);
  corrupt_.erase(path);
}

void FaultInjectionEnv::ClearFaults() {
  MutexLock lock(&mu_);
  errors_.clear();
  corrupt_.clear();
  delay_ns_.store(0, std::memory_order_relaxed);
}

Status FaultInjectionEnv::ErrorFor(const std::string& path) const {
  MutexLock lock(&mu_);
  const auto it = errors_.find(path);
  return it == errors_.end() ? Status::Ok() : it->second;
}

bool FaultInjectionEnv::IsCorrupt(const std::string& path) const {
  MutexLock lock(&mu_);
  return corrupt_.count(path) != 0;
}

void FaultInjectionEnv::Delay() const {
  const int64_t ns = delay_ns_.load(std::memory_order_relaxed);
  if (ns > 0) std::this_thread::sleep_for(std::chrono::nanoseconds(ns));
}

Result<FileStat> FaultInjectionEnv::Stat(const std::string& path) {
  NOPFS_RETURN_IF_ERROR(ErrorFor(path));
  stats_.fetch_add(1, std::memory_order_relaxed);
  return base_->Stat(path);
}

std::vector<Result<FileStat>> Env::StatNames(const std::string& dir,
                                             const std::vector<std::string>& names) {
  std::vector<Result<FileStat>> out;
  out.reserve(names.size());
  for (const std::string& name : names)
    out.push_back(Stat(dir + "/" + name));
  return out;
}

namespace {

// The default Env::OpenDir's result: StatNames by path, through the Env.
class PathOpenedDir final : public OpenedDir {
 public:
  PathOpenedDir(Env* env, std::string path, FileStat stat, std::vector<DirEntry> entries)
      : OpenedDir(stat, std::move(entries)), env_(env), path_(std::move(path)) {}
  std::vector<Result<FileStat>> StatNames(const std::vector<std::string>& names) override {
    return env_->StatNames(path_, names);
  }

 private:
  Env* const env_;
  const std::string path_;
};

}  // namespace

Result<std::unique_ptr<OpenedDir>> Env::OpenDir(const std::string& dir) {
  Result<FileStat> st = Stat(dir);
  if (!st.ok()) return st.status();
  Result<std::vector<std::string>> names = ListDir(dir);
  if (!names.ok()) return names.status();
  std::vector<DirEntry> entries;
  entries.reserve(names->size());
  for (std::string& n : *names)
    entries.push_back({std::move(n), EntryType::kUnknown});
  return std::unique_ptr<OpenedDir>(
      std::make_unique<PathOpenedDir>(this, dir, *st, std::move(entries)));
}

Result<std::vector<std::string>> FaultInjectionEnv::ListDir(const std::string& dir) {
  NOPFS_RETURN_IF_ERROR(ErrorFor(dir));
  list_dirs_.fetch_add(1, std::memory_order_relaxed);
  return base_->ListDir(dir);
}

Status FaultInjectionEnv::ReadAt(const std::string& path, uint64_t offset,
                                 std::span<std::byte> dst) {
  NOPFS_RETURN_IF_ERROR(ErrorFor(path));
  Delay();
  reads_.fetch_add(1, std::memory_order_relaxed);
  NOPFS_RETURN_IF_ERROR(base_->ReadAt(path, offset, dst));
  bytes_read_.fetch_add(dst.size(), std::memory_order_relaxed);
  if (!dst.empty() && IsCorrupt(path)) dst[dst.size() / 2] ^= std::byte{0x01};
  return Status::Ok();
}

Result<std::string> FaultInjectionEnv::ReadFile(const std::string& path) {
  NOPFS_RETURN_IF_ERROR(ErrorFor(path));
  Delay();
  reads_.fetch_add(1, std::memory_order_relaxed);
  Result<std::string> r = base_->ReadFile(path);
  if (!r.ok()) return r;
  bytes_read_.fetch_add(r->size(), std::memory_order_relaxed);
  if (!r->empty() && IsCorrupt(path)) (*r)[r->size() / 2] ^= 0x01;
  return r;
}

}  // namespace nopfs::service
