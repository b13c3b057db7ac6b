// The per-stream staging ring: a single-producer (nopfsd) single-consumer (one training rank)
// queue of samples in one sealed memfd, consumed without copying.
//
// Layout (docs/wire.md has it byte by byte): a 4 KiB header page (geometry, counters, futex words,
// the consumer's stall statistics), a slot table of `slot_count` 64-byte slots, then a data arena
// of `capacity` bytes in which each sample occupies one contiguous, 64-byte-aligned extent (an
// extent that would cross the end starts again at offset 0).
//
// Order: the producer's sequencing thread calls Reserve() in the rank's exact stream order; each
// reservation gets the next sequence number. Publish()/PublishError() may then come from any thread
// in any order; the consumer still sees samples strictly in sequence order. Release() may come in
// any order; space is reclaimed once the oldest contiguous prefix is released. Reserve() blocks
// while the arena or the slot table is full (back-pressure): the producer never overwrites a sample
// the consumer has not released.
//
// Trust: the producer (nopfsd) keeps every allocation decision in its own memory; the only values
// it reads from the shared header are the consumer's release counter (clamped to what was handed
// out) and the statistics (reported, never used to index anything). A client that scribbles over
// the mapping can therefore only corrupt its own samples. The consumer validates every offset and
// size it reads against the mapping before forming a pointer.
//
// Waiting uses shared (non-private) futexes on 32-bit words in the mapping, with bounded waits, so
// a dead or cancelled peer is noticed (a dead producer through the socket the consumer watches,
// RingReader::WatchProducer). A side calls FUTEX_WAKE only when the other sleeps (each
// counts its sleepers in the header), and a producer out of space sleeps until a batch of samples
// is released or the consumer runs dry: no system call per sample in the steady state.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "protocol/wire.h"

namespace nopfs::ring {

inline constexpr uint32_t kRingMagic = 0x474E5252;  // "RRNG"
inline constexpr uint32_t kRingVersion = 2;         // 2: the waiter counts (docs/wire.md)
inline constexpr uint64_t kAlign = 64;
inline constexpr uint64_t kHeaderBytes = 4096;
inline constexpr uint64_t kSlotBytes = 64;
inline constexpr uint64_t kMaxCapacity = uint64_t{1} << 40;  // 1 TiB
inline constexpr uint32_t kMaxSlots = 1u << 24;
inline constexpr int kHistogramBuckets = 64;

// What the producer knows about a sample when it reserves space for it.
struct SampleMeta {
  uint32_t sample_id = 0;
  int64_t label = 0;
  uint32_t epoch = 0;
  uint64_t step = 0;      // the training step (batch) this sample belongs to
  uint64_t position = 0;  // the sample's index in the rank's stream within the epoch
};

// Statistics the consumer keeps in the header (stall = time spent inside Next() waiting).
struct RingStats {
  uint64_t samples = 0;     // samples returned by Next() (errors included)
  uint64_t bytes = 0;       // payload bytes returned
  uint64_t next_calls = 0;  // Next() calls, including those that timed out or hit end of stream
  uint64_t stall_ns_total = 0;
  uint64_t stall_ns_median = 0;  // upper bound of the histogram bucket holding the median
  uint64_t stall_ns_p99 = 0;     // upper bound of the bucket holding the 99th percentile
  std::array<uint64_t, kHistogramBuckets> histogram{};  // bucket b: stalls in [2^(b-1), 2^b) ns
};

// Bucket of a stall of `ns` nanoseconds (0 -> 0, else bit width, capped at 63).
int StallBucket(uint64_t ns);
// Fills median and p99 from the histogram.
void SummarizeStalls(RingStats* stats);

// Total bytes of a ring's memfd for the given geometry (header + slots rounded to a page + arena).
uint64_t RingBytes(uint64_t capacity, uint32_t slot_count);

// A read-only mapping of a region: a RAM cache tier's memfd, sealed against shrinking, that a
// ring's slots may point into (RingWriter::PublishInRegion). Shared: the streams of one client
// connection that are handed the same memfd use one mapping (client::Client keeps it while the
// connection lives), so that a later stream does not fault in every page of the tier again.
class Region {
 public:
  // Maps the first `bytes` of `fd` read-only, after checking that the file holds them and is
  // sealed against shrinking (so no page of the mapping can vanish under a reader).
  static Result<std::shared_ptr<const Region>> Map(int fd, uint64_t bytes);
  ~Region();
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  const std::byte* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }
  // Whether `fd` is the file this region maps (the same device and inode: unambiguous, since
  // the mapping keeps the file alive).
  bool Maps(int fd) const;

