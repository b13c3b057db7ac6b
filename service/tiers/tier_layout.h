// TierLayout: where each sample of one cache tier lives, and the per-slot state shared by the
// prefetchers and the readers of that tier.
//
// A tier's samples are numbered by "slot": slot i is entry i of the tier's prefetch list
// (policy::TierPlan::prefetch_order), so slot order is first-access order. Each slot has a byte
// range inside one of the tier's backing files:
//  - RAM: one file (the memfd), samples packed back to back, each offset a multiple of 64 bytes
//    (a cache line) so that clients can use aligned loads;
//  - SSD: a few large data files of at most `max_file_bytes` each, every offset a multiple of
//    4096 bytes so that O_DIRECT reads and writes need no read-modify-write. A sample never
//    straddles two files; one larger than max_file_bytes gets a file to itself.
// The sample -> slot lookup costs F/8 bytes of bitmap plus 1/128 byte per sample of rank index and
// 4 bytes per cached sample (about 2 MB + 4 B per cached sample for F = 14M); per slot the layout
// keeps a 64-bit offset and a 64-bit size. No hash map.
//
// Thread safety: TierLayout is immutable after Make() and safe to share. SlotTable is safe for
// concurrent use by any number of threads.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "policy/job.h"
#include "policy/plan.h"

namespace spdlog {
class logger;
}  // namespace spdlog

namespace nopfs::service {

// The "tier" logger (spdlog), created on first use as a clone of the default logger.
std::shared_ptr<spdlog::logger> TierLog();

inline constexpr uint64_t kRamAlignment = 64;
inline constexpr uint64_t kSsdAlignment = 4096;
// Default upper bound of one SSD data file: large enough that a node's tier is a handful of files,
// small enough that each can be preallocated (and removed) in reasonable time.
inline constexpr uint64_t kDefaultSsdFileBytes = uint64_t{16} << 30;
inline constexpr uint32_t kNoSlot = UINT32_MAX;

struct SlotExtent {
  uint32_t file = 0;    // index of the backing file
  uint64_t offset = 0;  // byte offset inside that file, a multiple of the layout's alignment
  uint64_t size = 0;    // exact sample size in bytes
};

class TierLayout {
 public:
  TierLayout() = default;

  // Lays out `plan.prefetch_order` in order. sizes[k] is sample k's size (sizes.size() = F).
  // alignment: a power of two; max_file_bytes: the largest file (0 = one file, unbounded).
  // InvalidArgument when a sample id is >= F or repeated, alignment is not a power of two, or
  // the list holds more than 2^32-2 samples.
  static Result<TierLayout> Make(const policy::TierPlan& plan, std::span<const uint64_t> sizes,
                                 uint64_t alignment, uint64_t max_file_bytes);
  static Result<TierLayout> Ram(const policy::TierPlan& plan, std::span<const uint64_t> sizes) {
    return Make(plan, sizes, kRamAlignment, 0);
  }
  static Result<TierLayout> Ssd(const policy::TierPlan& plan, std::span<const uint64_t> sizes,
                                uint64_t max_file_bytes = kDefaultSsdFileBytes) {
    return Make(plan, sizes, kSsdAlignment, max_file_bytes);
  }

  uint32_t slot_count() const { return static_cast<uint32_t>(samples_.size()); }
  uint64_t alignment() const { return alignment_; }
  // Slot of `sample`, or kNoSlot when the tier does not hold it (including ids >= F). O(1).
  uint32_t SlotOf(policy::SampleId sample) const;
  policy::SampleId SampleAt(uint32_t slot) const { return samples_[slot]; }
  SlotExtent Extent(uint32_t slot) const;
  uint64_t SizeOf(uint32_t slot) const { return sizes_[slot]; }
  // Bytes of slot `slot` rounded up to the alignment (what an O_DIRECT transfer moves).
  uint64_t PaddedSizeOf(uint32_t slot) const { return RoundUp(sizes_[slot]); }

  // Backing files and their sizes (each a multiple of the alignment). A tier with no sample has
  // no file.
  uint32_t file_count() const { return static_cast<uint32_t>(file_bytes_.size()); }
  uint64_t file_bytes(uint32_t file) const { return file_bytes_[file]; }
  // Sum of file sizes (>= sum of sample sizes, the difference being alignment padding).
  uint64_t total_bytes() const { return total_bytes_; }
  // Sum of exact sample sizes.
  uint64_t payload_bytes() const { return payload_bytes_; }
  // Largest padded sample: a per-thread bounce buffer of this size suffices for any slot.
  uint64_t max_padded_size() const { return max_padded_; }

