// LocalIo: nopfsd's reads and writes of its own files on the node's local disks (the SSD tier's
// data files, the run directory's files and the log, the metrics file), as Env is its view of the
// PFS: one place where tests put faults between nopfsd and the disk. LocalIo::Default() makes the
// system calls; FaultInjectionLocalIo wraps another LocalIo and fails, shortens, slows or corrupts
// them.
//
// Thread safety: every LocalIo is safe to call from many threads at once.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <set>
#include <string>

#include "common/status.h"

namespace nopfs::service {

class LocalIo {
 public:
  virtual ~LocalIo() = default;

  // pread(2) and pwrite(2): the bytes moved, or -1 with errno set. Either may move fewer bytes
  // than asked, as the system calls may; callers loop.
  virtual ssize_t Pread(int fd, void* dst, size_t n, off_t offset) = 0;
  virtual ssize_t Pwrite(int fd, const void* src, size_t n, off_t offset) = 0;
  // preadv2(2) with RWF_NOWAIT: as Pread where the bytes are in the page cache, else -1 with
  // errno EAGAIN (the read would wait for the disk; it may also move fewer bytes than asked, the
  // cached part) or EOPNOTSUPP (the file system cannot say). The default makes the system call.
  virtual ssize_t PreadNoWait(int fd, void* dst, size_t n, off_t offset);
  // posix_fallocate(3): 0 or an errno value.
  virtual int Fallocate(int fd, off_t offset, off_t length) = 0;

  // The whole-file calls of the run directory, the log and the metrics file. Each returns what
  // its system call returns (-1 with errno set on failure); the defaults make the system calls.
  // open(2) (O_CLOEXEC is added), write(2) (may move fewer bytes than asked: callers loop),
  // close(2), rename(2), unlink(2).
  virtual int Open(const std::string& path, int flags, mode_t mode);
  virtual ssize_t Write(int fd, const void* src, size_t n);
  virtual int Close(int fd);
  virtual int Rename(const std::string& from, const std::string& to);
  virtual int Unlink(const std::string& path);

  // The calls of the kept area's directories and files; each returns what its system call returns
  // (-1 with errno set on failure). fstat(2), lstat(2), mkdir(2), mkdtemp(3) (fills in `templ`'s
  // trailing X's; 0 or -1), fsync(2), and fallocate(2) with FALLOC_FL_PUNCH_HOLE |
  // FALLOC_FL_KEEP_SIZE.
  virtual int Fstat(int fd, struct stat* st);
  virtual int Lstat(const std::string& path, struct stat* st);
  virtual int Mkdir(const std::string& path, mode_t mode);
  virtual int MakeTempDir(std::string& templ);
  virtual int Fsync(int fd);
  virtual int PunchHole(int fd, off_t offset, off_t length);
  // The whole of a small file, as common/small_file.h's ReadSmallFile with a cap of `max_bytes`
  // (never a link, a regular file).
  virtual Result<std::string> ReadSmallFile(const std::string& path, uint64_t max_bytes);

  // The process-wide LocalIo of plain system calls; never deleted.
  static LocalIo* Default();
};

// Wraps another LocalIo and injects faults into every call, for tests. Errors are errno values
// (ENOSPC, EIO, ...); 0 turns a fault off.
class FaultInjectionLocalIo final : public LocalIo {
 public:
  explicit FaultInjectionLocalIo(LocalIo* base) : base_(base) {}
  FaultInjectionLocalIo(const FaultInjectionLocalIo&) = delete;
  FaultInjectionLocalIo& operator=(const FaultInjectionLocalIo&) = delete;