  // Copies the `size` bytes at `at` (inside the mapping) to `dst` by pread() from the file:
  // through the kernel's own mapping, leaving this process's untouched. For a process that
  // reads each sample once (a DataLoader worker that lives one pass): the first touch of a page
  // of a fresh mapping costs a page fault, which on a virtual machine takes longer than the
  // copy. Safe from any thread.
  void Read(const std::byte* at, uint64_t size, std::byte* dst) const;

 private:
  Region() = default;

  const std::byte* data_ = nullptr;
  uint64_t bytes_ = 0;
  uint64_t dev_ = 0;
  uint64_t ino_ = 0;
  int fd_ = -1;  // a duplicate of the file's descriptor, for Read()
};

// The producer side, owned by nopfsd.
// Thread safety: Reserve() and Finish() from one sequencing thread; Publish(), PublishError(),
// Cancel() and stats() from any thread.
class RingWriter {
 public:
  struct Reservation {
    uint64_t seq = 0;
    std::span<std::byte> dst;  // exactly the requested size; write the sample here, then Publish
  };

  // A fresh memfd (MFD_CLOEXEC|MFD_ALLOW_SEALING) sized and sealed against shrink and grow.
  // `capacity` is rounded up to a multiple of 64; slot_count in [1, kMaxSlots].
  static Result<std::unique_ptr<RingWriter>> Create(uint64_t capacity, uint32_t slot_count,
                                                    std::string name = "nopfs-ring");
  ~RingWriter();
  RingWriter(const RingWriter&) = delete;
  RingWriter& operator=(const RingWriter&) = delete;

  // The memfd, to hand to the client (the writer keeps ownership).
  int fd() const { return fd_.get(); }
  uint64_t capacity() const { return capacity_; }
  uint32_t slot_count() const { return slot_count_; }

  // How a reservation's arena bytes are backed.
  enum class Space {
    kCommitted,  // committed before Reserve returns: write them at once
    kOnCommit,   // not yet: call Commit(seq) before writing them (a producer that may publish
                 // the sample in the region instead never commits the arena for it)
  };
  // Reserves the next sequence number and `size` contiguous bytes, blocking until the consumer
  // has released enough (back-pressure). InvalidArgument if size > capacity; TimedOut at
  // `deadline`; Unavailable after Cancel(); FailedPrecondition after Finish(); with kCommitted,
  // the error of committing the space (Commit).
  Result<Reservation> Reserve(uint64_t size, const SampleMeta& meta,
                              std::chrono::steady_clock::time_point deadline,
                              Space space = Space::kCommitted);
  // Commits the shared memory under a reserved seq's bytes, if it is not yet (the arena is
  // committed from its start in chunks, as positions are first written, so that a ring costs
  // no memory and no time for the bytes it never holds). A node short of memory fails here
  // (ResourceExhausted) rather than with SIGBUS or the OOM killer mid-write. Any thread.
  Status Commit(uint64_t seq);
  // Makes a reserved sample visible. FailedPrecondition for a seq not reserved or already
  // published.
  Status Publish(uint64_t seq);
  // The same with the sample's actual size, at most the reserved size (a producer that reserves
  // room for an error message publishes a smaller sample this way); InvalidArgument if larger.
  Status Publish(uint64_t seq, uint64_t size);
  // Makes a reserved sample visible whose bytes are not in the arena but at [offset, offset +
  // size) of the stream's region (the cache tier the client mapped, RingReader::AttachRegion):
  // zero copy. The reserved extent stays unused until the consumer releases the seq. Only for a
  // consumer that attached a region (the service knows from OPEN_STREAM's flags).
  Status PublishInRegion(uint64_t seq, uint64_t offset, uint64_t size);
  // Makes `seq` an error slot: the consumer's Next() returns `error` (its code and message, which
  // should name the sample id and its path). The message is stored in the reserved bytes,
  // truncated to them if it is longer (reserve at least ~256 bytes when an error is possible; the
  // daemon can also reserve a fresh slot for the error).
  Status PublishError(uint64_t seq, const Status& error);
  // End of stream: no sequence number at or after the next one will be produced.
  void Finish();
  // Wakes and fails a blocked Reserve() and the consumer's Next(); used when the client leaves.
  void Cancel();
  bool cancelled() const;
  // The consumer's statistics, read from the shared header and bounded by what the producer
  // knows (the client can write anything there): samples by the seqs published, bytes by the
  // bytes published, the stall total by the ring's age, the histogram to stalls no longer than
  // the age (so median and p99, bucket upper bounds, stay below twice the age), next_calls by the
  // histogram's count. A forged figure is at worst implausible, never beyond those bounds.
  RingStats stats() const;
  // Sequence numbers handed out so far / released by the consumer (clamped).
  uint64_t reserved() const;
  uint64_t released() const;

