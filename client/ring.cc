#include "client/ring.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <climits>
#include <cstring>
#include <new>
#include <thread>

#include "common/mutex.h"

namespace nopfs::ring {
namespace {

// The header page. Field offsets are part of the format (docs/wire.md); the static_asserts below
// pin them.
struct SharedHeader {
  // Written once by the producer at creation.
  uint32_t magic;
  uint32_t version;
  uint64_t capacity;
  uint32_t slot_count;
  uint32_t reserved0;
  uint64_t data_offset;
  uint8_t pad0[32];
  // Producer-written (offset 64).
  std::atomic<uint32_t> prod_event;  // futex: bumped on every publish, Finish and Cancel
  std::atomic<uint32_t> cancelled;
  std::atomic<uint64_t> end_seq;  // UINT64_MAX until Finish()
  // The producer's sleep (offset 80): how many producer threads sleep on cons_event, and the
  // `released` value at which the consumer wakes them (a batch of space, not every slot).
  std::atomic<uint32_t> space_waiters;
  uint32_t reserved2;
  std::atomic<uint64_t> space_wanted;
  uint8_t pad1[32];
  // Consumer-written (offset 128).
  std::atomic<uint32_t> cons_event;    // futex: bumped on every release
  std::atomic<uint32_t> data_waiters;  // consumer threads asleep on prod_event
  std::atomic<uint64_t> released;      // every seq below this is released
  std::atomic<uint64_t> samples;
  std::atomic<uint64_t> bytes;
  std::atomic<uint64_t> next_calls;
  std::atomic<uint64_t> stall_ns_total;
  uint8_t pad2[16];
  std::atomic<uint64_t> histogram[kHistogramBuckets];  // offset 192
};

struct Slot {
  std::atomic<uint64_t> state;  // (seq << 2) | kind
  uint32_t code;                // StatusCode of an error slot
  uint32_t sample_id;
  int64_t label;
  uint32_t epoch;
  uint32_t region;  // where offset points: 0 the arena, 1 the stream's region (a cache tier)
  uint64_t step;
  uint64_t position;
  uint64_t offset;  // into the arena
  uint64_t size;
};

constexpr uint64_t kKindReady = 1;
constexpr uint64_t kKindError = 2;

static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(sizeof(std::atomic<uint64_t>) == 8 && sizeof(std::atomic<uint32_t>) == 4);
static_assert(offsetof(SharedHeader, prod_event) == 64);
static_assert(offsetof(SharedHeader, end_seq) == 72);
static_assert(offsetof(SharedHeader, space_waiters) == 80);
static_assert(offsetof(SharedHeader, space_wanted) == 88);
static_assert(offsetof(SharedHeader, cons_event) == 128);
static_assert(offsetof(SharedHeader, data_waiters) == 132);
static_assert(offsetof(SharedHeader, released) == 136);
static_assert(offsetof(SharedHeader, histogram) == 192);
static_assert(sizeof(SharedHeader) <= kHeaderBytes);
static_assert(sizeof(Slot) == kSlotBytes);
static_assert(offsetof(Slot, offset) == 48);

uint64_t RoundUp(uint64_t v, uint64_t a) {
  return (v + a - 1) / a * a;
}

uint64_t SlotTableBytes(uint32_t slots) {
  return RoundUp(uint64_t{slots} * kSlotBytes, 4096);
}

SharedHeader* HeaderAt(std::byte* base) {
  return std::launder(reinterpret_cast<SharedHeader*>(base));
}
Slot* SlotAt(std::byte* base, uint64_t i) {
  return std::launder(reinterpret_cast<Slot*>(base + kHeaderBytes + i * kSlotBytes));
}

uint32_t* FutexWord(std::atomic<uint32_t>* a) {
  return reinterpret_cast<uint32_t*>(a);
}

// Shared (not FUTEX_PRIVATE) so that the other process's waiters on the same page are found.
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds timeout) {
  if (timeout.count() <= 0) return;
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1000000000);
  ::syscall(SYS_futex, FutexWord(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWake(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, FutexWord(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// Bumps the producer's event and wakes the consumer if it sleeps on it. A waiter reads the event
// before it checks its condition, then counts itself, then sleeps only while the event still has
// the value it read (FUTEX_WAIT); with sequentially consistent operations on both sides a sleeper
// is never missed: either the waker sees the count, or the sleeper sees the bumped event.
void WakeConsumer(SharedHeader* h) {
  h->prod_event.fetch_add(1, std::memory_order_seq_cst);
  if (h->data_waiters.load(std::memory_order_seq_cst) != 0) FutexWake(&h->prod_event);
}

// Bounded wait slices: a cancelled or dead peer is noticed within this time even if no one wakes
// us.
constexpr std::chrono::milliseconds kWaitSlice{50};
constexpr int kSpins = 64;
// The arena is committed in chunks of this size as it is first written (RingWriter::CommitArena).
constexpr uint64_t kCommitChunk = uint64_t{4} << 20;

// Whether the socket `fd` was hung up by its other end (the process that held it is gone).
bool HungUp(int fd) {
  pollfd p{fd, POLLRDHUP, 0};
  if (::poll(&p, 1, 0) != 1) return false;
  return (p.revents & (POLLHUP | POLLRDHUP | POLLERR | POLLNVAL)) != 0;
}

// The figures as the client wrote them into the shared header (the reader's own view; the
// writer bounds them by what it knows before reporting them).
RingStats LoadStats(const SharedHeader* h) {
  RingStats s;
  s.samples = h->samples.load(std::memory_order_relaxed);
  s.bytes = h->bytes.load(std::memory_order_relaxed);
  s.next_calls = h->next_calls.load(std::memory_order_relaxed);
  s.stall_ns_total = h->stall_ns_total.load(std::memory_order_relaxed);
  for (int b = 0; b < kHistogramBuckets; ++b) {
    s.histogram[static_cast<size_t>(b)] = h->histogram[b].load(std::memory_order_relaxed);
  }
  return s;
}

}  // namespace

int StallBucket(uint64_t ns) {
  return ns == 0 ? 0 : std::min(63, static_cast<int>(std::bit_width(ns)));
}

void SummarizeStalls(RingStats* stats) {
  uint64_t total = 0;
  for (uint64_t c : stats->histogram)
    total += c;
  stats->stall_ns_median = 0;
  stats->stall_ns_p99 = 0;
  if (total == 0) return;
  auto quantile = [&](uint64_t rank) {  // rank in 1..total
    uint64_t cum = 0;
    for (int b = 0; b < kHistogramBuckets; ++b) {
      cum += stats->histogram[static_cast<size_t>(b)];
      if (cum >= rank) return b == 0 ? uint64_t{0} : uint64_t{1} << b;
    }
    return uint64_t{1} << 63;
  };
  stats->stall_ns_median = quantile((total + 1) / 2);
  stats->stall_ns_p99 = quantile(total - total / 100);
}

uint64_t RingBytes(uint64_t capacity, uint32_t slot_count) {
  return kHeaderBytes + SlotTableBytes(slot_count) + capacity;
}

// ---------------------------------------------------------------------------------------------
// RingWriter

Result<std::unique_ptr<RingWriter>> RingWriter::Create(uint64_t capacity, uint32_t slot_count,
                                                       std::string name) {
  if (capacity == 0 || capacity > kMaxCapacity) {
    return Status::InvalidArgument("ring: capacity must be in [1, 1 TiB], got " +
                                   std::to_string(capacity));
  }
  if (slot_count == 0 || slot_count > kMaxSlots) {
    return Status::InvalidArgument("ring: slot count must be in [1, " + std::to_string(kMaxSlots) +
                                   "], got " + std::to_string(slot_count));
  }
  capacity = RoundUp(capacity, kAlign);
  std::unique_ptr<RingWriter> w(new RingWriter());
  w->fd_.Reset(::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!w->fd_.valid()) return Status::FromErrno(errno, "ring: memfd_create");
  w->map_bytes_ = RingBytes(capacity, slot_count);
  if (::ftruncate(w->fd_.get(), static_cast<off_t>(w->map_bytes_)) != 0) {
    return Status::FromErrno(errno, "ring: sizing the memfd to " + std::to_string(w->map_bytes_));
  }
  // The header and the slot table are committed and mapped populated now; the arena is
  // committed in chunks as it is first written (CommitArena). A page written for the first time
  // costs a fault on each side, more than copying a sample into it, and a ring whose samples are
  // all published in the region never writes its arena at all.
  const uint64_t ctl_bytes = kHeaderBytes + SlotTableBytes(slot_count);
  if (const int err = ::posix_fallocate(w->fd_.get(), 0, static_cast<off_t>(ctl_bytes)); err != 0) {
    return Status::FromErrno(
        err, "ring: reserving " + std::to_string(ctl_bytes) + " bytes of shared memory");
  }
  if (::fcntl(w->fd_.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return Status::FromErrno(errno, "ring: sealing the memfd");
  }
  void* p = ::mmap(nullptr, w->map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, w->fd_.get(), 0);
  if (p == MAP_FAILED) return Status::FromErrno(errno, "ring: mmap");
  (void)::madvise(p, ctl_bytes, MADV_POPULATE_WRITE);  // an older kernel faults them in instead
  w->base_ = static_cast<std::byte*>(p);
  w->capacity_ = capacity;
  w->slot_count_ = slot_count;
  {
    MutexLock lock(&w->mu_);  // not shared yet: for the analysis
    w->pending_.resize(slot_count);
  }

  SharedHeader* h = new (w->base_) SharedHeader();
  h->magic = kRingMagic;
  h->version = kRingVersion;
  h->capacity = capacity;
  h->slot_count = slot_count;
  h->data_offset = kHeaderBytes + SlotTableBytes(slot_count);
  h->end_seq.store(UINT64_MAX, std::memory_order_relaxed);
  for (uint64_t i = 0; i < slot_count; ++i)
    new (w->base_ + kHeaderBytes + i * kSlotBytes) Slot();
  std::atomic_thread_fence(std::memory_order_release);
  return w;
}

RingWriter::~RingWriter() {
  if (base_ != nullptr) ::munmap(base_, map_bytes_);
}

uint64_t RingWriter::ReclaimLocked() {
  // The consumer's counter is untrusted: never past what was handed out and published.
  uint64_t released = HeaderAt(base_)->released.load(std::memory_order_acquire);
  released = std::min(released, next_seq_);
  while (reclaimed_ < released) {
    Pending& p = pending_[reclaimed_ % slot_count_];
    if (!p.published) break;
    tail_ = p.end;
    p = Pending{};
    ++reclaimed_;
  }
  return reclaimed_;
}

Result<RingWriter::Reservation> RingWriter::Reserve(uint64_t size, const SampleMeta& meta,
                                                    std::chrono::steady_clock::time_point deadline,
                                                    Space space) {
  if (size > capacity_) {
    return Status::InvalidArgument("ring: a sample of " + std::to_string(size) +
                                   " bytes does not fit a ring of " + std::to_string(capacity_) +
                                   " bytes; size rings to at least twice the largest sample");
  }
  const uint64_t asize = RoundUp(size, kAlign);
  SharedHeader* h = HeaderAt(base_);
  MutexLock lock(&mu_);
  if (finished_) return Status::FailedPrecondition("ring: Reserve after Finish");
  for (int spin = 0;; ++spin) {
    if (cancelled_.load(std::memory_order_acquire)) {
      return Status::Unavailable("ring: the stream was cancelled (client gone)");
    }
    uint32_t ev = h->cons_event.load(std::memory_order_acquire);
    ReclaimLocked();
    uint64_t pos = head_ % capacity_;
    if (pos + asize > capacity_ && reclaimed_ == next_seq_) {
      // Nothing outstanding: restart at offset 0 so that even a sample of the full capacity fits.
      head_ += capacity_ - pos;
      tail_ = head_;
      pos = 0;
    }
    uint64_t start = head_;
    if (pos + asize > capacity_) start += capacity_ - pos;  // wrap: skip the tail end
    if (next_seq_ - reclaimed_ < slot_count_ && start + asize - tail_ <= capacity_) {
      uint64_t seq = next_seq_++;
      head_ = start + asize;
      Pending& p = pending_[seq % slot_count_];
      p.end = head_;
      p.offset = start % capacity_;
      p.size = size;
      p.published = false;
      Slot* s = SlotAt(base_, seq % slot_count_);
      s->sample_id = meta.sample_id;
      s->label = meta.label;
      s->epoch = meta.epoch;
      s->step = meta.step;
      s->position = meta.position;
      s->offset = p.offset;
      s->size = size;
      s->code = 0;
      s->region = 0;
      const uint64_t offset = p.offset;
      lock.Unlock();
      if (space == Space::kCommitted) {
        if (Status c = CommitArena(offset + size); !c.ok()) return c;
      }
      return Reservation{seq, std::span<std::byte>(arena() + offset, size)};
    }
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      return Status::TimedOut("ring: no space freed by the consumer before the deadline");
    }
    if (spin < kSpins) {
      lock.Unlock();
      std::this_thread::yield();
      lock.Lock();
      continue;
    }
    // Sleep until a batch of samples is released (or the consumer itself runs dry and wakes us):
    // one wake-up per batch instead of one per released sample.
    const uint64_t batch = std::clamp<uint64_t>(slot_count_ / 4, 1, 16);
    h->space_wanted.store(reclaimed_ + batch, std::memory_order_seq_cst);
    h->space_waiters.fetch_add(1, std::memory_order_seq_cst);
    lock.Unlock();
    FutexWait(&h->cons_event, ev, std::min<std::chrono::nanoseconds>(deadline - now, kWaitSlice));
    h->space_waiters.fetch_sub(1, std::memory_order_seq_cst);
    lock.Lock();
  }
}

std::byte* RingWriter::arena() const {
  return base_ + kHeaderBytes + SlotTableBytes(slot_count_);
}

Status RingWriter::CommitArena(uint64_t end) {
  if (committed_.load(std::memory_order_acquire) >= end) return Status::Ok();
  MutexLock lock(&commit_mu_);
  uint64_t done = committed_.load(std::memory_order_relaxed);
  const uint64_t data_offset = kHeaderBytes + SlotTableBytes(slot_count_);
  while (done < end) {
    const uint64_t len = std::min(kCommitChunk, capacity_ - done);
    if (const int err = ::posix_fallocate(fd_.get(), static_cast<off_t>(data_offset + done),
                                          static_cast<off_t>(len));
        err != 0) {
      return Status::ResourceExhausted(
          "ring: cannot commit " + std::to_string(len) +
          " bytes of shared memory for the ring: " + std::strerror(err));
    }
    (void)::madvise(arena() + done, len, MADV_POPULATE_WRITE);
    done += len;
    committed_.store(done, std::memory_order_release);
  }
  return Status::Ok();
}

Status RingWriter::Commit(uint64_t seq) {
  uint64_t end = 0;
  {
    MutexLock lock(&mu_);
    if (seq < reclaimed_ || seq >= next_seq_ || pending_[seq % slot_count_].published) {
      return Status::FailedPrecondition("ring: Commit of seq " + std::to_string(seq) +
                                        " that is not reserved or already published");
    }
    end = pending_[seq % slot_count_].offset + pending_[seq % slot_count_].size;
  }
  return CommitArena(end);
}

Status RingWriter::Publish(uint64_t seq) {
  return Publish(seq, UINT64_MAX);
}

Status RingWriter::Publish(uint64_t seq, uint64_t size) {
  SharedHeader* h = HeaderAt(base_);
  {
    MutexLock lock(&mu_);
    if (seq < reclaimed_ || seq >= next_seq_ || pending_[seq % slot_count_].published) {
      return Status::FailedPrecondition("ring: Publish of seq " + std::to_string(seq) +
                                        " that is not reserved or already published");
    }
    if (size != UINT64_MAX) {
      if (size > pending_[seq % slot_count_].size) {
        return Status::InvalidArgument("ring: Publish of " + std::to_string(size) +
                                       " bytes for seq " + std::to_string(seq) + " that reserved " +
                                       std::to_string(pending_[seq % slot_count_].size));
      }
      pending_[seq % slot_count_].size = size;
    }
    pending_[seq % slot_count_].published = true;
    ++published_;
    published_bytes_ += pending_[seq % slot_count_].size;
    // Rewrite the extent from private memory: the consumer may have scribbled on the slot.
    Slot* s = SlotAt(base_, seq % slot_count_);
    s->offset = pending_[seq % slot_count_].offset;
    s->size = pending_[seq % slot_count_].size;
    s->region = 0;
    s->state.store(seq << 2 | kKindReady, std::memory_order_release);
  }
  WakeConsumer(h);
  return Status::Ok();
}

Status RingWriter::PublishInRegion(uint64_t seq, uint64_t offset, uint64_t size) {
  SharedHeader* h = HeaderAt(base_);
  {
    MutexLock lock(&mu_);
    if (seq < reclaimed_ || seq >= next_seq_ || pending_[seq % slot_count_].published) {
      return Status::FailedPrecondition("ring: PublishInRegion of seq " + std::to_string(seq) +
                                        " that is not reserved or already published");
    }
    // The reserved arena extent stays the seq's until it is released (the reclaim point walks
    // the private records), unused.
    pending_[seq % slot_count_].published = true;
    ++published_;
    published_bytes_ += size;
    Slot* s = SlotAt(base_, seq % slot_count_);
    s->offset = offset;
    s->size = size;
    s->region = 1;
    s->state.store(seq << 2 | kKindReady, std::memory_order_release);
  }
  WakeConsumer(h);
  return Status::Ok();
}

Status RingWriter::PublishError(uint64_t seq, const Status& error) {
  SharedHeader* h = HeaderAt(base_);
  const std::string& msg = error.ok() ? std::string("error without a message") : error.message();
  {
    MutexLock lock(&mu_);
    auto outstanding = [&]() REQUIRES(mu_) {
      return seq >= reclaimed_ && seq < next_seq_ && !pending_[seq % slot_count_].published;
    };
    if (!outstanding()) {
      return Status::FailedPrecondition("ring: PublishError of seq " + std::to_string(seq) +
                                        " that is not reserved or already published");
    }
    uint64_t n = std::min<uint64_t>(msg.size(), pending_[seq % slot_count_].size);
    // The message goes in the seq's arena bytes; without memory for them, the code alone.
    if (const uint64_t end = pending_[seq % slot_count_].offset + n;
        n != 0 && committed_.load(std::memory_order_acquire) < end) {
      lock.Unlock();
      const bool room = CommitArena(end).ok();
      lock.Lock();
      if (!outstanding()) {  // published meanwhile by another thread
        return Status::FailedPrecondition("ring: PublishError of seq " + std::to_string(seq) +
                                          " that was published meanwhile");
      }
      if (!room) n = 0;
    }
    Pending& p = pending_[seq % slot_count_];
    p.published = true;
    ++published_;
    std::memcpy(arena() + p.offset, msg.data(), n);
    Slot* s = SlotAt(base_, seq % slot_count_);
    s->offset = p.offset;
    s->size = n;
    s->region = 0;
    s->code = static_cast<uint32_t>(error.ok() ? StatusCode::kInternal : error.code());
    s->state.store(seq << 2 | kKindError, std::memory_order_release);
  }
  WakeConsumer(h);
  return Status::Ok();
}

void RingWriter::Finish() {
  SharedHeader* h = HeaderAt(base_);
  {
    MutexLock lock(&mu_);
    finished_ = true;
    h->end_seq.store(next_seq_, std::memory_order_release);
  }
  h->prod_event.fetch_add(1, std::memory_order_release);
  FutexWake(&h->prod_event);
}

void RingWriter::Cancel() {
  SharedHeader* h = HeaderAt(base_);
  cancelled_.store(true, std::memory_order_release);
  h->cancelled.store(1, std::memory_order_release);
  h->prod_event.fetch_add(1, std::memory_order_release);
  h->cons_event.fetch_add(1, std::memory_order_release);
  FutexWake(&h->prod_event);
  FutexWake(&h->cons_event);
}

bool RingWriter::cancelled() const {
  return cancelled_.load(std::memory_order_acquire);
}

RingStats RingWriter::stats() const {
  const SharedHeader* h = HeaderAt(base_);
  uint64_t published = 0;
  uint64_t published_bytes = 0;
  {
    MutexLock lock(&mu_);
    published = published_;
    published_bytes = published_bytes_;
  }
  // Next() calls are serialized: their stalls add up to at most the ring's age, and none is
  // longer than it. Every figure below is clamped to what that and the private counters allow.
  const auto age_ns = static_cast<uint64_t>(std::max<int64_t>(
      1, std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                              created_)
             .count()));
  RingStats s = LoadStats(h);
  s.samples = std::min(s.samples, published);
  s.bytes = std::min(s.bytes, published_bytes);
  s.stall_ns_total = std::min(s.stall_ns_total, age_ns);
  uint64_t calls = 0;
  for (int b = 0; b < kHistogramBuckets; ++b) {
    // Bucket b >= 1 holds stalls of at least 2^(b-1) ns: at most age / 2^(b-1) of them, none at
    // all once 2^(b-1) exceeds the age. Bucket 0 (0 ns) is bounded by the age in ns as well.
    const uint64_t most = b == 0 ? age_ns : age_ns >> (b - 1);
    uint64_t& n = s.histogram[static_cast<size_t>(b)];
    n = std::min(n, most);
    calls += n;
  }
  s.next_calls = std::min(s.next_calls, calls);
  SummarizeStalls(&s);
  return s;
}

uint64_t RingWriter::reserved() const {
  MutexLock lock(&mu_);
  return next_seq_;
}

uint64_t RingWriter::released() const {
  MutexLock lock(&mu_);
  return const_cast<RingWriter*>(this)->ReclaimLocked();
}

// ---------------------------------------------------------------------------------------------
// RingReader

Result<std::unique_ptr<RingReader>> RingReader::Open(wire::UniqueFd fd, uint64_t expect_capacity,
                                                     uint32_t expect_slots) {
  if (!fd.valid()) return Status::InvalidArgument("ring: no descriptor received for the ring");
  if (expect_capacity == 0 || expect_capacity > kMaxCapacity || expect_capacity % kAlign != 0 ||
      expect_slots == 0 || expect_slots > kMaxSlots) {
    return Status::Corruption("ring: the service announced an impossible geometry (capacity " +
                              std::to_string(expect_capacity) + ", slots " +
                              std::to_string(expect_slots) + ")");
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return Status::FromErrno(errno, "ring: fstat");
  const uint64_t total = RingBytes(expect_capacity, expect_slots);
  if (static_cast<uint64_t>(st.st_size) != total) {
    return Status::Corruption("ring: the shared memory is " + std::to_string(st.st_size) +
                              " bytes, expected " + std::to_string(total));
  }
  int seals = ::fcntl(fd.get(), F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    return Status::FailedPrecondition("ring: the shared memory is not sealed against shrinking");
  }
  std::unique_ptr<RingReader> r(new RingReader());
  r->ctl_bytes_ = kHeaderBytes + SlotTableBytes(expect_slots);
  void* ctl = ::mmap(nullptr, r->ctl_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (ctl == MAP_FAILED) return Status::FromErrno(errno, "ring: mmap of the ring header");
  r->ctl_ = static_cast<std::byte*>(ctl);
  // Not populated: the producer commits the arena as it first writes it, and a populated
  // read-only mapping would allocate every page of it.
  void* data = ::mmap(nullptr, expect_capacity, PROT_READ, MAP_SHARED, fd.get(),
                      static_cast<off_t>(r->ctl_bytes_));
  if (data == MAP_FAILED) return Status::FromErrno(errno, "ring: mmap of the ring arena");
  r->data_ = static_cast<const std::byte*>(data);
  r->capacity_ = expect_capacity;
  r->slot_count_ = expect_slots;
  r->fd_ = std::move(fd);
  const SharedHeader* h = HeaderAt(r->ctl_);
  if (h->magic != kRingMagic || h->version != kRingVersion || h->capacity != expect_capacity ||
      h->slot_count != expect_slots || h->data_offset != r->ctl_bytes_) {
    return Status::Corruption("ring: header does not match (magic, version " +
                              std::to_string(h->version) + " or geometry)");
  }
  {
    MutexLock lock(&r->mu_);  // not shared yet: for the analysis
    r->done_.assign(expect_slots, false);
  }
  return r;
}

RingReader::~RingReader() {
  if (ctl_ != nullptr) ::munmap(ctl_, ctl_bytes_);
  if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), capacity_);
}

Status RingReader::AttachRegion(std::shared_ptr<const Region> region) {
  if (region == nullptr) return Status::InvalidArgument("ring: no region to attach");
  MutexLock lock(&mu_);
  if (region_ != nullptr) return Status::FailedPrecondition("ring: a region is already attached");
  region_ = region->data();
  region_bytes_ = region->bytes();
  region_hold_ = std::move(region);
  return Status::Ok();
}

Status RingReader::AttachRegion(wire::UniqueFd fd, uint64_t bytes) {
  Result<std::shared_ptr<const Region>> region = Region::Map(fd.get(), bytes);
  if (!region.ok()) return region.status();
  return AttachRegion(std::move(*region));
}

// ---------------------------------------------------------------------------------------------
// Region

Result<std::shared_ptr<const Region>> Region::Map(int fd, uint64_t bytes) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return Status::FromErrno(errno, "ring: fstat of the region");
  if (bytes == 0 || static_cast<uint64_t>(st.st_size) < bytes) {
    return Status::Corruption("ring: the region is " + std::to_string(st.st_size) +
                              " bytes, the service said " + std::to_string(bytes));
  }
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    return Status::FailedPrecondition("ring: the region is not sealed against shrinking");
  }
  const int dup = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (dup < 0) return Status::FromErrno(errno, "ring: dup of the region's descriptor");
  void* m = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) {
    const int err = errno;
    ::close(dup);
    return Status::FromErrno(err, "ring: mmap of the region");
  }
  std::shared_ptr<Region> r(new Region());
  r->data_ = static_cast<const std::byte*>(m);
  r->bytes_ = bytes;
  r->dev_ = st.st_dev;
  r->ino_ = st.st_ino;
  r->fd_ = dup;
  return std::shared_ptr<const Region>(std::move(r));
}

