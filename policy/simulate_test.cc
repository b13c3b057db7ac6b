#include "policy/simulate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "policy/frequency.h"
#include "policy/partition.h"
#include "policy/plan.h"
#include "policy/predict.h"
#include "policy/sampler.h"

namespace nopfs::policy {
namespace {

JobSpec Job(uint64_t f, uint32_t n, uint64_t b, uint32_t epochs, uint32_t per_node,
            Scheme scheme = Scheme::kUniform) {
  JobSpec j;
  j.seed = 4242;
  j.samples = f;
  j.epochs = epochs;
  j.ranks = n;
  j.batch = b;
  j.scheme = scheme;
  j.ranks_per_node = per_node;
  return j;
}

StorageClass Class(const std::string& name, Bytes capacity, double read, double write,
                   uint32_t threads) {
  StorageClass c;
  c.name = name;
  c.capacity = capacity;
  c.threads = threads;
  c.read = BandwidthTable::Constant(read);
  c.write = BandwidthTable::Constant(write);
  return c;
}

// ImageNet-like spread: 20 KB to 220 KB.
std::vector<Bytes> Sizes(uint64_t f, uint64_t salt) {
  std::vector<Bytes> s(f);
  SplitMix64 rng(salt);
  for (Bytes& b : s)
    b = 20'000 + rng.Bounded(200'000);
  return s;
}

Bytes Total(const std::vector<Bytes>& s) {
  return std::accumulate(s.begin(), s.end(), Bytes{0});
}

// A loaded PFS (per-reader bandwidth falls as readers grow), fast RAM, a slower SSD.
SimOptions Options(const JobSpec& job, Bytes ram, Bytes ssd) {
  SimOptions o;
  o.job = job;
  o.model.compute_rate = 20e6;  // ~170 samples/s per rank
  o.model.preprocess_rate = 400e6;
  o.model.pfs = BandwidthTable({{1, 40e6}, {8, 120e6}, {64, 200e6}});
  o.model.staging = Class("staging", 64 << 20, 0, 2e9, 4);
  o.model.staging.read = BandwidthTable();
  if (ram != 0) o.model.classes.push_back(Class("ram", ram, 8e9, 4e9, 2));
  if (ssd != 0) {
    o.model.classes.push_back(Class("ssd", ssd, 1e9, 500e6, 2));
    o.model.classes.back().kind = ClassKind::kSsd;
    o.model.classes.back().path = "/scratch";
  }
  o.threads = 2;
  return o;
}

std::vector<PolicyResult> RunAll(const SimOptions& o, const std::vector<Bytes>& sizes) {
  Result<std::vector<PolicyResult>> r = Simulate(o, sizes, kAllSimPolicies);
  EXPECT_TRUE(r.ok()) << r.status().message();
  if (!r.ok()) return {};
  EXPECT_EQ(r->size(), kAllSimPolicies.size());
  return std::move(*r);
}

const PolicyResult& Of(const std::vector<PolicyResult>& rs, SimPolicy p) {
  for (const PolicyResult& r : rs) {
    if (r.policy == p) return r;
  }
  throw std::logic_error("policy missing");
}

void ExpectNear(double a, double b) {
  EXPECT_NEAR(a, b, 1e-9 * std::max({1.0, std::abs(a), std::abs(b)}));
}

TEST(SimulateTest, NamesRoundTrip) {
  for (SimPolicy p : kAllSimPolicies) {
    Result<SimPolicy> back = ParseSimPolicy(SimPolicyName(p));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, p);
  }
  EXPECT_FALSE(ParseSimPolicy("lru").ok());
}

