// RamTier: the RAM cache tier of one job on one node, held in a memfd (anonymous shared memory).
//
// The daemon creates one memfd named "nopfs-<job>-ram" (MFD_CLOEXEC | MFD_ALLOW_SEALING), sizes it
// to the layout's total bytes (rounded up to a page), maps it read-write and then seals it
// (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL): that one mapping, the
// daemon's, is the only way to write the tier. Prefetchers fetch straight into it. The memory is
// committed (posix_fallocate, then page tables filled) in chunks of kReserveChunk, each when a slot
// in it is first filled: start-up takes the same time whatever the tier's size, and the chunks come
// in first-access order (slot order). A chunk the node cannot provide fails the fills of its slots
// with ResourceExhausted (their samples are read from the next source), never a SIGBUS or an OOM
// kill mid-write. Clients of the same user receive a read-only descriptor (OpenReadOnlyFd, sent
// over the local socket) and map it PROT_READ: zero copy. Neither they nor any other process can
// write into the cache or change its size, even through a descriptor reopened read-write
// (/proc/PID/fd/N): write() fails and a writable mmap or mprotect is refused (EPERM / EACCES). fd()
// cannot write either.
//
// Nothing outlives the processes: a memfd has no name in any file system and disappears with its
// last descriptor and mapping, so a crashed daemon leaves nothing once its clients exit.
//
// Verification: Read (copy-out) checks the copy against the xxh3 recorded when the slot was
// filled; View (zero-copy) does not, so callers that hand out a View call Verify first or after.
// A mismatch marks the slot failed; the caller reads the sample from the PFS and may refill the
// slot (TryBeginFill + Fill + MarkReady) once no reader holds a View of it.
//
// Thread safety: all methods are safe to call concurrently; Fill for one slot at a time per slot
// (the SlotTable's TryBeginFill arbitrates).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "service/tiers/tier_layout.h"

namespace nopfs::service {

class RamTier final : public Tier {
 public:
  static constexpr uint64_t kReserveChunk = uint64_t{32} << 20;

  // job: the job id, used in the memfd name (shown in /proc/<pid>/fd and /proc/<pid>/maps).
  static Result<std::unique_ptr<RamTier>> Create(const std::string& job, TierLayout layout);
  ~RamTier() override;
  RamTier(const RamTier&) = delete;
  RamTier& operator=(const RamTier&) = delete;

  // The memfd (owned by the tier; closed by the destructor). Sealed: write() through it fails.
  int fd() const { return fd_; }
  // A new read-only descriptor of the same memory, for a client; the caller owns and closes it.
  Result<int> OpenReadOnlyFd() const;
  uint64_t mapped_bytes() const { return mapped_bytes_; }
  // Bytes committed so far (whole chunks; the last one may be shorter).
  uint64_t reserved_bytes() const;
  // The whole mapping (every slot), e.g. to register it for peers' RMA reads.
  std::span<const std::byte> mapping() const { return {base_, mapped_bytes_}; }
  // The xxh3 recorded when `sample`'s slot was filled; meaningful once IsReady(sample).
  uint64_t RecordedXxh3(policy::SampleId sample) const {
    return slots_.expected(layout_.SlotOf(sample));
  }

  // Whether the tier holds `sample` and it is ready to read.
  bool IsReady(policy::SampleId sample) const override;
  // Ok once the sample is ready; NotFound if the tier does not hold it; Unavailable if its fill
  // failed (read it from the PFS); TimedOut after `timeout`.
  Status WaitReady(policy::SampleId sample, std::chrono::nanoseconds timeout) const;
  // The sample's bytes in the mapping; valid while the tier lives. NotFound if not held,
  // FailedPrecondition if not ready.
  Result<std::span<const std::byte>> View(policy::SampleId sample) const;
  // Recomputes the sample's xxh3 and compares it with the one recorded at fill time. On mismatch
  // the slot is marked failed and Corruption is returned.
  Status Verify(policy::SampleId sample);
  // Copies the sample's bytes into dst (exactly its size) and verifies the copy against the
  // recorded xxh3: NotFound, FailedPrecondition (not ready), InvalidArgument (wrong size),
  // Corruption (mismatch; the slot is now failed, read the sample from the PFS).
  Status Read(policy::SampleId sample, std::span<std::byte> dst);

  const char* kind() const override { return "ram"; }
  const TierLayout& layout() const override { return layout_; }
  SlotTable& slots() override { return slots_; }
  const SlotTable& slots() const { return slots_; }
  uint64_t bounce_bytes() const override { return 0; }
  Result<uint64_t> Fill(uint32_t slot, const FetchFn& fetch, std::span<std::byte> bounce) override;

 private:
  RamTier(std::string name, TierLayout layout, int fd, std::byte* base, uint64_t mapped);
  std::span<std::byte> SlotBytes(uint32_t slot) const;
  // Commits the chunks that bytes [offset, offset + size) of the memfd lie in.
  Status Reserve(uint64_t offset, uint64_t size);

  enum class ChunkState : uint8_t { kNone, kReserved, kFailed };

  std::string name_;
  TierLayout layout_;
  SlotTable slots_;
  int fd_;
  std::byte* base_;
  uint64_t mapped_bytes_;
  // One chunk is committed at a time; a chunk's state is read without it (atomic) and written
  // under it.
  Mutex reserve_mu_;
  std::vector<std::atomic<ChunkState>> chunks_;
};

}  // namespace nopfs::service