 private:
  uint64_t RoundUp(uint64_t n) const { return (n + alignment_ - 1) & ~(alignment_ - 1); }

  uint64_t alignment_ = 1;
  std::vector<policy::SampleId> samples_;  // [slot]
  std::vector<uint64_t> offsets_;          // [slot]: offset in the concatenation of the files
  std::vector<uint64_t> sizes_;            // [slot]
  std::vector<uint64_t> file_start_;       // [file]: first byte of file in the concatenation
  std::vector<uint64_t> file_bytes_;       // [file]
  uint64_t total_bytes_ = 0;
  uint64_t payload_bytes_ = 0;
  uint64_t max_padded_ = 0;
  // sample -> slot: bit k set when sample k is held; rank_[k/512] = set bits before block k/512;
  // by_rank_[r] = slot of the r-th held sample in id order.
  std::vector<uint64_t> bits_;
  std::vector<uint32_t> rank_;
  std::vector<uint32_t> by_rank_;
};

enum class SlotState : uint8_t { kEmpty = 0, kFilling = 1, kReady = 2, kFailed = 3 };
const char* SlotStateName(SlotState s);

// Per-slot state machine and recorded checksum:
//   empty/failed --TryBeginFill--> filling --MarkReady(xxh3)--> ready
//                                         --MarkFailed-------> failed
//                                         --Abandon----------> empty
//   ready --MarkFailed (checksum mismatch)--> failed
// One byte of state and 8 bytes of checksum per slot. The checksum of a ready slot is visible to
// any thread that observed kReady (release/acquire).
class SlotTable {
 public:
  explicit SlotTable(uint32_t slots);
  SlotTable(const SlotTable&) = delete;
  SlotTable& operator=(const SlotTable&) = delete;

  uint32_t size() const { return n_; }
  SlotState state(uint32_t slot) const {
    return static_cast<SlotState>(state_[slot].load(std::memory_order_acquire));
  }
  // True when this caller now owns the fill of `slot` (it was empty or failed).
  bool TryBeginFill(uint32_t slot);
  void MarkReady(uint32_t slot, uint64_t xxh3);
  void MarkFailed(uint32_t slot);
  // Gives a slot in kFilling back (the fill was cancelled, not failed).
  void Abandon(uint32_t slot);
  // The xxh3 recorded by MarkReady; meaningful once state() has been seen as kReady.
  uint64_t expected(uint32_t slot) const { return hash_[slot].load(std::memory_order_relaxed); }
  // Blocks until the slot is ready (Ok), failed (Unavailable) or the timeout passes (TimedOut).
  Status WaitReady(uint32_t slot, std::chrono::nanoseconds timeout) const;

 private:
  void Set(uint32_t slot, SlotState s);

  uint32_t n_;
  std::unique_ptr<std::atomic<uint8_t>[]> state_;
  std::unique_ptr<std::atomic<uint64_t>[]> hash_;
  mutable Mutex mu_;
  mutable CondVar cv_;
  mutable std::atomic<uint32_t> waiters_{0};
};

// Reads one sample from its source (the PFS, via the catalog) into `dst`, which is exactly the
// sample's size, and returns the xxh3 (XXH3_64bits) of those bytes.
using FetchFn = std::function<Result<uint64_t>(policy::SampleId, std::span<std::byte> dst)>;

// What every tier does, for the prefetchers, the reader and the peers. Implemented by RamTier and
// SsdTier.
class Tier {
 public:
  virtual ~Tier() = default;
  virtual const char* kind() const = 0;  // "ram", "ssd": for logs
  virtual const TierLayout& layout() const = 0;
  virtual SlotTable& slots() = 0;
  // Whether the tier holds `sample` and it is ready to read.
  virtual bool IsReady(policy::SampleId sample) const = 0;
  // Bytes of aligned scratch memory one filling thread must pass to Fill (0: none needed).
  virtual uint64_t bounce_bytes() const = 0;
  // Fetches slot `slot`'s sample with `fetch` and stores it in the tier; returns its xxh3.
  // The caller owns the slot (TryBeginFill succeeded) and marks it ready or failed afterwards.
  // `bounce` is bounce_bytes() bytes aligned to 4096, private to the calling thread.
  // Thread safety: concurrent calls for different slots are safe.
  virtual Result<uint64_t> Fill(uint32_t slot, const FetchFn& fetch,
                                std::span<std::byte> bounce) = 0;
};

}  // namespace nopfs::service