Region::~Region() {
  if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), bytes_);
  if (fd_ >= 0) ::close(fd_);
}

void Region::Read(const std::byte* at, uint64_t size, std::byte* dst) const {
  const auto offset = static_cast<uint64_t>(at - data_);
  uint64_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd_, dst + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<uint64_t>(n);
  }
  // The file is sealed against shrinking and holds the mapping's bytes, so pread() cannot come
  // short; were it to, the mapping has the rest.
  if (done < size) std::memcpy(dst + done, at + done, size - done);
}

bool Region::Maps(int fd) const {
  struct stat st {};
  return ::fstat(fd, &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_;
}

void RingReader::RecordStall(uint64_t ns, uint64_t samples, uint64_t bytes) {
  SharedHeader* h = HeaderAt(ctl_);
  h->next_calls.fetch_add(1, std::memory_order_relaxed);
  h->stall_ns_total.fetch_add(ns, std::memory_order_relaxed);
  h->histogram[StallBucket(ns)].fetch_add(1, std::memory_order_relaxed);
  if (samples != 0) {
    h->samples.fetch_add(samples, std::memory_order_relaxed);
    h->bytes.fetch_add(bytes, std::memory_order_relaxed);
  }
}

RingReader::Wait RingReader::WaitFor(uint64_t seq, std::chrono::steady_clock::time_point deadline,
                                     bool stop_if_producer_blocked, uint64_t* state) {
  SharedHeader* h = HeaderAt(ctl_);
  Slot* s = SlotAt(ctl_, seq % slot_count_);
  auto published = [&] {
    *state = s->state.load(std::memory_order_acquire);
    return *state == (seq << 2 | kKindReady) || *state == (seq << 2 | kKindError);
  };
  for (int spin = 0;; ++spin) {
    uint32_t ev = h->prod_event.load(std::memory_order_acquire);
    if (published()) return Wait::kReady;
    if (h->end_seq.load(std::memory_order_acquire) <= seq) return Wait::kEnd;
    if (h->cancelled.load(std::memory_order_acquire) != 0) return Wait::kCancelled;
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return Wait::kTimedOut;
    // Nothing to read: a producer asleep waiting for a batch of space must use whatever space
    // there is now. Checked at once (not after the spin: it may be what we wait for) and before
    // every sleep. Still asleep after the spin (the space it needs is held by the caller's
    // batch): a batch stops here rather than wait for space only its own release can free.
    if ((spin == 0 || spin >= kSpins) && h->space_waiters.load(std::memory_order_seq_cst) != 0) {
      if (stop_if_producer_blocked && spin >= kSpins) return Wait::kProducerBlocked;
      h->cons_event.fetch_add(1, std::memory_order_seq_cst);
      FutexWake(&h->cons_event);
      producer_wakes_.fetch_add(1, std::memory_order_relaxed);
    }
    if (spin < kSpins) {
      std::this_thread::yield();
      continue;
    }
    // Once per wait slice (a poll(2) with no timeout, only while nothing is ready).
    if (watch_fd_ >= 0 && HungUp(watch_fd_)) {
      // Published before the hang-up? Deliver it rather than report the death.
      if (published()) return Wait::kReady;
      if (h->end_seq.load(std::memory_order_acquire) <= seq) return Wait::kEnd;
      return Wait::kGone;
    }
    h->data_waiters.fetch_add(1, std::memory_order_seq_cst);
    FutexWait(&h->prod_event, ev, std::min<std::chrono::nanoseconds>(deadline - now, kWaitSlice));
    h->data_waiters.fetch_sub(1, std::memory_order_seq_cst);
  }
}

Result<View> RingReader::ReadSlot(uint64_t seq, uint64_t state) const {
  const Slot* s = SlotAt(ctl_, seq % slot_count_);
  // Copy the slot out once, then validate what we copied (the memory is shared).
  const uint64_t offset = s->offset;
  const uint64_t size = s->size;
  const uint32_t region = (state & 3) == kKindError ? 0 : s->region;
  const std::byte* base = region == 0 ? data_ : region_;
  const uint64_t limit = region == 0 ? capacity_ : region_bytes_;
  if ((region != 0 && (region != 1 || region_ == nullptr)) || offset > limit ||
      size > limit - offset) {
    return Status::Corruption("ring: slot of seq " + std::to_string(seq) +
                              " points outside the shared memory");
  }
  View v;
  v.seq = seq;
  v.sample_id = s->sample_id;
  v.label = s->label;
  v.epoch = s->epoch;
  v.step = s->step;
  v.position = s->position;
  v.data = base + offset;
  v.size = size;
  return v;
}

bool RingReader::ProducerGone() const {
  return watch_fd_ >= 0 && HungUp(watch_fd_);
}

Status RingReader::WaitError(Wait w, uint64_t seq) {
  switch (w) {
    case Wait::kCancelled:
      return Status::Unavailable("ring: the service cancelled this stream");
    case Wait::kTimedOut:
      return Status::TimedOut("ring: no sample arrived within the timeout (seq " +
                              std::to_string(seq) + ")");
    case Wait::kGone:
      return Status::Unavailable(
          "nopfsd is gone (its socket hung up: it exited or was killed) before sample " +
          std::to_string(seq) +
          " of this stream arrived; the stream cannot go on (read the files directly, e.g. "
          "NOPFS_FALLBACK=1 in Python, or run the job again)");
    default:
      return Status::Internal("ring: no error for this wait outcome");
  }
}

// The Status of error slot `seq` (consumed and released here).
Status RingReader::ConsumeError(const View& v) {
  const uint32_t code = SlotAt(ctl_, v.seq % slot_count_)->code;
  std::string msg(reinterpret_cast<const char*>(v.data), v.size);
  Status st = Release(v.seq);
  (void)st;  // cannot fail: seq was just delivered
  wire::Error e{code, msg.empty() ? "sample " + std::to_string(v.sample_id) + ": error" : msg};
  return wire::ToStatus(e);
}

Result<std::optional<View>> RingReader::Next(std::chrono::nanoseconds timeout) {
  MutexLock next_lock(&next_mu_);
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
            .count());
  };
  const uint64_t seq = next_seq_;
  {
    MutexLock lock(&mu_);
    if (seq - released_ >= slot_count_) {
      RecordStall(elapsed(), 0, 0);
      return Status::FailedPrecondition(
          "ring: " + std::to_string(slot_count_) +
          " samples are held without Release(); release some before asking for more");
    }
  }
  uint64_t state = 0;
  const Wait w = WaitFor(seq, t0 + timeout, false, &state);
  if (w == Wait::kEnd) {
    RecordStall(elapsed(), 0, 0);
    return std::optional<View>();
  }
  if (w != Wait::kReady) {
    RecordStall(elapsed(), 0, 0);
    return WaitError(w, seq);
  }
  Result<View> v = ReadSlot(seq, state);
  if (!v.ok()) {
    RecordStall(elapsed(), 0, 0);
    return v.status();
  }
  {
    MutexLock lock(&mu_);
    delivered_ = seq + 1;
  }
  next_seq_ = seq + 1;
  const bool error = (state & 3) == kKindError;
  RecordStall(elapsed(), 1, error ? 0 : v->size);
  if (error) return ConsumeError(*v);
  return std::optional<View>(*v);
}