TEST(SimulateTest, HandComputedStagingAndDataLoader) {
  // One rank, one epoch of three 1000-byte samples, batch 1. PFS 500 B/s with one reader: 2 s a
  // sample; staging write 1 s; compute 1 s.
  SimOptions o;
  o.job = Job(3, 1, 1, 1, 1);
  o.model.compute_rate = 1000;
  o.model.pfs = BandwidthTable::Constant(500);
  o.model.staging = Class("staging", 1 << 20, 1e6, 1000, 1);
  o.loader_workers = 1;
  o.loader_prefetch = 2;
  const std::vector<Bytes> sizes(3, 1000);
  const std::vector<PolicyResult> rs = RunAll(o, sizes);
  // staging: avail 3, 6, 9; consumed at [3,4], [6,7], [9,10].
  const PolicyResult& st = Of(rs, SimPolicy::kStaging);
  EXPECT_DOUBLE_EQ(st.total_seconds, 10);
  EXPECT_DOUBLE_EQ(st.stall_seconds, 7);
  EXPECT_DOUBLE_EQ(st.compute_seconds, 3);
  EXPECT_DOUBLE_EQ(st.stall_median_seconds, 2);
  EXPECT_DOUBLE_EQ(st.stall_p99_seconds, 3);
  EXPECT_EQ(st.node_pfs_bytes, 3000u);
  // DataLoader, one worker, prefetch 2: loads [0,2], [2,4], [4,6] (the third may start once
  // batch 0 was taken at 2); consumed at [2,3], [4,5], [6,7].
  const PolicyResult& dl = Of(rs, SimPolicy::kDataLoader);
  EXPECT_DOUBLE_EQ(dl.total_seconds, 7);
  EXPECT_DOUBLE_EQ(dl.stall_seconds, 4);
  EXPECT_EQ(dl.pfs_readers, 1u);
  // No I/O: compute alone.
  const PolicyResult& none = Of(rs, SimPolicy::kNoIo);
  EXPECT_DOUBLE_EQ(none.total_seconds, 3);
  EXPECT_EQ(none.stall_seconds, 0);
  EXPECT_EQ(none.node_pfs_bytes, 0u);
  // Prefetch 1 with one worker: batch 1 may start only once batch 0 was taken.
  o.loader_prefetch = 1;
  EXPECT_DOUBLE_EQ(Of(RunAll(o, sizes), SimPolicy::kDataLoader).total_seconds, 7);
  // In the main process: load then compute, 3 s a sample.
  o.loader_workers = 0;
  EXPECT_DOUBLE_EQ(Of(RunAll(o, sizes), SimPolicy::kDataLoader).total_seconds, 9);
}

TEST(SimulateTest, NoIoIsALowerBoundOfEveryPolicy) {
  for (const JobSpec& job :
       {Job(3000, 8, 64, 4, 4), Job(2000, 6, 48, 3, 3, Scheme::kStrided), Job(1500, 2, 30, 5, 2)}) {
    const std::vector<Bytes> sizes = Sizes(job.samples, job.ranks);
    for (Bytes ram : {Bytes{0}, Total(sizes) / 8, Total(sizes)}) {
      const std::vector<PolicyResult> rs = RunAll(Options(job, ram, ram / 2), sizes);
      const PolicyResult& bound = Of(rs, SimPolicy::kNoIo);
      EXPECT_EQ(bound.stall_seconds, 0);
      for (const PolicyResult& r : rs) {
        SCOPED_TRACE(std::string(SimPolicyName(r.policy)));
        EXPECT_LE(bound.total_seconds, r.total_seconds * (1 + 1e-12));
        ASSERT_EQ(r.epoch_seconds.size(), job.epochs);
        for (uint32_t e = 0; e < job.epochs; ++e)
          EXPECT_LE(bound.epoch_seconds[e], r.epoch_seconds[e] * (1 + 1e-9) + 1e-9);
        ExpectNear(std::accumulate(r.epoch_seconds.begin(), r.epoch_seconds.end(), 0.0),
                   r.total_seconds);
        EXPECT_LE(r.stall_median_seconds, r.stall_p99_seconds);
        EXPECT_EQ(r.steps, job.epochs * StepsPerEpoch(job));
      }
    }
  }
}

TEST(SimulateTest, InfinitePfsBandwidthReachesTheBound) {
  const JobSpec job = Job(2000, 8, 64, 3, 4);
  const std::vector<Bytes> sizes = Sizes(job.samples, 3);
  SimOptions o = Options(job, Total(sizes) / 4, 0);
  o.model.preprocess_rate = 0;
  o.model.pfs = BandwidthTable::Constant(1e300);
  o.model.staging.write = BandwidthTable::Constant(1e300);
  o.model.classes[0].read = BandwidthTable::Constant(1e300);
  o.model.classes[0].write = BandwidthTable::Constant(1e300);
  const std::vector<PolicyResult> rs = RunAll(o, sizes);
  const PolicyResult& bound = Of(rs, SimPolicy::kNoIo);
  for (const PolicyResult& r : rs) {
    SCOPED_TRACE(std::string(SimPolicyName(r.policy)));
    ExpectNear(r.total_seconds, bound.total_seconds);
    EXPECT_LT(r.stall_seconds, 1e-9);
  }
}