 private:
  RingWriter() = default;
  // Advances the arena tail over released samples; returns released.
  uint64_t ReclaimLocked() REQUIRES(mu_);
  // Commits the arena's first `end` bytes (rounded up to a chunk), if not yet.
  Status CommitArena(uint64_t end) EXCLUDES(commit_mu_);
  std::byte* arena() const;

  wire::UniqueFd fd_;
  std::byte* base_ = nullptr;
  uint64_t map_bytes_ = 0;
  uint64_t capacity_ = 0;
  uint32_t slot_count_ = 0;

  mutable Mutex mu_;
  uint64_t next_seq_ GUARDED_BY(mu_) = 0;
  uint64_t reclaimed_ GUARDED_BY(mu_) = 0;  // samples whose space is free again
  uint64_t head_ GUARDED_BY(mu_) = 0;       // arena write position (monotonic)
  uint64_t tail_ GUARDED_BY(mu_) = 0;       // arena position of the oldest unreleased byte
  // Per slot, the arena end of its sample, its extent and whether published.
  struct Pending {
    uint64_t end = 0;
    uint64_t offset = 0;
    uint64_t size = 0;
    bool published = false;
  };
  std::vector<Pending> pending_ GUARDED_BY(mu_);
  bool finished_ GUARDED_BY(mu_) = false;
  uint64_t published_ GUARDED_BY(mu_) = 0;        // seqs published (samples and errors)
  uint64_t published_bytes_ GUARDED_BY(mu_) = 0;  // payload bytes of published samples
  std::chrono::steady_clock::time_point created_ = std::chrono::steady_clock::now();
  std::atomic<bool> cancelled_{false};  // private copy: the client cannot forge it
  Mutex commit_mu_;                     // one committer at a time
  std::atomic<uint64_t> committed_{0};  // arena bytes committed, from offset 0
};

// One sample as seen by the consumer. `data` points into the shared mapping and stays valid until
// Release(seq) (or the reader is destroyed).
struct View {
  uint64_t seq = 0;
  uint32_t sample_id = 0;
  int64_t label = 0;
  uint32_t epoch = 0;
  uint64_t step = 0;
  uint64_t position = 0;
  const std::byte* data = nullptr;
  uint64_t size = 0;
};

// The consumer side, in the training process.
// Thread safety: all methods are serialized by an internal mutex, except that Next() waits without
// holding it so that Release() from another thread is never blocked by a waiting Next().
class RingReader {
 public:
  // Maps a ring received from the service. Checks magic, version, geometry against `expect_*`,
  // that the file is large enough and sealed against shrinking.
  static Result<std::unique_ptr<RingReader>> Open(wire::UniqueFd fd, uint64_t expect_capacity,
                                                  uint32_t expect_slots);
  ~RingReader();
  RingReader(const RingReader&) = delete;
  RingReader& operator=(const RingReader&) = delete;

