// Prefetcher: fills one tier with its samples in first-access order using a fixed number of
// threads (the storage class's `threads`, p_j in docs/algorithm.md §4).
//
// The threads share an atomic cursor over the tier's slots (slot order is the prefetch order):
// each takes the next slot, claims it (SlotTable::TryBeginFill; a slot already ready or being
// filled by someone else is skipped), lets the tier fetch and store it (RAM: straight into the
// mapping; SSD: through one aligned bounce buffer per thread, so memory stays at threads x the
// largest padded sample), and marks it ready with the fetch's xxh3, or failed (logged with the
// sample and the message). A failed sample stays failed; readers fall back to the PFS.
//
// Deferral: with a `retry` fetch, a first-pass fetch may answer kUnavailable ("not now": the
// sample is to be copied from a peer that does not have it yet). The slot is then left empty and
// counted as settled (the pace goes on), and once the pass has visited every slot the threads
// fill the deferred ones with `retry`, which must not defer again. A slot someone else filled
// meanwhile (a staging read) is skipped. Without `retry`, kUnavailable is a failure like any other.
//
// Stop() sets a flag that no thread starts a new fetch after, then joins. A fetch already under
// way is not interrupted by force; a fetch that can take long should poll stop_requested() and
// give up (its slot then returns to empty and is not counted as a failure), so Stop() returns
// within one poll interval. The destructor calls Stop().
//
// Thread safety: Start/Stop/Wait from one controlling thread; counters() and stop_requested()
// from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "service/tiers/tier_layout.h"

namespace nopfs::service {

struct PrefetchCounters {
  uint64_t filled = 0;    // slots marked ready by this prefetcher
  uint64_t bytes = 0;     // their bytes (exact sizes)
  uint64_t failures = 0;  // slots marked failed by this prefetcher
  // Leading slots 0..prefix-1 all settled (ready, or failed, or skipped because someone else
  // filled them, or deferred to the second pass). Monotone.
  uint64_t prefix = 0;
  // Slots settled so far, in any order (>= prefix): the pace for PeerPresumedReady. Monotone.
  uint64_t settled = 0;
  uint64_t deferred = 0;  // first-pass fetches that answered "not now" (then retried)
  bool done = false;      // every thread has exited (all slots visited, or stopped)
};

class Prefetcher {
 public:
  // tier and fetch must outlive the prefetcher. threads >= 1. `retry` (optional) enables
  // deferral (see above).
  Prefetcher(Tier& tier, FetchFn fetch, uint32_t threads, FetchFn retry = nullptr);
  ~Prefetcher();
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // Allocates the bounce buffers and starts the threads. FailedPrecondition if already started;
  // ResourceExhausted if the buffers cannot be allocated; InvalidArgument if threads == 0.
  Status Start();
  // No new fetch starts; joins every thread. Idempotent.
  void Stop();
  // The first half of Stop: no new fetch starts, nothing is joined (so that several prefetchers,
  // and what their fetches wait on, can be told first and joined after).
  void RequestStop() { stop_.store(true); }
  // Called once, on the thread that finishes last, when every slot has been visited (not after
  // Stop). Set before Start.
  void SetOnDone(std::function<void()> on_done) { on_done_ = std::move(on_done); }
  // Joins the threads after they have visited every slot (or were stopped).
  void Wait();
  bool stop_requested() const { return stop_.load(std::memory_order_relaxed); }
  PrefetchCounters counters() const;

 private:
  void Run(uint32_t index);
  void Settle() REQUIRES(prefix_mu_);
  // Fills `slot` with `fetch`; true once the slot is settled (ready, failed, someone else's).
  enum class FillResult { kSettled, kDeferred, kCancelled };
  FillResult FillSlot(uint32_t slot, const FetchFn& fetch, std::span<std::byte> bounce,
                      bool may_defer);
  void MarkSettled(uint32_t slot);

  Tier& tier_;
  FetchFn fetch_;
  FetchFn retry_;
  std::function<void()> on_done_;
  uint32_t threads_;
  std::vector<std::thread> workers_;
  std::vector<std::byte*> bounce_;  // one aligned buffer per thread, or none
  std::atomic<bool> stop_{false};
  std::atomic<bool> started_{false};
  std::atomic<uint32_t> cursor_{0};
  std::atomic<uint32_t> running_{0};
  std::atomic<uint64_t> filled_{0};
  std::atomic<uint64_t> bytes_{0};
  std::atomic<uint64_t> failures_{0};
  Mutex prefix_mu_;
  std::vector<uint8_t> settled_ GUARDED_BY(prefix_mu_);  // [slot]
  std::atomic<uint64_t> prefix_{0};
  std::atomic<uint64_t> settled_count_{0};
  std::atomic<uint64_t> deferred_count_{0};
  Mutex deferred_mu_;
  std::vector<uint32_t> deferred_ GUARDED_BY(deferred_mu_);  // slots for the second pass
};

}  // namespace nopfs::service
