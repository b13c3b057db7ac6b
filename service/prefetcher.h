// Prefetcher: fills one tier with its samples in first-access order using a fixed number of
// threads (the storage class's `threads`, p_j in ALGORITHM.md).
//
// The threads share an atomic cursor over the tier's slots (slot order is the prefetch order):
// each takes the next slot, claims it (SlotTable::TryBeginFill; a slot already ready or being
// filled by someone else is skipped), lets the tier fetch and store it (RAM: straight into the
// mapping; SSD: through one aligned bounce buffer per thread, so memory stays at threads x the
// largest padded sample), and marks it ready with the fetch's xxh3, or failed (logged with the
// sample and the message). A failed sample stays failed; readers fall back to the PFS.
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
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "service/tier_layout.h"

namespace nopfs::service {

struct PrefetchCounters {
  uint64_t filled = 0;    // slots marked ready by this prefetcher
  uint64_t bytes = 0;     // their bytes (exact sizes)
  uint64_t failures = 0;  // slots marked failed by this prefetcher
  // Leading slots 0..prefix-1 all settled (ready, or failed, or skipped because someone else
  // filled them); own_progress for PeerPresumedReady. Monotone.
  uint64_t prefix = 0;
  bool done = false;  // every thread has exited (all slots visited, or stopped)
};

class Prefetcher {
 public:
  // tier and fetch must outlive the prefetcher. threads >= 1.
  Prefetcher(Tier& tier, FetchFn fetch, uint32_t threads);
  ~Prefetcher();
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // Allocates the bounce buffers and starts the threads. FailedPrecondition if already started;
  // ResourceExhausted if the buffers cannot be allocated; InvalidArgument if threads == 0.
  Status Start();
  // No new fetch starts; joins every thread. Idempotent.
  void Stop();
  // Joins the threads after they have visited every slot (or were stopped).
  void Wait();
  bool stop_requested() const { return stop_.load(std::memory_order_relaxed); }
  PrefetchCounters counters() const;

 private:
  void Run(uint32_t index);
  void Settle();

  Tier& tier_;
  FetchFn fetch_;
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
  std::vector<uint8_t> settled_;  // [slot]: set under prefix_mu_
  std::mutex prefix_mu_;
  std::atomic<uint64_t> prefix_{0};
};

}  // namespace nopfs::service
