#include "service/tiers/ram_tier.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <spdlog/spdlog.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "common/checksum.h"

namespace nopfs::service {

Result<std::unique_ptr<RamTier>> RamTier::Create(const std::string& job, TierLayout layout) {
  const std::string name = "nopfs-" + job + "-ram";
  const int fd = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Status::FromErrno(errno, "ram tier: memfd_create(" + name + ")");
  const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t bytes = (layout.total_bytes() + page - 1) / page * page;
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int err = errno;
    close(fd);
    return Status::FromErrno(
        err, "ram tier: sizing " + name + " to " + std::to_string(bytes) + " bytes");
  }
  // The memory is reserved later, chunk by chunk, as the slots are first filled (Reserve): no
  // step of start-up costs time in proportion to the tier's size.
  std::byte* base = nullptr;
  if (bytes > 0) {
    // Mapped before the write seal below: this mapping is the only writable view of the tier
    // there will ever be.
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      close(fd);
      return Status::FromErrno(
          err, "ram tier: mapping " + name + " (" + std::to_string(bytes) + " bytes)");
    }
    base = static_cast<std::byte*>(p);
  }
  // F_SEAL_FUTURE_WRITE (Linux 5.1): from now on no descriptor of this memfd, however reopened
  // (/proc/PID/fd/N with O_RDWR), can write() it, map it writable or mprotect a mapping of it
  // writable; the mapping made above stays writable. A kernel without it fails the job here
  // rather than serve a tier that any process of the job could overwrite.
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) !=
      0) {
    const int err = errno;
    if (base != nullptr) munmap(base, bytes);
    close(fd);
    return Status::FromErrno(err,
                             "ram tier: sealing " + name +
                                 " against writes (F_SEAL_FUTURE_WRITE needs Linux 5.1 or later)");
  }
  TierLog()->info("ram tier {}: {} samples, {} bytes mapped", name, layout.slot_count(), bytes);
  return std::unique_ptr<RamTier>(new RamTier(name, std::move(layout), fd, base, bytes));
}

RamTier::RamTier(std::string name, TierLayout layout, int fd, std::byte* base, uint64_t mapped)
    : name_(std::move(name)),
      layout_(std::move(layout)),
      slots_(layout_.slot_count()),
      fd_(fd),
      base_(base),
      mapped_bytes_(mapped),
      chunks_((mapped + kReserveChunk - 1) / kReserveChunk) {}

RamTier::~RamTier() {
  if (base_ != nullptr) munmap(base_, mapped_bytes_);
  close(fd_);
}

Result<int> RamTier::OpenReadOnlyFd() const {
  const std::string path = "/proc/self/fd/" + std::to_string(fd_);
  const int ro = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (ro < 0) return Status::FromErrno(errno, "ram tier: reopening " + name_ + " read-only");
  return ro;
}

std::span<std::byte> RamTier::SlotBytes(uint32_t slot) const {
  const SlotExtent e = layout_.Extent(slot);
  return {base_ + e.offset, e.size};
}

bool RamTier::IsReady(policy::SampleId sample) const {
  const uint32_t slot = layout_.SlotOf(sample);
  return slot != kNoSlot && slots_.state(slot) == SlotState::kReady;
}

Status RamTier::WaitReady(policy::SampleId sample, std::chrono::nanoseconds timeout) const {
  const uint32_t slot = layout_.SlotOf(sample);
  if (slot == kNoSlot) {
    return Status::NotFound("ram tier: sample " + std::to_string(sample) + " is not in this tier");
  }
  return slots_.WaitReady(slot, timeout).WithContext("ram tier: sample " + std::to_string(sample));
}

Result<std::span<const std::byte>> RamTier::View(policy::SampleId sample) const {
  const uint32_t slot = layout_.SlotOf(sample);
  if (slot == kNoSlot) {
    return Status::NotFound("ram tier: sample " + std::to_string(sample) + " is not in this tier");
  }
  const SlotState s = slots_.state(slot);
  if (s != SlotState::kReady) {
    return Status::FailedPrecondition("ram tier: sample " + std::to_string(sample) + " is " +
                                      SlotStateName(s) + ", not ready");
  }
  return std::span<const std::byte>(SlotBytes(slot));
}

