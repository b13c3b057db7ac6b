// Env: nopfsd's only way to look at the shared file system (the PFS) where the dataset lives.
//
// The catalog scans the dataset and the prefetchers read samples through an Env, so tests can put
// a FaultInjectionEnv in between: a slow PFS, a file that vanished or became unreadable, a copy
// that comes back with a flipped byte. Env::Default() is the real POSIX one.
//
// Every error message names the path it is about; errno is translated by Status::FromErrno.
//
// Thread safety: every Env is safe to call from many threads at once.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"

namespace nopfs::service {

// What the catalog needs to know about a file or directory (symbolic links are followed).
struct FileStat {
  uint64_t size = 0;     // bytes
  int64_t mtime_ns = 0;  // last modification, nanoseconds since the epoch
  int64_t ctime_ns = 0;  // last change of content or attributes (not settable by users), ns
  uint64_t inode = 0;    // st_ino
  uint64_t device = 0;   // st_dev
  bool is_dir = false;
  bool is_regular = false;
};

// The type of a directory entry as the listing reports it (d_type). A symbolic link is kUnknown
// (its target decides), and so is every entry of a file system that does not report types.
enum class EntryType : uint8_t { kUnknown, kDirectory, kRegular, kOther };

struct DirEntry {
  std::string name;
  EntryType type = EntryType::kUnknown;
};

// A directory opened once by Env::OpenDir: its attributes, taken before it was listed, its
// entries (without "." and ".."), and stats of its entries relative to it.
class OpenedDir {
 public:
  OpenedDir(FileStat stat, std::vector<DirEntry> entries)
      : stat_(stat), entries_(std::move(entries)) {}
  virtual ~OpenedDir() = default;
  OpenedDir(const OpenedDir&) = delete;
  OpenedDir& operator=(const OpenedDir&) = delete;

  const FileStat& stat() const { return stat_; }
  const std::vector<DirEntry>& entries() const { return entries_; }
  // Env::StatNames of this directory's `names`; safe to call from many threads at once.
  virtual std::vector<Result<FileStat>> StatNames(const std::vector<std::string>& names) = 0;

 private:
  const FileStat stat_;
  const std::vector<DirEntry> entries_;
};

class Env {
 public:
  virtual ~Env() = default;

  // stat(2) of `path`, following symbolic links.
  virtual Result<FileStat> Stat(const std::string& path) = 0;
  // The names in directory `dir` (without "." and ".."), in the order the file system returns them.
  virtual Result<std::vector<std::string>> ListDir(const std::string& dir) = 0;
  // Stat(dir + "/" + name) for each of `names`, one result per name, in order; an error that
  // concerns the directory itself fails every name. The POSIX Env resolves the names relative to
  // one descriptor of `dir`, so that a PFS looks up each file once, not its whole path again.
  virtual std::vector<Result<FileStat>> StatNames(const std::string& dir,
                                                  const std::vector<std::string>& names);
  // Opens directory `dir` (following symbolic links), stats it, then lists it. The POSIX Env
  // resolves `dir` once: it opens the directory, takes its attributes with fstat and its entries
  // (with their d_type) from that descriptor, which it keeps for OpenedDir::StatNames (fstatat),
  // so that a PFS looks the directory up once for all of it. This default calls Stat, ListDir
  // and, later, StatNames(dir, ...), and reports every entry's type as kUnknown.
  virtual Result<std::unique_ptr<OpenedDir>> OpenDir(const std::string& dir);
  // Reads exactly dst.size() bytes of `path` starting at `offset`, or fails. A file shorter than
  // offset + dst.size() is an error "<path>: file is N bytes, sample needs bytes A..B" (half-open
  // range [A, B)). Interrupted reads are retried.
  virtual Status ReadAt(const std::string& path, uint64_t offset, std::span<std::byte> dst) = 0;
  // The whole content of a small file (a manifest), as text.
  virtual Result<std::string> ReadFile(const std::string& path) = 0;

  // The process-wide POSIX Env (open(O_RDONLY | O_CLOEXEC) + pread); never deleted.
  static Env* Default();
};

// Wraps another Env and injects faults, for tests. Faults are keyed by the exact path string the
// caller passes. Counters count calls that reached the wrapped Env.
class FaultInjectionEnv final : public Env {
 public:
  explicit FaultInjectionEnv(Env* base) : base_(base) {}
  FaultInjectionEnv(const FaultInjectionEnv&) = delete;
  FaultInjectionEnv& operator=(const FaultInjectionEnv&) = delete;

  // Every Stat, ListDir, ReadAt and ReadFile of `path` returns `error` (which must not be ok).
  void SetError(const std::string& path, Status error);
  // ReadAt and ReadFile of `path` succeed but return the bytes with one bit flipped (in the middle
  // byte of what was read).
  void SetCorrupt(const std::string& path);
  // Every ReadAt and ReadFile sleeps this long before reading (a slow PFS). Zero turns it off.
  void SetDelay(std::chrono::nanoseconds delay);
  void ClearError(const std::string& path);
  void ClearCorrupt(const std::string& path);
  // Removes every fault (errors, corruptions and the delay); counters are kept.
  void ClearFaults();

  uint64_t reads() const { return reads_.load(std::memory_order_relaxed); }  // ReadAt + ReadFile
  uint64_t bytes_read() const { return bytes_read_.load(std::memory_order_relaxed); }
  uint64_t stats() const { return stats_.load(std::memory_order_relaxed); }
  uint64_t list_dirs() const { return list_dirs_.load(std::memory_order_relaxed); }

  Result<FileStat> Stat(const std::string& path) override;
  Result<std::vector<std::string>> ListDir(const std::string& dir) override;
  Status ReadAt(const std::string& path, uint64_t offset, std::span<std::byte> dst) override;
  Result<std::string> ReadFile(const std::string& path) override;

 private:
  // The injected error for `path`, or ok.
  Status ErrorFor(const std::string& path) const;
  bool IsCorrupt(const std::string& path) const;
  void Delay() const;

  Env* const base_;
  mutable Mutex mu_;
  std::unordered_map<std::string, Status> errors_ GUARDED_BY(mu_);
  std::set<std::string> corrupt_ GUARDED_BY(mu_);
  std::atomic<int64_t> delay_ns_{0};
  std::atomic<uint64_t> reads_{0};
  std::atomic<uint64_t> bytes_read_{0};
  std::atomic<uint64_t> stats_{0};
  std::atomic<uint64_t> list_dirs_{0};
};

}  // namespace nopfs::service
