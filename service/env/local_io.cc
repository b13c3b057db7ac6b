#include "service/env/local_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <thread>

#include "common/small_file.h"

namespace nopfs::service {
namespace {

class PosixLocalIo final : public LocalIo {
 public:
  ssize_t Pread(int fd, void* dst, size_t n, off_t offset) override {
    return ::pread(fd, dst, n, offset);
  }
  ssize_t Pwrite(int fd, const void* src, size_t n, off_t offset) override {
    return ::pwrite(fd, src, n, offset);
  }
  int Fallocate(int fd, off_t offset, off_t length) override {
    return ::posix_fallocate(fd, offset, length);
  }
};

}  // namespace

ssize_t LocalIo::PreadNoWait(int fd, void* dst, size_t n, off_t offset) {
  iovec iov{dst, n};
  return ::preadv2(fd, &iov, 1, offset, RWF_NOWAIT);
}
int LocalIo::Open(const std::string& path, int flags, mode_t mode) {
  return ::open(path.c_str(), flags | O_CLOEXEC, mode);
}
ssize_t LocalIo::Write(int fd, const void* src, size_t n) {
  return ::write(fd, src, n);
}
int LocalIo::Close(int fd) {
  return ::close(fd);
}
int LocalIo::Rename(const std::string& from, const std::string& to) {
  return ::rename(from.c_str(), to.c_str());
}
int LocalIo::Unlink(const std::string& path) {
  return ::unlink(path.c_str());
}

int LocalIo::Fstat(int fd, struct stat* st) {
  return ::fstat(fd, st);
}
int LocalIo::Lstat(const std::string& path, struct stat* st) {
  return ::lstat(path.c_str(), st);
}
int LocalIo::Mkdir(const std::string& path, mode_t mode) {
  return ::mkdir(path.c_str(), mode);
}
int LocalIo::MakeTempDir(std::string& templ) {
  return ::mkdtemp(templ.data()) == nullptr ? -1 : 0;
}
int LocalIo::Fsync(int fd) {
  return ::fsync(fd);
}
int LocalIo::PunchHole(int fd, off_t offset, off_t length) {
  return ::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset, length);
}

Result<std::string> LocalIo::ReadSmallFile(const std::string& path, uint64_t max_bytes) {
  return nopfs::ReadSmallFile(path, SmallFileRules{max_bytes, {}});
}

LocalIo* LocalIo::Default() {
  static PosixLocalIo* const io = new PosixLocalIo();
  return io;
}

void FaultInjectionLocalIo::FailWrites(int err, uint64_t after_bytes) {
  write_budget_.store(after_bytes, std::memory_order_relaxed);
  write_error_.store(err, std::memory_order_release);
}

void FaultInjectionLocalIo::FailReads(int err) {
  read_error_.store(err, std::memory_order_release);
}

void FaultInjectionLocalIo::FailFallocate(int err) {
  fallocate_error_.store(err, std::memory_order_release);
}

void FaultInjectionLocalIo::ShortReads(bool on, size_t unit) {
  short_unit_.store(on ? std::max<size_t>(unit, 1) : 0, std::memory_order_release);
}

void FaultInjectionLocalIo::FlipReads(bool on) {
  flip_.store(on, std::memory_order_release);
}

void FaultInjectionLocalIo::SetDelay(std::chrono::nanoseconds delay) {
  delay_ns_.store(delay.count(), std::memory_order_relaxed);
}

void FaultInjectionLocalIo::ShortWrites(bool on) {
  short_writes_.store(on, std::memory_order_release);
}

void FaultInjectionLocalIo::FailOpen(int err) {
  open_error_.store(err, std::memory_order_release);
}

void FaultInjectionLocalIo::FailRename(int err) {
  rename_error_.store(err, std::memory_order_release);
}

void FaultInjectionLocalIo::FailUnlink(int err) {
  unlink_error_.store(err, std::memory_order_release);
}

void FaultInjectionLocalIo::FailStat(int err) {
  stat_error_.store(err, std::memory_order_release);
}

void FaultInjectionLocalIo::FailMkdir(int err) {
  mkdir_error_.store(err, std::memory_order_release);
}

void FaultInjectionLocalIo::FailFsync(int err) {
  fsync_error_.store(err, std::memory_order_release);
}

