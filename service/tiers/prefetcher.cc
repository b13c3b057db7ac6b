#include "service/tiers/prefetcher.h"

#include <spdlog/spdlog.h>

#include <cstdlib>
#include <new>

#include "common/mutex.h"

namespace nopfs::service {

Prefetcher::Prefetcher(Tier& tier, FetchFn fetch, uint32_t threads, FetchFn retry)
    : tier_(tier), fetch_(std::move(fetch)), retry_(std::move(retry)), threads_(threads) {}

Prefetcher::~Prefetcher() {
  Stop();
  for (std::byte* b : bounce_)
    std::free(b);
}

Status Prefetcher::Start() {
  if (threads_ == 0) return Status::InvalidArgument("prefetcher: threads must be at least 1");
  if (started_.exchange(true)) return Status::FailedPrecondition("prefetcher: already started");
  const uint32_t n = tier_.layout().slot_count();
  {
    MutexLock lock(&prefix_mu_);  // no worker yet: for the analysis
    settled_.assign(n, 0);
  }
  const uint64_t bb = tier_.bounce_bytes();
  if (bb > 0) {
    const uint64_t rounded = (bb + kSsdAlignment - 1) / kSsdAlignment * kSsdAlignment;
    for (uint32_t i = 0; i < threads_; ++i) {
      void* p = std::aligned_alloc(kSsdAlignment, rounded);
      if (p == nullptr) {
        return Status::ResourceExhausted("prefetcher: cannot allocate " + std::to_string(rounded) +
                                         " bytes of bounce buffer for the " + tier_.kind() +
                                         " tier");
      }
      bounce_.push_back(static_cast<std::byte*>(p));
    }
  }
  running_.store(threads_);
  for (uint32_t i = 0; i < threads_; ++i)
    workers_.emplace_back([this, i] { Run(i); });
  TierLog()->info("prefetcher ({} tier): {} samples, {} threads", tier_.kind(), n, threads_);
  return Status::Ok();
}

void Prefetcher::Stop() {
  RequestStop();
  Wait();
}

void Prefetcher::Wait() {
  for (std::thread& t : workers_) {
    if (t.joinable()) t.join();
  }
}

PrefetchCounters Prefetcher::counters() const {
  PrefetchCounters c;
  c.filled = filled_.load();
  c.bytes = bytes_.load();
  c.failures = failures_.load();
  c.prefix = prefix_.load();
  c.settled = settled_count_.load();
  c.deferred = deferred_count_.load();
  c.done = started_.load() && running_.load() == 0;
  return c;
}

void Prefetcher::Settle() {
  // Advances over the settled run.
  uint64_t p = prefix_.load(std::memory_order_relaxed);
  while (p < settled_.size() && settled_[p])
    ++p;
  prefix_.store(p);
}

void Prefetcher::MarkSettled(uint32_t slot) {
  MutexLock lock(&prefix_mu_);
  if (settled_[slot]) return;  // a deferred slot was counted when it was deferred
  settled_[slot] = 1;
  settled_count_.fetch_add(1);
  Settle();
}

Prefetcher::FillResult Prefetcher::FillSlot(uint32_t slot, const FetchFn& fetch,
                                            std::span<std::byte> bounce, bool may_defer) {
  SlotTable& slots = tier_.slots();
  const TierLayout& layout = tier_.layout();
  if (!slots.TryBeginFill(slot)) return FillResult::kSettled;  // ready, failed, or being filled
  const policy::SampleId sample = layout.SampleAt(slot);
  auto hash = tier_.Fill(slot, fetch, bounce);
  if (hash.ok()) {
    slots.MarkReady(slot, *hash);
    filled_.fetch_add(1);
    bytes_.fetch_add(layout.SizeOf(slot));
    return FillResult::kSettled;
  }
  if (stop_.load()) {
    slots.Abandon(slot);  // cancelled by Stop(), not a failure of the sample
    return FillResult::kCancelled;
  }
  if (may_defer && hash.status().code() == StatusCode::kUnavailable) {
    slots.Abandon(slot);  // empty again: a staging read may fill it before the second pass
    return FillResult::kDeferred;
  }
  slots.MarkFailed(slot);
  failures_.fetch_add(1);
  TierLog()->warn("prefetcher ({} tier): sample {} failed: {}", tier_.kind(), sample,
                  hash.status().ToString());
  return FillResult::kSettled;
}

void Prefetcher::Run(uint32_t index) {
  const uint64_t bb = tier_.bounce_bytes();
  std::span<std::byte> bounce;
  if (bb > 0) bounce = {bounce_[index], bb};
  const uint32_t n = tier_.layout().slot_count();
  const bool may_defer = static_cast<bool>(retry_);
  while (!stop_.load(std::memory_order_relaxed)) {
    const uint32_t slot = cursor_.fetch_add(1);
    if (slot >= n) break;
    switch (FillSlot(slot, fetch_, bounce, may_defer)) {
      case FillResult::kSettled:
        MarkSettled(slot);
        break;
      case FillResult::kDeferred: {
        deferred_count_.fetch_add(1);
        MutexLock lock(&deferred_mu_);
        deferred_.push_back(slot);
        MarkSettled(slot);  // for the pace; it is filled in the second pass
        break;
      }
      case FillResult::kCancelled:
        break;
    }
  }
  // Second pass: the deferred slots, once every slot has been visited (by some thread).
  while (may_defer && !stop_.load(std::memory_order_relaxed)) {
    uint32_t slot = 0;
    {
      MutexLock lock(&deferred_mu_);
      if (deferred_.empty()) break;
      slot = deferred_.back();
      deferred_.pop_back();
    }
    (void)FillSlot(slot, retry_, bounce, /*may_defer=*/false);
  }
  if (running_.fetch_sub(1) == 1 && !stop_.load() && on_done_) on_done_();
}

}  // namespace nopfs::service
