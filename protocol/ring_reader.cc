// RingReader: the ring's consumer side (the client): attaching the ring and the RAM tier's region,
// waiting for and reading the next samples, their release, and the stall statistics it records.
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