TEST(SimulateTest, FrequencyBeatsStagingWhenTheCacheHoldsTheData) {
  const JobSpec job = Job(3000, 8, 64, 4, 4);
  const std::vector<Bytes> sizes = Sizes(job.samples, 11);
  SimOptions o = Options(job, Total(sizes), 0);
  // The job consumes 160 MB/s; the PFS gives less than 100 MB/s to 32 readers.
  o.model.pfs = BandwidthTable({{1, 20e6}, {8, 60e6}, {64, 100e6}});
  o.fetch_and_cache = false;
  const std::vector<PolicyResult> rs = RunAll(o, sizes);
  const PolicyResult& freq = Of(rs, SimPolicy::kFrequency);
  const PolicyResult& staging = Of(rs, SimPolicy::kStaging);
  const PolicyResult& bound = Of(rs, SimPolicy::kNoIo);
  EXPECT_GT(staging.total_seconds, 1.3 * bound.total_seconds);  // staging is I/O-bound
  // Without fetch-and-cache (only prefetchers fill the tiers): the prefetchers (2 threads of 36 PFS
  // readers) lag behind the consumers, and each later epoch finds more of the data local.
  EXPECT_LT(freq.total_seconds, staging.total_seconds);
  for (uint32_t e = 1; e < job.epochs; ++e) {
    EXPECT_LT(freq.epoch_seconds[e], staging.epoch_seconds[e]) << "epoch " << e;
    EXPECT_LE(freq.epoch_seconds[e], freq.epoch_seconds[e - 1]) << "epoch " << e;
  }
  // With fetch-and-cache, what staging reads in the first epoch stays: every later epoch runs
  // at the compute rate.
  o.fetch_and_cache = true;
  const std::vector<PolicyResult> cached = RunAll(o, sizes);
  const PolicyResult& fc = Of(cached, SimPolicy::kFrequency);
  EXPECT_LT(fc.total_seconds, freq.total_seconds);
  for (uint32_t e = 1; e < job.epochs; ++e)
    EXPECT_LT(fc.epoch_seconds[e], 1.02 * bound.epoch_seconds[e]) << "epoch " << e;
  // The DataLoader with 4 workers on this loaded PFS is slower still than staging.
  EXPECT_LT(staging.total_seconds, Of(rs, SimPolicy::kDataLoader).total_seconds);
}

TEST(SimulateTest, PfsBytesAreOneDatasetWhenTheCacheHoldsIt) {
  // One node (the aggregate cache is the node's), two ranks, every sample read every epoch;
  // enough prefetch threads to stay ahead of the consumers after the first ring.
  const JobSpec job = Job(2000, 2, 32, 5, 2);
  const std::vector<Bytes> sizes = Sizes(job.samples, 5);
  const Bytes dataset = Total(sizes);
  SimOptions o = Options(job, dataset, 0);
  o.model.classes[0].threads = 8;
  o.fetch_and_cache = false;
  const std::vector<PolicyResult> rs = RunAll(o, sizes);
  const PolicyResult& freq = Of(rs, SimPolicy::kFrequency);
  // Without fetch-and-cache the prefetchers read the dataset once, and staging reads from the PFS
  // the samples they have not reached yet without keeping them, so a part is read twice.
  EXPECT_GE(freq.node_pfs_bytes, dataset);
  EXPECT_LT(freq.node_pfs_bytes, 2 * dataset);
  EXPECT_EQ(freq.job_pfs_bytes, freq.node_pfs_bytes);
  // The cache holds everything, so fill-once holds what frequency holds.
  EXPECT_EQ(Of(rs, SimPolicy::kFillOnce).node_pfs_bytes, freq.node_pfs_bytes);
  // Without a cache every epoch reads the dataset again.
  EXPECT_EQ(Of(rs, SimPolicy::kStaging).node_pfs_bytes, dataset * job.epochs);
  EXPECT_EQ(Of(rs, SimPolicy::kDataLoader).node_pfs_bytes, dataset * job.epochs);
  // Filled on read (MinIO), each sample is read from the PFS exactly once, at its first access.
  o.fill_once_on_read = true;
  EXPECT_EQ(Of(RunAll(o, sizes), SimPolicy::kFillOnce).node_pfs_bytes, dataset);
  // With fetch-and-cache, whoever reads a sample first keeps it: one dataset, plus the few
  // samples staging needs while a prefetcher is already fetching them.
  o.fetch_and_cache = true;
  const Bytes fc = Of(RunAll(o, sizes), SimPolicy::kFrequency).node_pfs_bytes;
  EXPECT_GE(fc, dataset);
  EXPECT_LE(fc, dataset + dataset / 20);
}