Result<size_t> RingReader::NextBatch(size_t n, std::chrono::nanoseconds timeout,
                                     std::vector<View>* out) {
  MutexLock next_lock(&next_mu_);
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
            .count());
  };
  const uint64_t first = next_seq_;
  uint64_t room = 0;  // slots the caller may still take
  {
    MutexLock lock(&mu_);
    room = slot_count_ - (first - released_);
  }
  if (n == 0) return size_t{0};
  if (room == 0) {
    RecordStall(elapsed(), 0, 0);
    return Status::FailedPrecondition(
        "ring: " + std::to_string(slot_count_) +
        " samples are held without Release(); release some before asking for more");
  }
  const uint64_t want = std::min<uint64_t>(n, room);
  const auto deadline = t0 + timeout;
  const size_t base = out->size();
  uint64_t bytes = 0;
  uint64_t seq = first;
  Status error = Status::Ok();
  for (; seq < first + want; ++seq) {
    uint64_t state = 0;
    const bool have = seq > first;
    const Wait w = WaitFor(seq, deadline, have, &state);
    if (w == Wait::kReady) {
      if (have && (state & 3) == kKindError) break;  // the next call reports it
      Result<View> v = ReadSlot(seq, state);
      if (!v.ok()) {
        if (have) break;  // delivered by the next call
        error = v.status();
        break;
      }
      if ((state & 3) == kKindError) {
        {
          MutexLock lock(&mu_);
          delivered_ = seq + 1;
        }
        next_seq_ = seq + 1;
        RecordStall(elapsed(), 1, 0);
        return ConsumeError(*v);
      }
      out->push_back(*v);
      bytes += v->size;
      continue;
    }
    // Not ready: a batch already started ends here (its samples are not lost); the first
    // sample's outcome is the call's.
    if (!have && w != Wait::kEnd) error = WaitError(w, seq);
    break;
  }
  const uint64_t taken = seq - first;
  if (taken != 0) {
    MutexLock lock(&mu_);
    delivered_ = seq;
  }
  next_seq_ = seq;
  RecordStall(elapsed(), taken, bytes);
  if (!error.ok()) {
    out->resize(base);
    return error;
  }
  return static_cast<size_t>(taken);
}

