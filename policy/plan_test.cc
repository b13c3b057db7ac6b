#include "policy/plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "policy/sampler.h"

namespace nopfs::policy {
namespace {

JobSpec Job(uint64_t f, uint32_t n, uint64_t b, uint32_t epochs, uint32_t per_node,
            Scheme scheme = Scheme::kUniform) {
  JobSpec j;
  j.seed = 2024;
  j.samples = f;
  j.epochs = epochs;
  j.ranks = n;
  j.batch = b;
  j.scheme = scheme;
  j.ranks_per_node = per_node;
  return j;
}

// Deterministic, varied sizes: 1 KB to ~300 KB.
std::vector<Bytes> Sizes(uint64_t f, uint64_t salt) {
  std::vector<Bytes> s(f);
  SplitMix64 rng(salt);
  for (Bytes& b : s)
    b = 1000 + rng.Bounded(300000);
  return s;
}

// The ranking, computed here independently: count desc, first access asc, id asc.
std::vector<SampleId> Ranking(const NodeAccessCounts& c) {
  std::vector<SampleId> ids;
  for (uint64_t k = 0; k < c.count.size(); ++k) {
    if (c.count[k] != 0) ids.push_back(static_cast<SampleId>(k));
  }
  std::sort(ids.begin(), ids.end(), [&](SampleId a, SampleId b) {
    if (c.count[a] != c.count[b]) return c.count[a] > c.count[b];
    if (c.first_access[a] != c.first_access[b]) return c.first_access[a] < c.first_access[b];
    return a < b;
  });
  return ids;
}

// Checks everything a plan promises: capacities, first fit in ranking order, prefetch order by
// first access, and the totals.
void CheckPlan(const NodePlan& plan, const NodeAccessCounts& c, const std::vector<Bytes>& sizes,
               const std::vector<Bytes>& caps) {
  ASSERT_EQ(plan.tiers.size(), caps.size());
  ASSERT_EQ(plan.location.size(), sizes.size());
  EXPECT_EQ(plan.node, c.node);
  EXPECT_EQ(plan.accesses, c.accesses);
  EXPECT_EQ(plan.distinct, c.distinct);

  // First fit: walking the ranking, a sample sits in class j only if it fit there, and only if it
  // did not fit in any faster class at that moment; an uncached sample fit nowhere.
  std::vector<Bytes> used(caps.size(), 0);
  Bytes distinct_bytes = 0;
  uint64_t uncached = 0;
  for (SampleId k : Ranking(c)) {
    const Bytes s = sizes[k];
    distinct_bytes += s;
    const int8_t loc = plan.location[k];
    const size_t stop = loc == kNotCached ? caps.size() : static_cast<size_t>(loc);
    for (size_t j = 0; j < stop; ++j) {
      ASSERT_GT(used[j] + s, caps[j]) << "sample " << k << " fit in faster class " << j;
    }
    if (loc == kNotCached) {
      uncached += c.count[k];
    } else {
      ASSERT_LE(used[stop] + s, caps[stop]) << "sample " << k << " overflows class " << stop;
      used[stop] += s;
    }
  }
  EXPECT_EQ(plan.distinct_bytes, distinct_bytes);
  EXPECT_EQ(plan.uncached_accesses, uncached);

  uint64_t members = 0;
  for (size_t j = 0; j < caps.size(); ++j) {
    const TierPlan& t = plan.tiers[j];
    EXPECT_LE(t.bytes, caps[j]);
    EXPECT_EQ(t.bytes, used[j]);
    Bytes bytes = 0;
    uint64_t accesses = 0;
    for (size_t i = 0; i < t.prefetch_order.size(); ++i) {
      const SampleId k = t.prefetch_order[i];
      ASSERT_EQ(plan.location[k], static_cast<int8_t>(j));
      if (i > 0) {
        ASSERT_LT(c.first_access[t.prefetch_order[i - 1]], c.first_access[k])
            << "prefetch order is by first access";
      }
      bytes += sizes[k];
      accesses += c.count[k];
    }
    EXPECT_EQ(bytes, t.bytes);
    EXPECT_EQ(accesses, t.accesses);
    members += t.prefetch_order.size();
  }
  // Every sample with a location appears in its tier's list (and only those).
  uint64_t located = 0;
  for (int8_t loc : plan.location)
    located += loc != kNotCached ? 1 : 0;
  EXPECT_EQ(located, members);
  // Samples the node never reads are never cached.
  for (uint64_t k = 0; k < c.count.size(); ++k) {
    if (c.count[k] == 0) {
      ASSERT_EQ(plan.location[k], kNotCached);
    }
  }
}

TEST(PlanTest, FirstFitByRankingWithinCapacities) {
  for (Scheme scheme : {Scheme::kUniform, Scheme::kStrided}) {
    const JobSpec job = Job(30011, 16, 256, 20, 4, scheme);
    const std::vector<Bytes> sizes = Sizes(job.samples, 1);
    for (uint32_t node : {0u, 3u}) {
      const NodeAccessCounts c = CountNodeAccesses(job, node, 2);
      const Bytes node_bytes = std::accumulate(sizes.begin(), sizes.end(), Bytes{0}) / 4;
      for (const std::vector<Bytes>& caps :
           {std::vector<Bytes>{node_bytes / 8, node_bytes / 3},
            std::vector<Bytes>{node_bytes / 20, 0, node_bytes / 10, 250000},
            std::vector<Bytes>{node_bytes * 10}, std::vector<Bytes>{}}) {
        const NodePlan plan = MakeNodePlan(c, sizes, caps);
        SCOPED_TRACE("node " + std::to_string(node) + " classes " + std::to_string(caps.size()));
        CheckPlan(plan, c, sizes, caps);
      }
    }
  }
}

TEST(PlanTest, EqualSizesCacheExactlyTheTopRankedSamples) {
  const JobSpec job = Job(5000, 8, 64, 30, 2);
  const NodeAccessCounts c = CountNodeAccesses(job, 1, 2);
  const std::vector<Bytes> sizes(job.samples, 100);
  const NodePlan plan = MakeNodePlan(c, sizes, std::vector<Bytes>{100 * 50, 100 * 200 + 99});
  const std::vector<SampleId> ranked = Ranking(c);
  for (size_t i = 0; i < ranked.size(); ++i) {
    const int8_t want = i < 50 ? 0 : i < 250 ? 1 : kNotCached;
    ASSERT_EQ(plan.location[ranked[i]], want) << "rank " << i;
  }
  EXPECT_EQ(plan.tiers[0].prefetch_order.size(), 50u);
  EXPECT_EQ(plan.tiers[1].bytes, 20000u);
  // The most frequent samples are read more often than anything left uncached.
  EXPECT_GE(c.count[ranked[0]], c.count[ranked[249]]);
  EXPECT_GE(c.count[ranked[249]], c.count[ranked[250]]);
}

TEST(PlanTest, LargeSamplesSkipToSlowerClassesOrStayUncached) {
  // Hand-made counts: sample 0 is the most frequent but too big for the first class.
  NodeAccessCounts c;
  c.node = 2;
  c.count = {9, 7, 7, 1, 0};
  c.first_access = {5, 3, 1, 0, kNeverAccessed};
  c.accesses = 24;
  c.distinct = 4;
  const std::vector<Bytes> sizes = {500, 100, 100, 80, 1};
  const std::vector<Bytes> caps = {150, 520};
  const NodePlan plan = MakeNodePlan(c, sizes, caps);
  // Ranking: 0 (9), 2 (7, first 1), 1 (7, first 3), 3 (1).
  EXPECT_EQ(plan.location, (std::vector<int8_t>{1, kNotCached, 0, kNotCached, kNotCached}));
  EXPECT_EQ(plan.tiers[0].prefetch_order, (std::vector<SampleId>{2}));
  EXPECT_EQ(plan.tiers[1].prefetch_order, (std::vector<SampleId>{0}));
  EXPECT_EQ(plan.uncached_accesses, 8u);
  EXPECT_EQ(plan.distinct_bytes, 780u);
  CheckPlan(plan, c, sizes, caps);
}

TEST(PlanTest, IdenticalAcrossRunsAndThreadCounts) {
  const JobSpec job = Job(40009, 32, 1024, 12, 4, Scheme::kStrided);
  const std::vector<Bytes> sizes = Sizes(job.samples, 7);
  const std::vector<Bytes> caps = {200'000'000, 400'000'000};
  const NodePlan a = MakeNodePlan(job, 5, sizes, caps, 1);
  for (unsigned threads : {1u, 2u, 4u}) {
    const NodePlan b = MakeNodePlan(job, 5, sizes, caps, threads);
    EXPECT_EQ(a.location, b.location);
    ASSERT_EQ(a.tiers.size(), b.tiers.size());
    for (size_t j = 0; j < a.tiers.size(); ++j) {
      EXPECT_EQ(a.tiers[j].prefetch_order, b.tiers[j].prefetch_order);
      EXPECT_EQ(a.tiers[j].bytes, b.tiers[j].bytes);
      EXPECT_EQ(a.tiers[j].accesses, b.tiers[j].accesses);
    }
    EXPECT_EQ(a.uncached_accesses, b.uncached_accesses);
  }
}

TEST(PlanTest, RejectsMismatchedInputs) {
  const JobSpec job = Job(100, 2, 10, 2, 1);
  const NodeAccessCounts c = CountNodeAccesses(job, 0, 1);
  EXPECT_THROW(MakeNodePlan(c, std::vector<Bytes>(99, 1), std::vector<Bytes>{10}),
               std::invalid_argument);
  EXPECT_THROW(MakeNodePlan(c, std::vector<Bytes>(100, 1), std::vector<Bytes>(128, 10)),
               std::invalid_argument);
  EXPECT_NO_THROW(MakeNodePlan(c, std::vector<Bytes>(100, 1), std::vector<Bytes>(127, 10)));
  EXPECT_THROW(MakeNodePlan(job, 0, std::vector<Bytes>(101, 1), std::vector<Bytes>{10}, 1),
               std::invalid_argument);
}

}  // namespace
}  // namespace nopfs::policy

