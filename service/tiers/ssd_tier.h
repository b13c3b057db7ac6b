// SsdTier: the SSD cache tier of one job on one node, held in a few preallocated data files under
// the node's local scratch directory.
//
// Layout on disk (docs/tiers.md says why):
//   <scratch>/nopfs-<uid>/                 0700, owned by the daemon's user (shared by its jobs)
//   <scratch>/nopfs-<uid>/kept/            the kept area (kept/area.h), never touched here
//   <scratch>/nopfs-<uid>/<job>.<node>/    0700, this tier
//       lock                               flock()ed (LOCK_EX) for as long as the tier lives
//       data.0, data.1, ...                0600, samples at 4 KiB-aligned offsets given by the
//                                          TierLayout, preallocated (posix_fallocate) as below
// The directory is first built under a hidden temporary name with its lock held and then renamed
// into place, so a job directory always has a lock file and a lock that is not held means its
// daemon is gone. CleanupStale removes such directories (the next start and the epilog call it).
// After a crash, the rule for an epilog that cannot link this library is: once the job's processes
// are gone, `rm -rf <scratch>/nopfs-<uid>/<job>.*` (and the per-user directory if it is empty);
// nothing else of a job lives on disk.
//
// Create checks the free space (statvfs) but allocates nothing: the data files are preallocated
// in chunks of kAllocChunk, in slot order, by a background thread that starts at Create, and a
// fill whose chunk that thread has not reached yet allocates it first. Start-up therefore takes
// the same time whatever the tier's size, and the space is secured within moments of it. A chunk
// that cannot be allocated (the disk filled up meanwhile) fails the fills of its slots with
// ResourceExhausted, logged once; those samples come from the next source.
//
// Every Read verifies the xxh3 recorded at fill time: a mismatch returns Corruption naming the
// sample and the file and marks the slot failed so that the caller refetches from the PFS; a read
// that fails does the same. A fill that cannot write (a full disk) returns the error, and the
// caller fails that slot. The data files' I/O goes through a LocalIo (SsdTierOptions::io), where
// tests inject ENOSPC, EIO, short reads, slow I/O and flipped bytes.
// Reads and writes use O_DIRECT when the file system supports it and buffered I/O otherwise
// (tmpfs before Linux 6.6, some network file systems): the fallback is decided when the data
// files are opened and logged as a warning; direct_io() tells which one is in use.
//
// Thread safety: Read, Fill, IsReady and WaitReady are safe concurrently; Destroy (and the
// destructor) must not race with them.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "service/env/local_io.h"
#include "service/tiers/tier_layout.h"

namespace nopfs::service {

struct SsdTierOptions {
  std::string scratch_root;  // the node's local scratch directory (StorageClass::path); must exist
  std::string job;           // job id: letters, digits, '_', '-', '.'; not starting with '.'
  std::string node;          // node name or index, same characters
  bool direct_io = true;     // try O_DIRECT (falls back to buffered I/O where refused)
  LocalIo* io = nullptr;     // the data files' reads, writes and preallocation (tests inject
                             // faults); nullptr: LocalIo::Default(). Must outlive the tier.
  // [file]: a regular file of exactly the layout's file_bytes(file) that becomes that data file
  // (renamed into place, its bytes kept) instead of a new empty one; "" (or past the end): a new
  // one. One that cannot be taken is logged and a new file is made. Its slots stay empty: the
  // caller marks ready those whose bytes it knows (docs/tiers.md, "The kept area").
  std::vector<std::string> adopt_data = {};
};

class SsdTier final : public Tier {
 public:
  // Removes stale directories of this user first (CleanupStale; its failure is only logged), then
  // creates the job directory, takes its lock, creates the data files and starts preallocating
  // them in the background (above). ResourceExhausted, naming the directory and the shortfall in
  // bytes, when the file system has too little free space; FailedPrecondition when a live daemon
  // already holds the same job directory.
  static Result<std::unique_ptr<SsdTier>> Create(const SsdTierOptions& options, TierLayout layout);
  ~SsdTier() override;  // Destroy(), errors logged
  SsdTier(const SsdTier&) = delete;
  SsdTier& operator=(const SsdTier&) = delete;

  // Closes and removes every file and directory this tier created (the per-user directory too
  // when it is left empty). Idempotent. After it, the tier holds nothing (Read fails).
  Status Destroy();

  // Removes every job directory under <scratch_root>/nopfs-<uid>/ whose lock is not held (its
  // daemon died), and temporary directories older than a minute. Returns how many it removed.
  // Safe to run while live daemons of the same user use the directory.
  static Result<uint64_t> CleanupStale(const std::string& scratch_root, uid_t uid);
  static std::string UserDir(const std::string& scratch_root, uid_t uid);