void FaultInjectionLocalIo::FailPunchHole(int err) {
  punch_error_.store(err, std::memory_order_release);
}

void FaultInjectionLocalIo::OnlyPaths(std::string part) {
  std::lock_guard<std::mutex> lock(paths_mu_);
  only_paths_ = std::move(part);
}

bool FaultInjectionLocalIo::Hits(const std::string& path) const {
  std::lock_guard<std::mutex> lock(paths_mu_);
  return only_paths_.empty() || path.find(only_paths_) != std::string::npos;
}

bool FaultInjectionLocalIo::Hits(int fd) const {
  std::lock_guard<std::mutex> lock(paths_mu_);
  return only_paths_.empty() || only_fds_.count(fd) != 0;
}

void FaultInjectionLocalIo::ClearFaults() {
  short_writes_.store(false);
  open_error_.store(0);
  rename_error_.store(0);
  unlink_error_.store(0);
  stat_error_.store(0);
  mkdir_error_.store(0);
  fsync_error_.store(0);
  punch_error_.store(0);
  write_error_.store(0);
  read_error_.store(0);
  fallocate_error_.store(0);
  short_unit_.store(0);
  flip_.store(false);
  delay_ns_.store(0);
}

void FaultInjectionLocalIo::Delay() const {
  const int64_t ns = delay_ns_.load(std::memory_order_relaxed);
  if (ns > 0) std::this_thread::sleep_for(std::chrono::nanoseconds(ns));
}

ssize_t FaultInjectionLocalIo::Fail(int err) {
  failed_.fetch_add(1, std::memory_order_relaxed);
  errno = err;
  return -1;
}

ssize_t FaultInjectionLocalIo::Pread(int fd, void* dst, size_t n, off_t offset) {
  return ReadFaulty(fd, dst, n, offset, false);
}

ssize_t FaultInjectionLocalIo::PreadNoWait(int fd, void* dst, size_t n, off_t offset) {
  return ReadFaulty(fd, dst, n, offset, true);
}

ssize_t FaultInjectionLocalIo::ReadFaulty(int fd, void* dst, size_t n, off_t offset, bool nowait) {
  if (nowait && delay_ns_.load(std::memory_order_relaxed) > 0) {
    errno = EAGAIN;  // a slow disk: the read would wait
    return -1;
  }
  Delay();
  if (const int err = read_error_.load(std::memory_order_acquire); err != 0) return Fail(err);
  size_t ask = n;
  if (const size_t unit = short_unit_.load(std::memory_order_acquire); unit != 0 && n > unit) {
    ask = std::max(unit, n / 2 / unit * unit);
    short_reads_.fetch_add(1, std::memory_order_relaxed);
  }
  const ssize_t r =
      nowait ? base_->PreadNoWait(fd, dst, ask, offset) : base_->Pread(fd, dst, ask, offset);
  if (r > 0 && flip_.load(std::memory_order_acquire)) {
    static_cast<unsigned char*>(dst)[r / 2] ^= 0x10;
    flipped_.fetch_add(1, std::memory_order_relaxed);
  }
  return r;
}

ssize_t FaultInjectionLocalIo::WriteAllowance(int fd, size_t n) {
  if (!Hits(fd)) return static_cast<ssize_t>(n);
  if (short_writes_.load(std::memory_order_acquire) && n > 1) n /= 2;
  if (const int err = write_error_.load(std::memory_order_acquire); err != 0) {
    uint64_t budget = write_budget_.load(std::memory_order_relaxed);
    for (;;) {
      if (budget == 0) return Fail(err);
      const uint64_t take = std::min<uint64_t>(budget, n);
      if (write_budget_.compare_exchange_weak(budget, budget - take)) {
        return static_cast<ssize_t>(take);
      }
    }
  }
  return static_cast<ssize_t>(n);
}

ssize_t FaultInjectionLocalIo::Pwrite(int fd, const void* src, size_t n, off_t offset) {
  Delay();
  const ssize_t take = WriteAllowance(fd, n);
  if (take < 0) return -1;
  return base_->Pwrite(fd, src, static_cast<size_t>(take), offset);
}

