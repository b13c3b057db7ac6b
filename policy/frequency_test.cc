#include "policy/frequency.h"

#include <gtest/gtest.h>

#include <map>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "policy/partition.h"

namespace nopfs::policy {
namespace {

JobSpec Job(uint64_t f, uint32_t n, uint64_t b, Scheme scheme, bool drop, uint32_t epochs,
            uint32_t per_node, uint64_t seed = 11) {
  JobSpec j;
  j.seed = seed;
  j.samples = f;
  j.epochs = epochs;
  j.ranks = n;
  j.batch = b;
  j.scheme = scheme;
  j.drop_last = drop;
  j.ranks_per_node = per_node;
  return j;
}

// The node's counts the slow way: every local rank's RankStream, interleaved into the node's
// order (epoch, step, local rank, entry).
NodeAccessCounts BruteForce(const JobSpec& job, uint32_t node) {
  std::map<std::tuple<uint32_t, uint64_t, uint32_t>, std::vector<SampleId>> by_key;
  for (uint32_t l = 0; l < job.ranks_on_node(node); ++l) {
    RankStream s(job, job.first_rank(node) + l);
    Access a;
    while (s.Next(&a))
      by_key[{a.epoch, a.step, l}].push_back(a.sample);
  }
  NodeAccessCounts out;
  out.node = node;
  out.count.assign(job.samples, 0);
  out.first_access.assign(job.samples, kNeverAccessed);
  uint64_t pos = 0;
  for (const auto& [key, samples] : by_key) {  // std::map iterates in (epoch, step, rank) order
    for (SampleId k : samples) {
      if (out.count[k]++ == 0) out.first_access[k] = pos;
      ++pos;
    }
  }
  out.accesses = pos;
  for (uint32_t c : out.count)
    out.distinct += c != 0 ? 1 : 0;
  return out;
}

void ExpectSame(const NodeAccessCounts& a, const NodeAccessCounts& b) {
  EXPECT_EQ(a.node, b.node);
  EXPECT_EQ(a.count, b.count);
  EXPECT_EQ(a.first_access, b.first_access);
  EXPECT_EQ(a.accesses, b.accesses);
  EXPECT_EQ(a.distinct, b.distinct);
}

TEST(FrequencyTest, EqualsTheNodesInterleavedRankStreams) {
  for (Scheme scheme : {Scheme::kUniform, Scheme::kStrided}) {
    for (bool drop : {false, true}) {
      // 3 nodes of 3, 3 and 1 ranks; B not a multiple of N; uniform pads the trailing batch of
      // 1 to 7 entries, strided pads 3.
      const JobSpec job = Job(53, 7, 13, scheme, drop, 5, 3);
      ASSERT_TRUE(job.Validate().ok()) << job.Validate().message();
      for (uint32_t node = 0; node < job.nodes(); ++node) {
        SCOPED_TRACE(std::string(SchemeName(scheme)) + " drop " + std::to_string(drop) + " node " +
                     std::to_string(node));
        const NodeAccessCounts got = CountNodeAccesses(job, node, 2);
        ExpectSame(got, BruteForce(job, node));
        EXPECT_EQ(got.accesses, job.epochs * NodeEpochLength(job, node));
      }
    }
  }
}

TEST(FrequencyTest, IdenticalForEveryThreadCount) {
  for (Scheme scheme : {Scheme::kUniform, Scheme::kStrided}) {
    const JobSpec job = Job(20011, 16, 512, scheme, false, 13, 4);
    const NodeAccessCounts one = CountNodeAccesses(job, 1, 1);
    for (unsigned threads : {2u, 3u, 4u, 0u})
      ExpectSame(CountNodeAccesses(job, 1, threads), one);
    // More threads than epochs are not started but give the same answer too.
    ExpectSame(CountNodeAccesses(job, 1, 64), one);
  }
}

TEST(FrequencyTest, EverySampleIsReadEpochsTimesByTheWholeJob) {
  // No drop_last and no padding: each epoch reads every sample exactly once, so the nodes' counts
  // add up to E for every sample, and first accesses fall in epoch 0.
  for (Scheme scheme : {Scheme::kUniform, Scheme::kStrided}) {
    const JobSpec job = Job(4000, 8, 96, scheme, false, 9, 2);  // strided: 8 divides 4000
    std::vector<uint32_t> total(job.samples, 0);
    uint64_t accesses = 0;
    for (uint32_t node = 0; node < job.nodes(); ++node) {
      const NodeAccessCounts c = CountNodeAccesses(job, node, 2);
      const uint64_t epoch_length = NodeEpochLength(job, node);
      for (uint64_t k = 0; k < job.samples; ++k) {
        total[k] += c.count[k];
        if (c.count[k] != 0) {
          EXPECT_LT(c.first_access[k], c.accesses);
        } else {
          EXPECT_EQ(c.first_access[k], kNeverAccessed);
        }
      }
      // Samples read in epoch 0 have their first access there.
      uint64_t in_first_epoch = 0;
      for (uint64_t fa : c.first_access)
        in_first_epoch += fa < epoch_length ? 1 : 0;
      EXPECT_EQ(in_first_epoch, epoch_length);
      accesses += c.accesses;
    }
    for (uint64_t k = 0; k < job.samples; ++k)
      ASSERT_EQ(total[k], job.epochs) << k;
    EXPECT_EQ(accesses, job.samples * job.epochs);
  }
}

TEST(FrequencyTest, OneNodeReadsEverythingEveryEpoch) {
  const JobSpec job = Job(1000, 4, 40, Scheme::kUniform, false, 3, 4);
  const NodeAccessCounts c = CountNodeAccesses(job, 0, 2);
  EXPECT_EQ(c.distinct, 1000u);
  EXPECT_EQ(c.accesses, 3000u);
  for (uint32_t v : c.count)
    EXPECT_EQ(v, 3u);
}

TEST(FrequencyTest, RejectsInvalidJobsAndNodes) {
  EXPECT_THROW(CountNodeAccesses(Job(10, 2, 0, Scheme::kUniform, false, 1, 1), 0),
               std::invalid_argument);
  EXPECT_THROW(CountNodeAccesses(Job(10, 4, 4, Scheme::kUniform, false, 1, 2), 2),
               std::out_of_range);
}

}  // namespace
}  // namespace nopfs::policy