  const std::string& dir() const { return dir_; }
  std::string DataPath(uint32_t file) const;
  bool direct_io() const { return direct_; }
  // Whether data file `file` was taken over from SsdTierOptions::adopt_data.
  bool adopted(uint32_t file) const { return file < adopted_.size() && adopted_[file]; }
  // Bytes of the data files preallocated so far.
  uint64_t allocated_bytes() const { return allocated_bytes_.load(std::memory_order_relaxed); }
  // Waits until the background preallocation has finished (tests, benchmarks).
  void WaitPreallocated();
  // Stops the background preallocation (chunks not reached stay unallocated) and joins it: the
  // kept area (service/reader/kept.h) takes the data files as they are. Idempotent.
  void StopPreallocation();

  static constexpr uint64_t kAllocChunk = uint64_t{64} << 20;

  bool IsReady(policy::SampleId sample) const override;
  // As RamTier::WaitReady.
  Status WaitReady(policy::SampleId sample, std::chrono::nanoseconds timeout) const;
  // Reads the sample into dst (exactly its size) and verifies its checksum. NotFound (not in this
  // tier), FailedPrecondition (not ready), Corruption (checksum mismatch) or the read's error
  // (IoError, ...), both naming the file and leaving the slot failed, so that the sample is read
  // from another source from then on. A dst aligned to 4096 bytes allows O_DIRECT; any other is
  // read buffered.
  Status Read(policy::SampleId sample, std::span<std::byte> dst);
  // Read, if that needs no disk I/O: the bytes in the page cache (preadv2 with RWF_NOWAIT on the
  // buffered descriptor, whatever dst's alignment; on tmpfs, which refuses RWF_NOWAIT, a plain
  // read), checked as Read checks them. Unavailable, with nothing marked, where the read would
  // wait for the disk or the file system cannot tell (then Read does it); never blocks on the
  // disk. The other errors as Read's.
  Status ReadIfCached(policy::SampleId sample, std::span<std::byte> dst);
  // The xxh3 recorded when `sample`'s slot was filled (what Read verifies); meaningful once
  // IsReady(sample).
  uint64_t RecordedXxh3(policy::SampleId sample) const {
    return slots_.expected(layout_.SlotOf(sample));
  }

  const char* kind() const override { return "ssd"; }
  const TierLayout& layout() const override { return layout_; }
  SlotTable& slots() override { return slots_; }
  const SlotTable& slots() const { return slots_; }
  uint64_t bounce_bytes() const override { return layout_.max_padded_size(); }
  Result<uint64_t> Fill(uint32_t slot, const FetchFn& fetch, std::span<std::byte> bounce) override;

 private:
  struct DataFile {
    int fd = -1;         // buffered
    int direct_fd = -1;  // O_DIRECT, or -1
  };
  SsdTier(std::string dir, TierLayout layout, int lock_fd, LocalIo* io);
  Status OpenFiles(bool direct_io, const std::vector<std::string>& adopt);
  // Preallocates the chunks that bytes [offset, offset + size) of data file `file` lie in.
  Status Preallocate(uint32_t file, uint64_t offset, uint64_t size);
  void PreallocateAll();  // the background thread
  // Read (nowait false) and ReadIfCached (true).
  Status ReadSlot(policy::SampleId sample, std::span<std::byte> dst, bool nowait);

  enum class ChunkState : uint8_t { kNone, kAllocated, kFailed };

  std::string dir_;
  TierLayout layout_;
  SlotTable slots_;
  int lock_fd_;
  LocalIo* const io_;
  bool direct_ = false;
  std::vector<DataFile> files_;
  std::vector<bool> adopted_;  // [file]
  // How ReadIfCached reads: kNoWait, preadv2 with RWF_NOWAIT; kMemory, the file system refused
  // that but keeps its files in memory (tmpfs: a read does not wait for a disk), so the read is
  // done when RWF_NOWAIT is refused; kRefused, neither (it no longer asks).
  enum class NoWait : uint8_t { kNoWait, kMemory, kRefused };
  std::atomic<NoWait> nowait_{NoWait::kNoWait};
  bool destroyed_ = false;
  // One chunk is allocated at a time; a chunk's state is read without the mutex (atomic) and
  // written under it. chunks_[file][chunk].
  Mutex alloc_mu_;
  std::vector<std::vector<std::atomic<ChunkState>>> chunks_;
  std::atomic<uint64_t> allocated_bytes_{0};
  std::atomic<bool> stop_alloc_{false};
  std::thread allocator_;
};

}  // namespace nopfs::service
