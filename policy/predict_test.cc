#include "policy/predict.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "policy/partition.h"
#include "policy/sampler.h"

namespace nopfs::policy {
namespace {

JobSpec Job(uint64_t f, uint32_t n, uint64_t b, uint32_t epochs, uint32_t per_node,
            Scheme scheme = Scheme::kUniform, bool drop = false) {
  JobSpec j;
  j.seed = 99;
  j.samples = f;
  j.epochs = epochs;
  j.ranks = n;
  j.batch = b;
  j.scheme = scheme;
  j.drop_last = drop;
  j.ranks_per_node = per_node;
  return j;
}

StorageClass Class(const std::string& name, double read, double write, uint32_t threads) {
  StorageClass c;
  c.name = name;
  c.capacity = 1 << 20;
  c.threads = threads;
  c.read = BandwidthTable::Constant(read);
  c.write = BandwidthTable::Constant(write);
  return c;
}

// Rates chosen so that every time below is an exact binary fraction or close to it.
SystemModel SimpleModel() {
  SystemModel m;
  m.compute_rate = 1000;                            // 1 s per 1000-byte sample
  m.pfs = BandwidthTable::Constant(500);            // 2 s per sample with one reader
  m.staging = Class("staging", 1e6, 1000, 1);       // write: 1 s per sample
  m.classes.push_back(Class("ram", 3000, 1e6, 1));  // 1/3 s per sample
  return m;
}

NodePlan PlanAll(uint64_t f, int8_t where) {
  NodePlan plan;
  plan.location.assign(f, where);
  return plan;
}

TEST(PredictTest, HandComputedRecurrence) {
  // One rank, one epoch of three 1000-byte samples, p_0 = 1.
  const JobSpec job = Job(3, 1, 3, 1, 1);
  const std::vector<Bytes> sizes(3, 1000);
  // From the PFS: read = 2 + 1 = 3 s per sample, compute 1 s. avail = 3, 6, 9;
  // t = 3, max(6, 4) = 6, max(9, 7) = 9; the last compute ends at 10. Stall 3 + 2 + 2.
  NodePrediction p = PredictNode(job, PlanAll(3, kNotCached), sizes, SimpleModel(), 1, 1);
  EXPECT_DOUBLE_EQ(p.compute_seconds, 3);
  EXPECT_DOUBLE_EQ(p.stall_seconds, 7);
  EXPECT_DOUBLE_EQ(p.total_seconds, 10);
  EXPECT_EQ(p.reads[static_cast<size_t>(SourceKind::kPfs)], 3u);
  EXPECT_EQ(p.bytes[static_cast<size_t>(SourceKind::kPfs)], 3000u);
  EXPECT_EQ(p.reads[static_cast<size_t>(SourceKind::kLocal)], 0u);
  // From RAM: read = 1/3 + 1 = 4/3 s. avail = 4/3, 8/3, 4; t = 4/3, 8/3, 4; end 5; stall 2.
  p = PredictNode(job, PlanAll(3, 0), sizes, SimpleModel(), 1, 1);
  EXPECT_NEAR(p.stall_seconds, 2, 1e-12);
  EXPECT_NEAR(p.total_seconds, 5, 1e-12);
  EXPECT_EQ(p.reads[static_cast<size_t>(SourceKind::kLocal)], 3u);
  // Two staging threads halve the fetch side: avail = 2/3, 4/3, 2; t = 2/3, 5/3, 8/3; end 11/3.
  SystemModel two = SimpleModel();
  two.staging.threads = 2;
  two.staging.write = BandwidthTable::Constant(2000);  // still 1 s per sample and thread
  p = PredictNode(job, PlanAll(3, 0), sizes, two, 1, 1);
  EXPECT_NEAR(p.stall_seconds, 2.0 / 3, 1e-12);
  EXPECT_NEAR(p.total_seconds, 11.0 / 3, 1e-12);
  // An infinitely fast consumer: no compute, the total is when the last sample is staged.
  SystemModel fast = SimpleModel();
  fast.compute_rate = 0;
  p = PredictNode(job, PlanAll(3, kNotCached), sizes, fast, 1, 1);
  EXPECT_EQ(p.compute_seconds, 0);
  EXPECT_DOUBLE_EQ(p.total_seconds, 9);
  EXPECT_DOUBLE_EQ(p.stall_seconds, 9);
}

// The recurrence the slow way: each local rank's RankStream, fetch times from the model's own
// functions.
NodePrediction Reference(const JobSpec& job, const NodePlan& plan, const std::vector<Bytes>& sizes,
                         const SystemModel& m, uint32_t readers) {
  NodePrediction out;
  const double p0 = m.staging.threads;
  for (uint32_t l = 0; l < job.ranks_on_node(plan.node); ++l) {
    RankStream s(job, job.first_rank(plan.node) + l);
    Access a;
    double avail = 0;
    double ready = 0;  // t_{f-1} + s_{f-1}/c
    double stall = 0;
    double compute = 0;
    while (s.Next(&a)) {
      const Bytes size = sizes[a.sample];
      const int8_t loc = plan.location[a.sample];
      const SourceChoice src = ChooseSource(m, size, loc, -1, readers);
      avail += (src.seconds + StagingWriteSeconds(m, size)) / p0;
      const double t = std::max(avail, ready);
      stall += std::max(0.0, avail - ready);
      ready = t + static_cast<double>(size) / m.compute_rate;
      compute += static_cast<double>(size) / m.compute_rate;
      const size_t kind = static_cast<size_t>(src.kind);
      out.reads[kind] += 1;
      out.bytes[kind] += size;
    }
    out.compute_seconds = std::max(out.compute_seconds, compute);
    out.stall_seconds = std::max(out.stall_seconds, stall);
    out.total_seconds = std::max(out.total_seconds, ready);
  }
  return out;
}

SystemModel TwoTierModel() {
  SystemModel m;
  m.compute_rate = 60e6;  // a little slower than a RAM read, faster than the PFS
  m.preprocess_rate = 400e6;
  m.network_bandwidth = 10e9;
  m.pfs = BandwidthTable({{1, 400e6}, {8, 1.6e9}, {64, 3.2e9}});
  m.staging = Class("staging", 20e9, 8e9, 4);
  m.classes.push_back(Class("ram", 16e9, 8e9, 8));
  StorageClass ssd = Class("ssd", 2e9, 1e9, 8);
  ssd.kind = ClassKind::kSsd;
  ssd.path = "/scratch";
  m.classes.push_back(ssd);
  return m;
}

std::vector<Bytes> Sizes(uint64_t f) {
  std::vector<Bytes> s(f);
  SplitMix64 rng(5);
  for (Bytes& b : s)
    b = 20'000 + rng.Bounded(200'000);
  return s;
}

bool Near(double a, double b) {
  return std::fabs(a - b) <= 1e-9 * std::max(1.0, std::fabs(b));
}

TEST(PredictTest, EqualsTheRecurrenceOverEachRanksStream) {
  for (Scheme scheme : {Scheme::kUniform, Scheme::kStrided}) {
    for (bool drop : {false, true}) {
      const JobSpec job = Job(3001, 6, 40, 4, 4, scheme, drop);  // nodes of 4 and 2 ranks
      const std::vector<Bytes> sizes = Sizes(job.samples);
      const SystemModel m = TwoTierModel();
      for (uint32_t node = 0; node < job.nodes(); ++node) {
        SCOPED_TRACE(std::string(SchemeName(scheme)) + " drop " + std::to_string(drop) + " node " +
                     std::to_string(node));
        const NodePlan plan =
            MakeNodePlan(job, node, sizes, std::vector<Bytes>{20'000'000, 60'000'000}, 1);
        // 2 PFS readers: the PFS (t(2)/2 = 286 MB/s) beats the SSD's 250 MB/s per thread, so
        // samples cached on the SSD are read from the PFS; 8 readers (200 MB/s): from the SSD.
        for (uint32_t readers : {2u, 8u}) {
          const NodePrediction got = PredictNode(job, plan, sizes, m, readers, 1);
          const NodePrediction want = Reference(job, plan, sizes, m, readers);
          EXPECT_TRUE(Near(got.compute_seconds, want.compute_seconds));
          EXPECT_TRUE(Near(got.stall_seconds, want.stall_seconds))
              << got.stall_seconds << " vs " << want.stall_seconds;
          EXPECT_TRUE(Near(got.total_seconds, want.total_seconds));
          EXPECT_EQ(got.reads, want.reads);
          EXPECT_EQ(got.bytes, want.bytes);
          EXPECT_EQ(got.reads[static_cast<size_t>(SourceKind::kPeer)], 0u);
          const uint64_t local = got.reads[static_cast<size_t>(SourceKind::kLocal)];
          const uint64_t pfs = got.reads[static_cast<size_t>(SourceKind::kPfs)];
          EXPECT_EQ(local + pfs, plan.accesses);
          EXPECT_EQ(local, plan.tiers[0].accesses + (readers == 8 ? plan.tiers[1].accesses : 0));
          EXPECT_GT(plan.tiers[1].accesses, 0u);
        }
      }
    }
  }
}

TEST(PredictTest, CachingReducesTheStallAndThreadsDoNotChangeTheResult) {
  const JobSpec job = Job(20000, 8, 64, 6, 4);
  const std::vector<Bytes> sizes = Sizes(job.samples);
  SystemModel m = TwoTierModel();
  m.compute_rate = 2e9;  // faster than staging from any source: every read stalls a little
  const NodePlan none = MakeNodePlan(job, 1, sizes, std::vector<Bytes>{}, 1);
  const NodePlan some = MakeNodePlan(job, 1, sizes, std::vector<Bytes>{300'000'000}, 1);
  const NodePrediction a = PredictNode(job, none, sizes, m, 8, 1);
  const NodePrediction b = PredictNode(job, some, sizes, m, 8, 1);
  EXPECT_GT(a.stall_seconds, 0);
  EXPECT_LT(b.stall_seconds, a.stall_seconds);
  EXPECT_DOUBLE_EQ(a.compute_seconds, b.compute_seconds);
  for (unsigned threads : {2u, 3u, 0u}) {
    const NodePrediction c = PredictNode(job, some, sizes, m, 8, threads);
    EXPECT_EQ(c.stall_seconds, b.stall_seconds);  // bit for bit
    EXPECT_EQ(c.total_seconds, b.total_seconds);
    EXPECT_EQ(c.reads, b.reads);
  }
}

TEST(PredictTest, RejectsInconsistentInputs) {
  const JobSpec job = Job(100, 2, 10, 2, 1);
  const std::vector<Bytes> sizes(100, 1000);
  const SystemModel m = SimpleModel();  // one class
  EXPECT_THROW(PredictNode(job, PlanAll(100, 1), sizes, m, 1), std::invalid_argument);
  EXPECT_THROW(PredictNode(job, PlanAll(99, 0), sizes, m, 1), std::invalid_argument);
  EXPECT_THROW(PredictNode(job, PlanAll(100, 0), std::vector<Bytes>(99, 1), m, 1),
               std::invalid_argument);
  NodePlan far = PlanAll(100, 0);
  far.node = 2;
  EXPECT_THROW(PredictNode(job, far, sizes, m, 1), std::out_of_range);
  JobSpec bad = job;
  bad.epochs = 0;
  EXPECT_THROW(PredictNode(bad, PlanAll(100, 0), sizes, m, 1), std::invalid_argument);
}

}  // namespace
}  // namespace nopfs::policy