  // Writes (Pwrite and Write) fail with `err` once `after_bytes` more bytes have been written:
  // the write that crosses the limit moves the bytes up to it (a short write), the next one
  // fails. (With O_DIRECT, keep after_bytes a multiple of 4096.)
  void FailWrites(int err, uint64_t after_bytes = 0);
  // Every Write and Pwrite of more than one byte moves half of what was asked.
  void ShortWrites(bool on);
  // Open (of a file it would create or write), Rename and Unlink fail with these.
  void FailOpen(int err);
  void FailRename(int err);
  void FailUnlink(int err);
  // Fstat and Lstat, Mkdir and MakeTempDir, Fsync, PunchHole fail with these.
  void FailStat(int err);
  void FailMkdir(int err);
  void FailFsync(int err);
  void FailPunchHole(int err);
  // Faults hit only the paths whose name contains `part` (Open, Rename's source or target,
  // Unlink, Lstat, Mkdir, MakeTempDir) and the descriptors this LocalIo opened from such paths; ""
  // (the default): every call. Descriptors opened elsewhere (the SSD tier's) are then spared.
  void OnlyPaths(std::string part);
  // Pread, PreadNoWait and ReadSmallFile fail with this.
  void FailReads(int err);
  void FailFallocate(int err);
  // Every read moves at most half of what was asked (at least `unit` bytes, in multiples of it:
  // 4096 keeps O_DIRECT reads aligned).
  void ShortReads(bool on, size_t unit = 4096);
  // Successful reads return one bit flipped (in the middle byte of what was read).
  void FlipReads(bool on);
  // Every read and write sleeps this long first (a slow disk), and PreadNoWait fails with EAGAIN
  // (it would wait). Zero turns it off.
  void SetDelay(std::chrono::nanoseconds delay);
  // Removes every fault; the counters and OnlyPaths are kept.
  void ClearFaults();

  uint64_t failed_calls() const { return failed_.load(std::memory_order_relaxed); }
  uint64_t short_reads() const { return short_reads_.load(std::memory_order_relaxed); }
  uint64_t flipped_reads() const { return flipped_.load(std::memory_order_relaxed); }

  ssize_t Pread(int fd, void* dst, size_t n, off_t offset) override;
  ssize_t PreadNoWait(int fd, void* dst, size_t n, off_t offset) override;
  ssize_t Pwrite(int fd, const void* src, size_t n, off_t offset) override;
  int Fallocate(int fd, off_t offset, off_t length) override;
  int Open(const std::string& path, int flags, mode_t mode) override;
  ssize_t Write(int fd, const void* src, size_t n) override;
  int Close(int fd) override;
  int Rename(const std::string& from, const std::string& to) override;
  int Unlink(const std::string& path) override;
  int Fstat(int fd, struct stat* st) override;
  int Lstat(const std::string& path, struct stat* st) override;
  int Mkdir(const std::string& path, mode_t mode) override;
  int MakeTempDir(std::string& templ) override;
  int Fsync(int fd) override;
  int PunchHole(int fd, off_t offset, off_t length) override;
  Result<std::string> ReadSmallFile(const std::string& path, uint64_t max_bytes) override;

 private:
  void Delay() const;
  // Pread and PreadNoWait (`nowait`) with the read faults.
  ssize_t ReadFaulty(int fd, void* dst, size_t n, off_t offset, bool nowait);
  ssize_t Fail(int err);
  bool Hits(const std::string& path) const;
  bool Hits(int fd) const;
  // How many of `n` bytes a write may move, or -1 (errno set) when it must fail.
  ssize_t WriteAllowance(int fd, size_t n);

  LocalIo* const base_;
  std::atomic<int> write_error_{0};
  std::atomic<uint64_t> write_budget_{0};
  std::atomic<int> read_error_{0};
  std::atomic<int> fallocate_error_{0};
  std::atomic<bool> short_writes_{false};
  std::atomic<int> open_error_{0};
  std::atomic<int> rename_error_{0};
  std::atomic<int> unlink_error_{0};
  std::atomic<int> stat_error_{0};
  std::atomic<int> mkdir_error_{0};
  std::atomic<int> fsync_error_{0};
  std::atomic<int> punch_error_{0};
  mutable std::mutex paths_mu_;
  std::string only_paths_;  // guarded by paths_mu_
  std::set<int> only_fds_;  // guarded by paths_mu_: descriptors opened from matching paths
  std::atomic<size_t> short_unit_{0};  // 0: reads are not shortened
  std::atomic<bool> flip_{false};
  std::atomic<int64_t> delay_ns_{0};
  std::atomic<uint64_t> failed_{0};
  std::atomic<uint64_t> short_reads_{0};
  std::atomic<uint64_t> flipped_{0};
};

}  // namespace nopfs::service
