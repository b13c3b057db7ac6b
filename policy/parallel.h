// Internal to policy/: the small amount of threading the planner needs. Work is split by epoch
// (epochs are independent); each worker owns its buffers, so nothing is shared but the output,
// which callers merge with order-independent operations (sums, minima) or in epoch order.
//
// Thread safety: RunWorkers calls fn concurrently from `workers` threads; fn must be safe for that.
#pragma once

#include <cstdint>
#include <thread>
#include <vector>

namespace nopfs::policy::internal {

// The most memory that per-worker buffers of one call may take together; more threads than fit
// are not started (results do not depend on the number of workers).
inline constexpr uint64_t kWorkerMemoryBudget = uint64_t{2} << 30;

// The number of workers for a loop over `epochs` epochs: `threads` (0: the hardware's
// concurrency), at most `epochs`, at most as many as keep `bytes_per_worker` each within
// kWorkerMemoryBudget, and at least 1.
inline unsigned EpochWorkers(unsigned threads, uint64_t epochs, uint64_t bytes_per_worker) {
  uint64_t w = threads != 0 ? threads : std::thread::hardware_concurrency();
  if (w > epochs) w = epochs;
  if (bytes_per_worker != 0 && w > kWorkerMemoryBudget / bytes_per_worker) {
    w = kWorkerMemoryBudget / bytes_per_worker;
  }
  return w == 0 ? 1 : static_cast<unsigned>(w);
}

// Calls fn(w) for every w in [0, workers): w = 0 on the calling thread, the others on new threads,
// and returns when all have returned.
template <typename Fn>
void RunWorkers(unsigned workers, Fn&& fn) {
  std::vector<std::jthread> threads;
  threads.reserve(workers);
  for (unsigned w = 1; w < workers; ++w)
    threads.emplace_back([&fn, w] { fn(w); });
  fn(0u);
}

}  // namespace nopfs::policy::internal
