#include "service/tiers/tier_layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <thread>

#include "service/tiers/tier_test_util.h"

namespace nopfs::service {
namespace {

using testing::PlanOf;

std::vector<uint64_t> RandomSizes(uint64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> sizes(n);
  for (auto& s : sizes)
    s = rng() % 3 == 0 ? rng() % 10 : 1 + rng() % 300000;
  return sizes;
}

// Every slot inside its file, aligned, and no two slots overlap (padded extents included).
void CheckLayout(const TierLayout& l, uint64_t alignment) {
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> per_file(l.file_count());
  uint64_t payload = 0;
  for (uint32_t slot = 0; slot < l.slot_count(); ++slot) {
    const SlotExtent e = l.Extent(slot);
    ASSERT_LT(e.file, l.file_count());
    EXPECT_EQ(e.offset % alignment, 0u) << "slot " << slot;
    EXPECT_LE(e.offset + l.PaddedSizeOf(slot), l.file_bytes(e.file)) << "slot " << slot;
    per_file[e.file].emplace_back(e.offset, e.offset + e.size);
    payload += e.size;
  }
  uint64_t total = 0;
  for (uint32_t f = 0; f < l.file_count(); ++f) {
    EXPECT_EQ(l.file_bytes(f) % alignment, 0u);
    total += l.file_bytes(f);
    auto& v = per_file[f];
    std::sort(v.begin(), v.end());
    for (size_t i = 1; i < v.size(); ++i) {
      EXPECT_LE(v[i - 1].second, v[i].first) << "file " << f << " overlap";
    }
  }
  EXPECT_EQ(total, l.total_bytes());
  EXPECT_EQ(payload, l.payload_bytes());
}

TEST(TierLayout, RamPackedAlignedNoOverlap) {
  const auto sizes = RandomSizes(5000, 1);
  std::vector<policy::SampleId> order;
  for (policy::SampleId s = 0; s < 5000; s += 3)
    order.push_back(s);
  std::shuffle(order.begin(), order.end(), std::mt19937(7));
  auto l = TierLayout::Ram(PlanOf(order, sizes), sizes);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->file_count(), 1u);
  CheckLayout(*l, kRamAlignment);
  // Packed: the padding per sample is below the alignment.
  EXPECT_LT(l->total_bytes() - l->payload_bytes(), kRamAlignment * order.size());
  // Slots follow the prefetch order.
  for (uint32_t slot = 0; slot < order.size(); ++slot)
    EXPECT_EQ(l->SampleAt(slot), order[slot]);
}

TEST(TierLayout, SsdSplitsIntoFilesAt4KiB) {
  const auto sizes = RandomSizes(3000, 2);
  std::vector<policy::SampleId> order(3000);
  for (policy::SampleId s = 0; s < 3000; ++s)
    order[s] = 2999 - s;
  const uint64_t max_file = uint64_t{64} << 20;
  auto l = TierLayout::Ssd(PlanOf(order, sizes), sizes, max_file);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_GT(l->file_count(), 1u);
  for (uint32_t f = 0; f < l->file_count(); ++f)
    EXPECT_LE(l->file_bytes(f), max_file);
  CheckLayout(*l, kSsdAlignment);
}

TEST(TierLayout, SampleLargerThanAFileGetsItsOwn) {
  const std::vector<uint64_t> sizes = {100, 50000, 100};
  auto l = TierLayout::Ssd(PlanOf({0, 1, 2}, sizes), sizes, 8192);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->file_count(), 3u);
  EXPECT_EQ(l->Extent(1).file, 1u);
  EXPECT_EQ(l->Extent(1).offset, 0u);
  EXPECT_EQ(l->file_bytes(1), 53248u);  // 50000 rounded up to 4 KiB
  CheckLayout(*l, kSsdAlignment);
}

TEST(TierLayout, SlotOfMatchesPlanForEveryId) {
  const uint64_t f = 100000;
  std::vector<uint64_t> sizes(f, 10);
  std::vector<policy::SampleId> order;
  std::mt19937 rng(3);
  for (policy::SampleId s = 0; s < f; ++s) {
    if (rng() % 5 == 0) order.push_back(s);
  }
  std::shuffle(order.begin(), order.end(), rng);
  auto l = TierLayout::Ram(PlanOf(order, sizes), sizes);
  ASSERT_TRUE(l.ok());
  std::vector<uint32_t> want(f, kNoSlot);
  for (uint32_t slot = 0; slot < order.size(); ++slot)
    want[order[slot]] = slot;
  for (policy::SampleId s = 0; s < f; ++s)
    ASSERT_EQ(l->SlotOf(s), want[s]) << "sample " << s;
  EXPECT_EQ(l->SlotOf(static_cast<policy::SampleId>(f)), kNoSlot);
  EXPECT_EQ(l->SlotOf(UINT32_MAX - 1), kNoSlot);
}

TEST(TierLayout, RejectsBadInput) {
  const std::vector<uint64_t> sizes = {1, 2, 3};
  auto dup = TierLayout::Ram(PlanOf({0, 1, 0}, sizes), sizes);
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.status().message().find("sample 0 appears twice"), std::string::npos);
  policy::TierPlan out;
  out.prefetch_order = {5};
  auto bad = TierLayout::Ram(out, sizes);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(TierLayout::Make(PlanOf({0}, sizes), sizes, 48, 0).ok());
}

TEST(TierLayout, EmptyPlanHasNoFile) {
  const std::vector<uint64_t> sizes = {1, 2, 3};
  auto l = TierLayout::Ssd(policy::TierPlan{}, sizes);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->slot_count(), 0u);
  EXPECT_EQ(l->file_count(), 0u);
  EXPECT_EQ(l->total_bytes(), 0u);
  EXPECT_EQ(l->SlotOf(1), kNoSlot);
}

TEST(SlotTable, TransitionsAndWait) {
  SlotTable t(3);
  EXPECT_EQ(t.state(0), SlotState::kEmpty);
  EXPECT_TRUE(t.TryBeginFill(0));
  EXPECT_FALSE(t.TryBeginFill(0));  // owned by the first caller
  EXPECT_EQ(t.WaitReady(0, std::chrono::milliseconds(20)).code(), StatusCode::kTimedOut);
  std::thread filler([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    t.MarkReady(0, 42);
  });
  EXPECT_TRUE(t.WaitReady(0, std::chrono::seconds(10)).ok());
  filler.join();
  EXPECT_EQ(t.expected(0), 42u);
  EXPECT_FALSE(t.TryBeginFill(0));  // ready slots are not refilled
  ASSERT_TRUE(t.TryBeginFill(1));
  t.MarkFailed(1);
  EXPECT_EQ(t.WaitReady(1, std::chrono::seconds(1)).code(), StatusCode::kUnavailable);
  EXPECT_TRUE(t.TryBeginFill(1));  // a failed slot may be refilled
  t.Abandon(1);
  EXPECT_EQ(t.state(1), SlotState::kEmpty);
}

}  // namespace
}  // namespace nopfs::service
