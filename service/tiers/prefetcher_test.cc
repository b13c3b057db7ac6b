#include "service/tiers/prefetcher.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "service/tiers/ram_tier.h"
#include "service/tiers/ssd_tier.h"
#include "service/tiers/tier_test_util.h"

namespace nopfs::service {
namespace {

using testing::Content;
using testing::FetchContent;
using testing::PlanOf;
using testing::TempDir;

std::vector<uint64_t> Sizes(uint64_t n) {
  std::vector<uint64_t> s(n);
  for (uint64_t k = 0; k < n; ++k)
    s[k] = 1 + (k * 7919) % 20000;
  return s;
}

std::unique_ptr<RamTier> Ram(const std::vector<policy::SampleId>& order,
                             const std::vector<uint64_t>& sizes) {
  auto layout = TierLayout::Ram(PlanOf(order, sizes), sizes);
  EXPECT_TRUE(layout.ok());
  auto t = RamTier::Create("pf", std::move(*layout));
  EXPECT_TRUE(t.ok());
  return std::move(*t);
}

TEST(Prefetcher, OneThreadFetchesInFirstAccessOrder) {
  const auto sizes = Sizes(50);
  const std::vector<policy::SampleId> order = {17, 3, 44, 0, 9, 28, 1};
  auto tier = Ram(order, sizes);
  std::vector<policy::SampleId> seen;
  Prefetcher pf(
      *tier,
      [&](policy::SampleId k, std::span<std::byte> dst) {
        seen.push_back(k);
        return FetchContent(k, dst);
      },
      1);
  ASSERT_TRUE(pf.Start().ok());
  pf.Wait();
  EXPECT_EQ(seen, order);
  const PrefetchCounters c = pf.counters();
  EXPECT_EQ(c.filled, order.size());
  EXPECT_EQ(c.prefix, order.size());
  EXPECT_EQ(c.failures, 0u);
  EXPECT_TRUE(c.done);
  uint64_t bytes = 0;
  for (auto k : order)
    bytes += sizes[k];
  EXPECT_EQ(c.bytes, bytes);
  EXPECT_EQ(pf.Start().code(), StatusCode::kFailedPrecondition);
}

TEST(Prefetcher, FailedFetchCountedAndSlotFailed) {
  const auto sizes = Sizes(20);
  std::vector<policy::SampleId> order;
  for (policy::SampleId k = 0; k < 20; ++k)
    order.push_back(19 - k);
  auto tier = Ram(order, sizes);
  Prefetcher pf(
      *tier,
      [](policy::SampleId k, std::span<std::byte> dst) -> Result<uint64_t> {
        if (k % 5 == 0) return Status::NotFound("sample file vanished");
        return FetchContent(k, dst);
      },
      3);
  ASSERT_TRUE(pf.Start().ok());
  pf.Wait();
  const PrefetchCounters c = pf.counters();
  EXPECT_EQ(c.failures, 4u);
  EXPECT_EQ(c.filled, 16u);
  EXPECT_EQ(c.prefix, 20u);
  for (policy::SampleId k = 0; k < 20; ++k) {
    const SlotState s = tier->slots().state(tier->layout().SlotOf(k));
    if (k % 5 == 0) {
      EXPECT_EQ(s, SlotState::kFailed) << k;
      EXPECT_EQ(tier->WaitReady(k, std::chrono::seconds(1)).code(), StatusCode::kUnavailable);
    } else {
      ASSERT_EQ(s, SlotState::kReady) << k;
      std::vector<std::byte> got(sizes[k]);
      ASSERT_TRUE(tier->Read(k, got).ok());
      EXPECT_EQ(got, Content(k, sizes[k]));
    }
  }
}

TEST(Prefetcher, SettledCountsPastASlowSlotThePrefixWaitsForIt) {
  const auto sizes = Sizes(30);
  std::vector<policy::SampleId> order(30);
  for (policy::SampleId k = 0; k < 30; ++k)
    order[k] = k;
  auto tier = Ram(order, sizes);
  std::atomic<bool> release{false};
  // Slot 0's fetch is slow (a first peer handshake, a slow file); the other thread goes on.
  auto fetch = [&](policy::SampleId k, std::span<std::byte> dst) -> Result<uint64_t> {
    while (k == 0 && !release.load())
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return FetchContent(k, dst);
  };
  Prefetcher pf(*tier, fetch, 2);
  ASSERT_TRUE(pf.Start().ok());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (pf.counters().settled < 29 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  PrefetchCounters c = pf.counters();
  EXPECT_EQ(c.settled, 29u);
  EXPECT_EQ(c.prefix, 0u);
  EXPECT_FALSE(c.done);
  release.store(true);
  pf.Wait();
  c = pf.counters();
  EXPECT_EQ(c.settled, 30u);
  EXPECT_EQ(c.prefix, 30u);
  EXPECT_TRUE(c.done);
}

TEST(Prefetcher, DeferredSlotsAreFilledByRetryAfterThePass) {
  const auto sizes = Sizes(40);
  std::vector<policy::SampleId> order(40);
  for (policy::SampleId k = 0; k < 40; ++k)
    order[k] = 39 - k;
  auto tier = Ram(order, sizes);
  std::mutex mu;
  std::vector<policy::SampleId> first_pass;
  std::vector<policy::SampleId> retried;
  // Samples divisible by 3 are "not there yet" in the first pass.
  auto fetch = [&](policy::SampleId k, std::span<std::byte> dst) -> Result<uint64_t> {
    std::lock_guard<std::mutex> lock(mu);
    first_pass.push_back(k);
    if (k % 3 == 0) return Status::Unavailable("not at its filler yet");
    return FetchContent(k, dst);
  };
  auto retry = [&](policy::SampleId k, std::span<std::byte> dst) -> Result<uint64_t> {
    std::lock_guard<std::mutex> lock(mu);
    retried.push_back(k);
    return FetchContent(k, dst);
  };
  Prefetcher pf(*tier, fetch, 1, retry);
  ASSERT_TRUE(pf.Start().ok());
  pf.Wait();
  const PrefetchCounters c = pf.counters();
  EXPECT_EQ(c.deferred, 14u);  // 0, 3, ..., 39
  EXPECT_EQ(c.filled, 40u);
  EXPECT_EQ(c.failures, 0u);
  EXPECT_EQ(c.settled, 40u);
  EXPECT_EQ(c.prefix, 40u);
  EXPECT_TRUE(c.done);
  EXPECT_EQ(first_pass.size(), 40u);  // the whole pass first, in first-access order
  EXPECT_EQ(first_pass, order);
  EXPECT_EQ(retried.size(), 14u);
  for (policy::SampleId k : retried)
    EXPECT_EQ(k % 3, 0u) << k;
  for (policy::SampleId k = 0; k < 40; ++k) {
    std::vector<std::byte> got(sizes[k]);
    ASSERT_TRUE(tier->Read(k, got).ok()) << k;
    EXPECT_EQ(got, Content(k, sizes[k]));
  }
}

TEST(Prefetcher, WithoutRetryUnavailableIsAFailure) {
  const auto sizes = Sizes(10);
  std::vector<policy::SampleId> order(10);
  for (policy::SampleId k = 0; k < 10; ++k)
    order[k] = k;
  auto tier = Ram(order, sizes);
  Prefetcher pf(
      *tier,
      [](policy::SampleId k, std::span<std::byte> dst) -> Result<uint64_t> {
        if (k == 4) return Status::Unavailable("no");
        return FetchContent(k, dst);
      },
      2);
  ASSERT_TRUE(pf.Start().ok());
  pf.Wait();
  EXPECT_EQ(pf.counters().failures, 1u);
  EXPECT_EQ(pf.counters().deferred, 0u);
  EXPECT_EQ(tier->slots().state(tier->layout().SlotOf(4)), SlotState::kFailed);
}

TEST(Prefetcher, StopMidPrefetchIsPrompt) {
  const auto sizes = Sizes(100);
  std::vector<policy::SampleId> order(100);
  for (policy::SampleId k = 0; k < 100; ++k)
    order[k] = k;
  auto tier = Ram(order, sizes);
  std::atomic<Prefetcher*> self{nullptr};
  std::atomic<int> started{0};
  // A slow source that polls for cancellation every 5 ms (as the daemon's PFS reads do).
  auto slow = [&](policy::SampleId k, std::span<std::byte> dst) -> Result<uint64_t> {
    started.fetch_add(1);
    for (int i = 0; i < 2000; ++i) {
      Prefetcher* p = self.load();
      if (p != nullptr && p->stop_requested()) return Status::Unavailable("cancelled");
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return FetchContent(k, dst);
  };
  Prefetcher pf(*tier, slow, 2);
  self.store(&pf);
  ASSERT_TRUE(pf.Start().ok());
  while (started.load() < 2)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const auto t0 = std::chrono::steady_clock::now();
  pf.Stop();
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(took, std::chrono::milliseconds(500));
  const PrefetchCounters c = pf.counters();
  EXPECT_TRUE(c.done);
  EXPECT_EQ(c.failures, 0u);  // cancelled, not failed
  EXPECT_EQ(c.filled, 0u);
  EXPECT_EQ(c.prefix, 0u);
  EXPECT_EQ(c.settled, 0u);
  EXPECT_EQ(started.load(), 2);
  for (uint32_t slot = 0; slot < tier->layout().slot_count(); ++slot) {
    EXPECT_EQ(tier->slots().state(slot), SlotState::kEmpty);  // refillable
  }
  pf.Stop();  // idempotent
}

// Staging threads read ready slots of an SSD tier while the prefetchers fill the others; memory
// for the fill is only the per-thread bounce buffers.
TEST(Prefetcher, ReadersConcurrentWithSsdFill) {
  TempDir dir("/var/tmp");
  const auto sizes = Sizes(300);
  std::vector<policy::SampleId> order;
  for (policy::SampleId k = 0; k < 300; k += 2)
    order.push_back(299 - k);
  auto layout = TierLayout::Ssd(PlanOf(order, sizes), sizes, 256 << 10);
  ASSERT_TRUE(layout.ok());
  auto tier = SsdTier::Create(SsdTierOptions{dir.path(), "pfjob", "n0", true}, std::move(*layout));
  ASSERT_TRUE(tier.ok()) << tier.status().ToString();
  SsdTier& t = **tier;
  Prefetcher pf(t, FetchContent, 2);
  ASSERT_TRUE(pf.Start().ok());
  std::atomic<uint64_t> checked{0};
  std::atomic<bool> bad{false};
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r) {
    readers.emplace_back([&, r] {
      for (size_t i = static_cast<size_t>(r); i < order.size(); i += 2) {
        const policy::SampleId k = order[i];
        if (!t.WaitReady(k, std::chrono::seconds(20)).ok()) {
          bad = true;
          return;
        }
        std::vector<std::byte> got(sizes[k]);
        if (!t.Read(k, got).ok() || got != Content(k, sizes[k])) bad = true;
        checked.fetch_add(1);
      }
    });
  }
  for (auto& th : readers)
    th.join();
  pf.Wait();
  EXPECT_FALSE(bad.load());
  EXPECT_EQ(checked.load(), order.size());
  EXPECT_EQ(pf.counters().filled, order.size());
  EXPECT_EQ(pf.counters().prefix, order.size());
}

TEST(Prefetcher, ZeroThreadsRejected) {
  const auto sizes = Sizes(3);
  auto tier = Ram({0, 1}, sizes);
  Prefetcher pf(*tier, FetchContent, 0);
  EXPECT_EQ(pf.Start().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace nopfs::service