  // The next sample in sequence order. std::nullopt at end of stream. An error slot becomes the
  // service's Status (the slot is consumed and released; the next call moves on). TimedOut if
  // nothing arrives within `timeout`; Unavailable if the service cancelled the ring or is gone
  // (WatchProducer); Corruption
  // if the shared memory holds an impossible slot.
  Result<std::optional<View>> Next(std::chrono::nanoseconds timeout);
  // Takes up to `n` samples in sequence order in one call, appended to `out`: one pass over the
  // slots, one update of what was delivered, one stall record for the lot. Waits (up to
  // `timeout`) for each sample in turn, but returns the samples it has (fewer than n) at the end
  // of the stream, before an error slot or an impossible slot (the next call reports it), when
  // the timeout passes, and when the producer sleeps for space that the samples of this call
  // hold (a batch larger than the arena: release it and ask again). At most the free slots (the
  // slot table less the samples held). Returns how many it appended: 0 at end of stream. The
  // first sample's failure is the call's, as Next()'s.
  Result<size_t> NextBatch(size_t n, std::chrono::nanoseconds timeout, std::vector<View>* out);
  // Gives a sample's space back. Any order; FailedPrecondition for a seq not outstanding.
  Status Release(uint64_t seq);
  // Gives several samples back at once (any order): one lock and one update of the shared
  // counter for the lot. All or nothing: FailedPrecondition, and nothing released, if one of
  // them is not outstanding or is named twice.
  Status ReleaseBatch(std::span<const uint64_t> seqs);
  // Watches `fd` (the consumer's socket to the service, owned by the caller and open while the
  // reader lives) for a hang-up: when nothing is ready, Next() polls it before every wait slice,
  // so a producer that died without Finish() or Cancel() (killed, crashed) fails Next() with
  // Unavailable within one slice (50 ms) instead of at its timeout. Samples published before
  // the producer died are still delivered first. -1 (the default): no watch.
  void WatchProducer(int fd) { watch_fd_ = fd; }
  // Whether the watched socket has hung up (the producer is gone), now; false without a watch.
  bool ProducerGone() const;
  // Attaches the region that slots may point into (RingWriter::PublishInRegion). At most once,
  // before such slots arrive; without it such a slot is a Corruption error. Its views stay valid
  // while the reader lives (the reader holds the region).
  Status AttachRegion(std::shared_ptr<const Region> region);
  // The same, mapping `bytes` of `fd` for this reader alone (Region::Map).
  Status AttachRegion(wire::UniqueFd fd, uint64_t bytes);
  // The attached region, or null. Set once by AttachRegion() before the first view points into it,
  // so a caller holding views may read it without the lock.
  const Region* region() const { return region_hold_.get(); }
  RingStats stats() const;
  // FUTEX_WAKE calls this reader made to wake the producer, and whether a producer sleeps now
  // waiting for space (for tests of the wake-up protocol).
  uint64_t producer_wakes() const { return producer_wakes_.load(std::memory_order_relaxed); }
  bool producer_asleep() const;

 private:
  RingReader() = default;
  // How waiting for one seq ended (WaitFor).
  enum class Wait { kReady, kEnd, kCancelled, kTimedOut, kGone, kProducerBlocked };
  // Waits until `seq` is published (its slot state in *state), the stream ends, or it cannot
  // come; with stop_if_producer_blocked, also stops when the producer sleeps for space.
  Wait WaitFor(uint64_t seq, std::chrono::steady_clock::time_point deadline,
               bool stop_if_producer_blocked, uint64_t* state);
  Result<View> ReadSlot(uint64_t seq, uint64_t state) const;
  static Status WaitError(Wait w, uint64_t seq);
  Status ConsumeError(const View& v);
  void RecordStall(uint64_t ns, uint64_t samples, uint64_t bytes);
  void AdvanceReleasedLocked() REQUIRES(mu_);

  wire::UniqueFd fd_;
  std::byte* ctl_ = nullptr;  // header + slot table, read-write
  uint64_t ctl_bytes_ = 0;
  const std::byte* data_ = nullptr;            // arena, read-only
  std::shared_ptr<const Region> region_hold_;  // the attached region (set once, before use)
  const std::byte* region_ = nullptr;          // its bytes, read-only
  uint64_t region_bytes_ = 0;
  uint64_t capacity_ = 0;
  uint32_t slot_count_ = 0;
  int watch_fd_ = -1;  // WatchProducer; not owned

  mutable Mutex mu_;
  Mutex next_mu_;                               // serializes Next() callers
  uint64_t next_seq_ GUARDED_BY(next_mu_) = 0;  // next seq Next() returns
  uint64_t delivered_ GUARDED_BY(mu_) = 0;      // seqs < delivered_ have been handed out
  uint64_t released_ GUARDED_BY(mu_) = 0;       // all seqs < released_ are released
  std::vector<bool> done_ GUARDED_BY(mu_);      // per slot, released but not yet in the prefix
  std::atomic<uint64_t> producer_wakes_{0};
};

}  // namespace nopfs::ring