Status RamTier::Verify(policy::SampleId sample) {
  auto view = View(sample);
  if (!view.ok()) return view.status();
  const uint32_t slot = layout_.SlotOf(sample);
  // In place, in a stream's shuffled order: the tier's bytes are cold, so prefetch while hashing.
  const uint64_t got = ColdXxh3(*view);
  const uint64_t want = slots_.expected(slot);
  if (got == want) return Status::Ok();
  slots_.MarkFailed(slot);
  TierLog()->error("ram tier {}: sample {} corrupted (xxh3 {:016x}, expected {:016x})", name_,
                   sample, got, want);
  return Status::Corruption("ram tier " + name_ + ": sample " + std::to_string(sample) +
                            ": checksum mismatch; read it from the PFS");
}

Status RamTier::Read(policy::SampleId sample, std::span<std::byte> dst) {
  auto view = View(sample);
  if (!view.ok()) return view.status();
  if (dst.size() != view->size()) {
    return Status::InvalidArgument("ram tier: sample " + std::to_string(sample) + " has " +
                                   std::to_string(view->size()) + " bytes, the buffer " +
                                   std::to_string(dst.size()));
  }
  if (!dst.empty()) std::memcpy(dst.data(), view->data(), dst.size());
  const uint32_t slot = layout_.SlotOf(sample);
  const uint64_t got = XXH3_64bits(dst.data(), dst.size());
  const uint64_t want = slots_.expected(slot);
  if (got == want) return Status::Ok();
  slots_.MarkFailed(slot);
  TierLog()->error("ram tier {}: sample {} corrupted (xxh3 {:016x}, expected {:016x})", name_,
                   sample, got, want);
  return Status::Corruption("ram tier " + name_ + ": sample " + std::to_string(sample) +
                            ": checksum mismatch; slot marked failed, read it from the PFS");
}

uint64_t RamTier::reserved_bytes() const {
  uint64_t n = 0;
  for (size_t c = 0; c < chunks_.size(); ++c) {
    if (chunks_[c].load(std::memory_order_relaxed) == ChunkState::kReserved) {
      n += std::min(kReserveChunk, mapped_bytes_ - c * kReserveChunk);
    }
  }
  return n;
}

Status RamTier::Reserve(uint64_t offset, uint64_t size) {
  if (size == 0) return Status::Ok();
  const uint64_t first = offset / kReserveChunk;
  const uint64_t last = (offset + size - 1) / kReserveChunk;
  for (uint64_t c = first; c <= last; ++c) {
    ChunkState s = chunks_[c].load(std::memory_order_acquire);
    if (s == ChunkState::kReserved) continue;
    MutexLock lock(&reserve_mu_);
    s = chunks_[c].load(std::memory_order_relaxed);
    if (s == ChunkState::kNone) {
      const uint64_t begin = c * kReserveChunk;
      const uint64_t len = std::min(kReserveChunk, mapped_bytes_ - begin);
      // Committed before the first write: a node short of memory (or a job at its cgroup's
      // limit) gets ENOMEM/ENOSPC here and the chunk's slots are read from the next source,
      // instead of a SIGBUS or an OOM kill in the middle of a write.
      const int err = posix_fallocate(fd_, static_cast<off_t>(begin), static_cast<off_t>(len));
      if (err != 0) {
        s = ChunkState::kFailed;
        TierLog()->error(
            "ram tier {}: cannot reserve bytes {}..{} of memory ({}); the samples there are "
            "read from the next source; lower the RAM capacity in the config",
            name_, begin, begin + len, std::strerror(err));
      } else {
        // Page tables filled now (Linux 5.14): the fill then writes without a fault per page.
        // An older kernel says EINVAL and the pages fault in as they are written.
        (void)madvise(base_ + begin, len, MADV_POPULATE_WRITE);
        s = ChunkState::kReserved;
      }
      chunks_[c].store(s, std::memory_order_release);
    }
    if (s == ChunkState::kFailed) {
      return Status::ResourceExhausted("ram tier " + name_ + ": no memory for bytes " +
                                       std::to_string(c * kReserveChunk) + " onwards of the tier");
    }
  }
  return Status::Ok();
}

Result<uint64_t> RamTier::Fill(uint32_t slot, const FetchFn& fetch, std::span<std::byte>) {
  const SlotExtent e = layout_.Extent(slot);
  if (Status s = Reserve(e.offset, e.size); !s.ok()) return s;
  return fetch(layout_.SampleAt(slot), SlotBytes(slot));
}

}  // namespace nopfs::service