ssize_t FaultInjectionLocalIo::Write(int fd, const void* src, size_t n) {
  Delay();
  const ssize_t take = WriteAllowance(fd, n);
  if (take < 0) return -1;
  return base_->Write(fd, src, static_cast<size_t>(take));
}

int FaultInjectionLocalIo::Open(const std::string& path, int flags, mode_t mode) {
  const bool hit = Hits(path);
  const bool writes = (flags & (O_WRONLY | O_RDWR | O_CREAT)) != 0;
  if (const int err = open_error_.load(std::memory_order_acquire); err != 0 && hit && writes) {
    return static_cast<int>(Fail(err));
  }
  const int fd = base_->Open(path, flags, mode);
  std::lock_guard<std::mutex> lock(paths_mu_);
  if (fd >= 0 && !only_paths_.empty() && path.find(only_paths_) != std::string::npos) {
    only_fds_.insert(fd);
  } else if (fd >= 0) {
    only_fds_.erase(fd);  // a number reused after a close that did not come through here
  }
  return fd;
}

int FaultInjectionLocalIo::Close(int fd) {
  {
    std::lock_guard<std::mutex> lock(paths_mu_);
    only_fds_.erase(fd);
  }
  return base_->Close(fd);
}

int FaultInjectionLocalIo::Rename(const std::string& from, const std::string& to) {
  if (const int err = rename_error_.load(std::memory_order_acquire);
      err != 0 && (Hits(from) || Hits(to))) {
    return static_cast<int>(Fail(err));
  }
  return base_->Rename(from, to);
}

int FaultInjectionLocalIo::Unlink(const std::string& path) {
  if (const int err = unlink_error_.load(std::memory_order_acquire); err != 0 && Hits(path)) {
    return static_cast<int>(Fail(err));
  }
  return base_->Unlink(path);
}

int FaultInjectionLocalIo::Fstat(int fd, struct stat* st) {
  if (const int err = stat_error_.load(std::memory_order_acquire); err != 0 && Hits(fd)) {
    return static_cast<int>(Fail(err));
  }
  return base_->Fstat(fd, st);
}

int FaultInjectionLocalIo::Lstat(const std::string& path, struct stat* st) {
  if (const int err = stat_error_.load(std::memory_order_acquire); err != 0 && Hits(path)) {
    return static_cast<int>(Fail(err));
  }
  return base_->Lstat(path, st);
}

int FaultInjectionLocalIo::Mkdir(const std::string& path, mode_t mode) {
  if (const int err = mkdir_error_.load(std::memory_order_acquire); err != 0 && Hits(path)) {
    return static_cast<int>(Fail(err));
  }
  return base_->Mkdir(path, mode);
}

int FaultInjectionLocalIo::MakeTempDir(std::string& templ) {
  if (const int err = mkdir_error_.load(std::memory_order_acquire); err != 0 && Hits(templ)) {
    return static_cast<int>(Fail(err));
  }
  return base_->MakeTempDir(templ);
}

int FaultInjectionLocalIo::Fsync(int fd) {
  if (const int err = fsync_error_.load(std::memory_order_acquire); err != 0 && Hits(fd)) {
    return static_cast<int>(Fail(err));
  }
  return base_->Fsync(fd);
}

int FaultInjectionLocalIo::PunchHole(int fd, off_t offset, off_t length) {
  if (const int err = punch_error_.load(std::memory_order_acquire); err != 0 && Hits(fd)) {
    return static_cast<int>(Fail(err));
  }
  return base_->PunchHole(fd, offset, length);
}

Result<std::string> FaultInjectionLocalIo::ReadSmallFile(const std::string& path,
                                                         uint64_t max_bytes) {
  Delay();
  if (const int err = read_error_.load(std::memory_order_acquire); err != 0 && Hits(path)) {
    failed_.fetch_add(1, std::memory_order_relaxed);
    return Status::FromErrno(err, "read " + path);
  }
  return base_->ReadSmallFile(path, max_bytes);
}

int FaultInjectionLocalIo::Fallocate(int fd, off_t offset, off_t length) {
  if (const int err = fallocate_error_.load(std::memory_order_acquire); err != 0) {
    failed_.fetch_add(1, std::memory_order_relaxed);
    return err;
  }
  return base_->Fallocate(fd, offset, length);
}

}  // namespace nopfs::service