bool RingReader::producer_asleep() const {
  return HeaderAt(ctl_)->space_waiters.load(std::memory_order_seq_cst) != 0;
}

void RingReader::AdvanceReleasedLocked() {
  uint64_t before = released_;
  while (released_ < delivered_ && done_[released_ % slot_count_]) {
    done_[released_ % slot_count_] = false;
    ++released_;
  }
  if (released_ == before) return;
  SharedHeader* h = HeaderAt(ctl_);
  h->released.store(released_, std::memory_order_release);
  h->cons_event.fetch_add(1, std::memory_order_seq_cst);
  if (h->space_waiters.load(std::memory_order_seq_cst) != 0 &&
      released_ >= h->space_wanted.load(std::memory_order_seq_cst)) {
    FutexWake(&h->cons_event);
    producer_wakes_.fetch_add(1, std::memory_order_relaxed);
  }
}

Status RingReader::Release(uint64_t seq) {
  MutexLock lock(&mu_);
  if (seq < released_ || seq >= delivered_ || done_[seq % slot_count_]) {
    return Status::FailedPrecondition("ring: Release of seq " + std::to_string(seq) +
                                      " that is not held (never returned or already released)");
  }
  done_[seq % slot_count_] = true;
  AdvanceReleasedLocked();
  return Status::Ok();
}

Status RingReader::ReleaseBatch(std::span<const uint64_t> seqs) {
  MutexLock lock(&mu_);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const uint64_t seq = seqs[i];
    if (seq < released_ || seq >= delivered_ || done_[seq % slot_count_]) {
      for (size_t j = 0; j < i; ++j)
        done_[seqs[j] % slot_count_] = false;  // all or nothing
      return Status::FailedPrecondition("ring: Release of seq " + std::to_string(seq) +
                                        " that is not held (never returned or already released)");
    }
    done_[seq % slot_count_] = true;
  }
  AdvanceReleasedLocked();
  return Status::Ok();
}

RingStats RingReader::stats() const {
  RingStats s = LoadStats(HeaderAt(ctl_));
  SummarizeStalls(&s);
  return s;
}

}  // namespace nopfs::ring
