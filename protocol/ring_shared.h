// The ring's shared memory as both of its sides see it (the header page, the slot table, the
// futex waits and wakes) and what RingWriter (ring_writer.cc) and RingReader (ring_reader.cc)
// share beside it. The layout is the format docs/wire.md describes. Private to protocol/.
#pragma once

#include <linux/futex.h>
#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <new>

#include "protocol/ring.h"

namespace nopfs::ring::shared {

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

inline constexpr uint64_t kKindReady = 1;
inline constexpr uint64_t kKindError = 2;

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

inline uint64_t RoundUp(uint64_t v, uint64_t a) {
  return (v + a - 1) / a * a;
}

inline uint64_t SlotTableBytes(uint32_t slots) {
  return RoundUp(uint64_t{slots} * kSlotBytes, 4096);
}

inline SharedHeader* HeaderAt(std::byte* base) {
  return std::launder(reinterpret_cast<SharedHeader*>(base));
}
inline Slot* SlotAt(std::byte* base, uint64_t i) {
  return std::launder(reinterpret_cast<Slot*>(base + kHeaderBytes + i * kSlotBytes));
}

inline uint32_t* FutexWord(std::atomic<uint32_t>* a) {
  return reinterpret_cast<uint32_t*>(a);
}

// Shared (not FUTEX_PRIVATE) so that the other process's waiters on the same page are found.
inline void FutexWait(std::atomic<uint32_t>* word, uint32_t expected,
                      std::chrono::nanoseconds timeout) {
  if (timeout.count() <= 0) return;
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1000000000);
  ::syscall(SYS_futex, FutexWord(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

inline void FutexWake(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, FutexWord(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// Bumps the producer's event and wakes the consumer if it sleeps on it. A waiter reads the event
// before it checks its condition, then counts itself, then sleeps only while the event still has
// the value it read (FUTEX_WAIT); with sequentially consistent operations on both sides a sleeper
// is never missed: either the waker sees the count, or the sleeper sees the bumped event.
inline void WakeConsumer(SharedHeader* h) {
  h->prod_event.fetch_add(1, std::memory_order_seq_cst);
  if (h->data_waiters.load(std::memory_order_seq_cst) != 0) FutexWake(&h->prod_event);
}

// Bounded wait slices: a cancelled or dead peer is noticed within this time even if no one wakes
// us.
inline constexpr std::chrono::milliseconds kWaitSlice{50};
inline constexpr int kSpins = 64;
// The arena is committed in chunks of this size as it is first written (RingWriter::CommitArena).
inline constexpr uint64_t kCommitChunk = uint64_t{4} << 20;

// Whether the socket `fd` was hung up by its other end (the process that held it is gone).
inline bool HungUp(int fd) {
  pollfd p{fd, POLLRDHUP, 0};
  if (::poll(&p, 1, 0) != 1) return false;
  return (p.revents & (POLLHUP | POLLRDHUP | POLLERR | POLLNVAL)) != 0;
}

// The figures as the client wrote them into the shared header (the reader's own view; the
// writer bounds them by what it knows before reporting them).
inline RingStats LoadStats(const SharedHeader* h) {
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

}  // namespace nopfs::ring::shared