namespace nopfs::policy {
namespace {

TEST(PlannerTest, NamesRoundTripAndUnknownIsRejected) {
  for (Planner p : {Planner::kFrequency, Planner::kStaging, Planner::kFillOnce}) {
    Result<Planner> back = ParsePlanner(PlannerName(p));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, p);
  }
  Result<Planner> bad = ParsePlanner("lru");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("fill-once"), std::string::npos);
}

TEST(PlannerTest, StagingCachesNothingEvenEmptySamples) {
  const JobSpec job = Job(500, 4, 32, 3, 2);
  std::vector<Bytes> sizes = Sizes(500, 7);
  sizes[3] = 0;
  const std::vector<Bytes> caps = {Bytes{1} << 40, Bytes{1} << 40};
  const NodePlan plan = MakeNodePlan(job, 0, sizes, caps, 1, Planner::kStaging);
  EXPECT_TRUE(std::all_of(plan.location.begin(), plan.location.end(),
                          [](int8_t l) { return l == kNotCached; }));
  for (const TierPlan& t : plan.tiers) {
    EXPECT_TRUE(t.prefetch_order.empty());
    EXPECT_EQ(t.bytes, 0u);
  }
  EXPECT_EQ(plan.uncached_accesses, plan.accesses);
}

TEST(PlannerTest, FillOnceCachesTheFirstReadSamplesUntilFull) {
  const JobSpec job = Job(800, 4, 40, 5, 2);
  const std::vector<Bytes> sizes(800, 1000);
  const NodeAccessCounts counts = CountNodeAccesses(job, 1, 1);
  // Room for 150 of the node's samples in two classes.
  const std::vector<Bytes> caps = {100'000, 50'000};
  const NodePlan plan = MakeNodePlan(counts, sizes, caps, Planner::kFillOnce);
  ASSERT_EQ(plan.tiers[0].prefetch_order.size(), 100u);
  ASSERT_EQ(plan.tiers[1].prefetch_order.size(), 50u);
  // Every cached sample is first read before every uncached one the node reads, and the first
  // class holds the earliest.
  uint64_t last_cached = 0;
  uint64_t first_uncached = kNeverAccessed;
  uint64_t last_fast = 0;
  uint64_t first_slow = kNeverAccessed;
  for (uint64_t k = 0; k < 800; ++k) {
    if (counts.count[k] == 0) {
      EXPECT_EQ(plan.location[k], kNotCached);
      continue;
    }
    const uint64_t fa = counts.first_access[k];
    if (plan.location[k] == kNotCached) first_uncached = std::min(first_uncached, fa);
    if (plan.location[k] != kNotCached) last_cached = std::max(last_cached, fa);
    if (plan.location[k] == 0) last_fast = std::max(last_fast, fa);
    if (plan.location[k] == 1) first_slow = std::min(first_slow, fa);
  }
  EXPECT_LT(last_cached, first_uncached);
  EXPECT_LT(last_fast, first_slow);
  // Prefetch lists are in first-access order.
  for (const TierPlan& t : plan.tiers) {
    for (size_t i = 1; i < t.prefetch_order.size(); ++i) {
      EXPECT_LT(counts.first_access[t.prefetch_order[i - 1]],
                counts.first_access[t.prefetch_order[i]]);
    }
  }
}

}  // namespace
}  // namespace nopfs::policy
