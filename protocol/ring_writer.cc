// RingWriter: the ring's producer side (nopfsd's staging): creation of the memfd, reservation in
// stream order, publication of samples, errors and in-place samples, reclaim of what the consumer
// released, and the end of the stream.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <thread>

#include "common/mutex.h"
#include "protocol/ring.h"
#include "protocol/ring_shared.h"

namespace nopfs::ring {

using namespace shared;  // the ring's own layout

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
  if (base_ == nullptr) return;
  // Unmapped a chunk at a time: unmapping holds the process's memory map locked while it drops
  // the pages, and a ring whose arena was written has thousands, so in one call it would stall
  // every other thread of nopfsd that maps memory meanwhile (a stream being opened starts its
  // threads, whose stacks are mapped) for milliseconds. Each piece is page-aligned (base_ is,
  // and so is the chunk).
  for (uint64_t done = 0; done < map_bytes_; done += kCommitChunk) {
    (void)::munmap(base_ + done, std::min(kCommitChunk, map_bytes_ - done));
  }
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

}  // namespace nopfs::ring