TEST(SimulateTest, FillOnceKeepsTheFirstReadSamples) {
  // A cache of a third of the data: fill-once serves the later epochs only from the samples read
  // first, frequency from the most read; both beat no cache, fill-once on read reads each cached
  // sample from the PFS once.
  const JobSpec job = Job(3000, 8, 64, 4, 4);
  const std::vector<Bytes> sizes = Sizes(job.samples, 19);
  SimOptions o = Options(job, Total(sizes) / 3, 0);
  o.model.pfs = BandwidthTable({{1, 20e6}, {8, 60e6}, {64, 100e6}});
  o.fill_once_on_read = true;
  const std::vector<PolicyResult> rs = RunAll(o, sizes);
  const PolicyResult& once = Of(rs, SimPolicy::kFillOnce);
  const PolicyResult& staging = Of(rs, SimPolicy::kStaging);
  EXPECT_LT(once.total_seconds, staging.total_seconds);
  EXPECT_LT(once.node_pfs_bytes, staging.node_pfs_bytes);
  EXPECT_GT(once.reads[static_cast<size_t>(SourceKind::kLocal)], 0u);
  EXPECT_EQ(once.reads[static_cast<size_t>(SourceKind::kLocal)] +
                once.reads[static_cast<size_t>(SourceKind::kPfs)],
            staging.reads[static_cast<size_t>(SourceKind::kPfs)]);
}

TEST(SimulateTest, SymmetryScalesJobBytesAndReaders) {
  const JobSpec job = Job(4000, 16, 64, 2, 4);  // 4 nodes
  const std::vector<Bytes> sizes = Sizes(job.samples, 9);
  SimOptions o = Options(job, 0, 0);
  o.node = 2;
  const std::vector<PolicyResult> rs = RunAll(o, sizes);
  const PolicyResult& st = Of(rs, SimPolicy::kStaging);
  EXPECT_EQ(st.job_pfs_bytes, 4 * st.node_pfs_bytes);
  EXPECT_EQ(st.pfs_readers, 4u * 4u * o.model.staging.threads);
  EXPECT_EQ(Of(rs, SimPolicy::kDataLoader).pfs_readers, 4u * 4u * o.loader_workers);
}

TEST(SimulateTest, MatchesPredictNodeUnderItsAssumptions) {
  // Warm tiers, no window, no barrier, the same readers: the recurrence is PredictNode's.
  for (const JobSpec& job :
       {Job(3000, 8, 64, 3, 4), Job(2500, 6, 40, 4, 3, Scheme::kStrided), Job(1000, 1, 16, 6, 1)}) {
    const std::vector<Bytes> sizes = Sizes(job.samples, 21);
    for (Bytes ram : {Bytes{0}, Total(sizes) / 10, Total(sizes) / 3}) {
      SimOptions o = Options(job, ram, ram);
      o.warm_tiers = true;
      o.staging_window = false;
      o.step_barrier = false;
      o.pfs_readers = 24;
      const SimPolicy freq = SimPolicy::kFrequency;
      Result<std::vector<PolicyResult>> r = Simulate(o, sizes, std::span(&freq, 1));
      ASSERT_TRUE(r.ok()) << r.status().message();
      std::vector<Bytes> caps;
      for (const StorageClass& c : o.model.classes)
        caps.push_back(c.capacity);
      const NodePlan plan = MakeNodePlan(job, 0, sizes, caps, 2);
      const NodePrediction p = PredictNode(job, plan, sizes, o.model, 24, 2);
      const PolicyResult& s = (*r)[0];
      ExpectNear(s.total_seconds, p.total_seconds);
      ExpectNear(s.stall_seconds, p.stall_seconds);
      ExpectNear(s.compute_seconds, p.compute_seconds);
      EXPECT_EQ(s.reads, p.reads);
      EXPECT_EQ(s.node_pfs_bytes, p.bytes[static_cast<size_t>(SourceKind::kPfs)]);
    }
  }
}

TEST(SimulateTest, BarrierAndWindowOnlyAddTime) {
  const JobSpec job = Job(3000, 8, 64, 3, 4);
  const std::vector<Bytes> sizes = Sizes(job.samples, 13);
  SimOptions free = Options(job, Total(sizes) / 5, 0);
  free.step_barrier = false;
  free.staging_window = false;
  SimOptions real = free;
  real.step_barrier = true;
  real.staging_window = true;
  real.model.staging.capacity = 2 << 20;  // a few samples per rank
  const std::vector<PolicyResult> a = RunAll(free, sizes);
  const std::vector<PolicyResult> b = RunAll(real, sizes);
  for (size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE(std::string(SimPolicyName(a[i].policy)));
    EXPECT_LE(a[i].total_seconds, b[i].total_seconds * (1 + 1e-12));
  }
}

TEST(SimulateTest, DeterministicAcrossThreadCounts) {
  const JobSpec job = Job(2000, 4, 32, 5, 2);
  const std::vector<Bytes> sizes = Sizes(job.samples, 17);
  SimOptions o = Options(job, Total(sizes) / 3, Total(sizes) / 3);
  o.threads = 1;
  const std::vector<PolicyResult> a = RunAll(o, sizes);
  o.threads = 3;
  const std::vector<PolicyResult> b = RunAll(o, sizes);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].epoch_seconds, b[i].epoch_seconds);
    EXPECT_EQ(a[i].node_pfs_bytes, b[i].node_pfs_bytes);
  }
}

TEST(SimulateTest, PeersServeWhatOtherNodesReadEarlier) {
  const JobSpec job = Job(4000, 16, 64, 4, 4);  // 4 nodes
  const std::vector<Bytes> sizes = Sizes(job.samples, 23);
  SimOptions o = Options(job, Total(sizes), 0);
  o.model.pfs = BandwidthTable({{1, 20e6}, {8, 60e6}, {64, 100e6}});
  const SimPolicy freq = SimPolicy::kFrequency;
  Result<std::vector<PolicyResult>> alone = Simulate(o, sizes, std::span(&freq, 1));
  ASSERT_TRUE(alone.ok());
  EXPECT_EQ((*alone)[0].reads[static_cast<size_t>(SourceKind::kPeer)], 0u);  // no network
  o.model.network_bandwidth = 10e9;
  Result<std::vector<PolicyResult>> with = Simulate(o, sizes, std::span(&freq, 1));
  ASSERT_TRUE(with.ok());
  const PolicyResult& a = (*alone)[0];
  const PolicyResult& b = (*with)[0];
  EXPECT_GT(b.reads[static_cast<size_t>(SourceKind::kPeer)], 0u);
  EXPECT_LT(b.total_seconds, a.total_seconds);
  EXPECT_EQ(b.reads[0] + b.reads[1] + b.reads[2], a.reads[0] + a.reads[1] + a.reads[2]);
  // Only what another node read at an earlier step: in one epoch of one step nothing is.
  SimOptions one = o;
  one.job = Job(4000, 16, 4000, 1, 4);
  Result<std::vector<PolicyResult>> single = Simulate(one, sizes, std::span(&freq, 1));
  ASSERT_TRUE(single.ok());
  EXPECT_EQ((*single)[0].reads[static_cast<size_t>(SourceKind::kPeer)], 0u);
  // Turned off, or one node: no peer reads.
  o.peers = false;
  EXPECT_EQ((*Simulate(o, sizes, std::span(&freq, 1)))[0].total_seconds, a.total_seconds);
}

TEST(SimulateTest, RejectsBadInput) {
  const JobSpec job = Job(100, 4, 8, 1, 2);
  const std::vector<Bytes> sizes(100, 1000);
  SimOptions o = Options(job, 0, 0);
  o.model.compute_rate = 0;
  EXPECT_FALSE(Simulate(o, sizes, kAllSimPolicies).ok());
  o = Options(job, 0, 0);
  o.node = 2;
  Result<std::vector<PolicyResult>> r = Simulate(o, sizes, kAllSimPolicies);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("out of range"), std::string::npos);
  o.node = 0;
  EXPECT_FALSE(Simulate(o, std::vector<Bytes>(99, 1000), kAllSimPolicies).ok());
  o.loader_prefetch = 0;
  EXPECT_FALSE(Simulate(o, sizes, kAllSimPolicies).ok());
}

}  // namespace
}  // namespace nopfs::policy
