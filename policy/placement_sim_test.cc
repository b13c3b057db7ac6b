// Tests of the placement simulation: scenarios whose outcome is known exactly, and the random
// baseline against its closed-form expectation.
#include "policy/placement_sim.h"

#include <gtest/gtest.h>

#include <cmath>

namespace nopfs::policy {
namespace {

constexpr Bytes kGB = 1'000'000'000;

// An empty cluster (no other users), one sweep job at a time, no requeue, no epilog: the only
// randomness is where a job lands.
PlacementSimOptions Quiet(uint32_t nodes) {
  PlacementSimOptions o;
  o.cluster_nodes = nodes;
  o.background_load = 0;
  o.background_max_nodes = 1;
  o.sweep_concurrency = 1;
  o.requeue_probability = 0;
  o.epilog_seconds = 0;
  o.dataset_bytes = 100 * kGB;
  o.ssd_bytes = 1000 * kGB;
  o.keep_quota = 1000 * kGB;
  o.runs = 5;
  return o;
}

PlacementResult Only(const PlacementSimOptions& o, Placement p) {
  const Placement one[] = {p};
  Result<std::vector<PlacementResult>> r = SimulatePlacement(o, one);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? (*r)[0] : PlacementResult{};
}

TEST(PlacementSimTest, OnAnEmptyClusterEverySweepJobAfterTheFirstLandsWarm) {
  const PlacementSimOptions o = Quiet(64);
  for (Placement p : {Placement::kPrefer, Placement::kRequire}) {
    const PlacementResult r = Only(o, p);
    EXPECT_EQ(r.starts, 5u * 32);
    EXPECT_EQ(r.warm_starts, 5u * 31) << PlacementName(p);
    // The first job of each run reads the dataset; the other 31 adopt the whole copy.
    EXPECT_DOUBLE_EQ(r.first_epoch_pfs_bytes, 5.0 * 100 * kGB);
    EXPECT_DOUBLE_EQ(r.SavedShare(), 31.0 / 32);
    EXPECT_EQ(r.wait_mean_seconds, 0);
    EXPECT_EQ(r.wait_p95_seconds, 0);
  }
  const PlacementResult off = Only(o, Placement::kOff);
  EXPECT_LT(off.warm_starts, 5u * 16);
}

TEST(PlacementSimTest, WithoutPlacementJobsLandWarmAsOftenAsRandomPlacementSays) {
  // Job j (j = 1..31) lands on one of N nodes at random; j distinct-or-not draws before it have
  // left copies on N (1 - (1 - 1/N)^j) nodes on average, so it lands warm with that share.
  PlacementSimOptions o = Quiet(64);
  o.runs = 400;
  double expected = 0;
  for (int j = 1; j < 32; ++j)
    expected += 1 - std::pow(1 - 1.0 / 64, j);
  const PlacementResult off = Only(o, Placement::kOff);
  const double per_run = static_cast<double>(off.warm_starts) / o.runs;
  // The count per run has a variance below 31/4: 4 standard errors of the mean of 400 runs.
  EXPECT_NEAR(per_run, expected, 4 * std::sqrt(31.0 / 4 / o.runs));
  EXPECT_NEAR(off.SavedShare(), expected / 32, 4 * std::sqrt(31.0 / 4 / o.runs) / 32);
  EXPECT_EQ(off.wait_mean_seconds, 0);
}

TEST(PlacementSimTest, RequireWaitsForTheWarmNodeWhilePreferRunsElsewhere) {
  // Two nodes; the node a job ran on is in its epilog for a minute when the next job comes.
  PlacementSimOptions o = Quiet(2);
  o.epilog_seconds = 60;
  o.job_sigma = 0;
  o.runs = 1;
  const PlacementResult require = Only(o, Placement::kRequire);
  EXPECT_EQ(require.warm_starts, 31u);
  EXPECT_DOUBLE_EQ(require.wait_mean_seconds, 31.0 * 60 / 32);
  EXPECT_DOUBLE_EQ(require.wait_p95_seconds, 60);
  EXPECT_DOUBLE_EQ(require.sweep_mean_seconds, 32 * o.job_seconds + 31 * 60);
  // prefer: the second job finds no free warm node and takes the other one, cold; from then on
  // the node that finished the job before last is free and warm.
  const PlacementResult prefer = Only(o, Placement::kPrefer);
  EXPECT_EQ(prefer.warm_starts, 30u);
  EXPECT_EQ(prefer.wait_mean_seconds, 0);
  EXPECT_DOUBLE_EQ(prefer.sweep_mean_seconds, 32 * o.job_seconds);
}

TEST(PlacementSimTest, ABusyWarmNodeMakesRequireWaitAndPreferStartAtOnceElsewhere) {
  // n2 holds the user's copy and runs another user's job until 6,600 s.
  PlacementSimOptions o = Quiet(4);
  o.sweep_jobs = 1;
  o.runs = 1;
  o.warm_nodes = {2};
  o.scripted_jobs = {ScriptedJob{.submit = -600, .nodes = 1, .seconds = 7200, .pinned = {2}}};
  const PlacementResult require = Only(o, Placement::kRequire);
  EXPECT_EQ(require.warm_starts, 1u);
  EXPECT_DOUBLE_EQ(require.wait_mean_seconds, 6600);
  EXPECT_DOUBLE_EQ(require.first_epoch_pfs_bytes, 0);
  for (Placement p : {Placement::kPrefer, Placement::kOff}) {
    const PlacementResult r = Only(o, p);
    EXPECT_EQ(r.warm_starts, 0u);
    EXPECT_EQ(r.wait_mean_seconds, 0);
    EXPECT_DOUBLE_EQ(r.first_epoch_pfs_bytes, 100.0 * kGB);
  }
  // Free, n2 draws the job under prefer.
  o.scripted_jobs.clear();
  EXPECT_EQ(Only(o, Placement::kPrefer).warm_starts, 1u);
}

TEST(PlacementSimTest, AMultiNodeJobPrefersOnlyAWholeSetOfWarmNodes) {
  PlacementSimOptions o = Quiet(8);
  o.sweep_jobs = 1;
  o.job_nodes = 2;
  o.runs = 50;
  o.warm_nodes = {3, 5};
  const PlacementResult both = Only(o, Placement::kPrefer);
  EXPECT_EQ(both.warm_starts, 50u);
  EXPECT_DOUBLE_EQ(both.first_epoch_pfs_bytes, 0);
  // One warm node is not enough for --prefer, and require does not wait for a set that does not
  // exist: both run where the scheduler puts them, as without placement.
  o.warm_nodes = {3};
  for (Placement p : {Placement::kPrefer, Placement::kRequire}) {
    const PlacementResult r = Only(o, p);
    EXPECT_EQ(r.warm_starts, 0u);
    EXPECT_EQ(r.wait_mean_seconds, 0);
    // Node 3 is one of the two with probability 1/4; then half the first epoch is local.
    EXPECT_GT(r.SavedShare(), 0.0);
    EXPECT_LT(r.SavedShare(), 0.3);
  }
}

TEST(PlacementSimTest, ARequeuedJobComesBackToWhatItKept) {
  // Half the starts are killed at a random moment: each keeps what its tier held so far, and
  // its restart, like every later job, lands on a warm node.
  PlacementSimOptions o = Quiet(64);
  o.requeue_probability = 0.5;
  o.runs = 20;
  const PlacementResult r = Only(o, Placement::kPrefer);
  EXPECT_GT(r.requeues, 20u * 16);
  EXPECT_EQ(r.starts, 20u * 32 + r.requeues);
  EXPECT_EQ(r.warm_starts, r.starts - 20);
  // A job killed during its first epoch kept only part of the dataset, so the next start on its
  // node reads the rest.
  EXPECT_LT(r.SavedShare(), static_cast<double>(r.starts - 20) / static_cast<double>(r.starts));
  EXPECT_GT(r.SavedShare(), 0.5);
}

TEST(PlacementSimTest, NothingKeptNothingSaved) {
  PlacementSimOptions o = Quiet(16);
  o.keep_quota = 0;
  o.warm_nodes = {1};
  for (Placement p : kAllPlacements) {
    const PlacementResult r = Only(o, p);
    EXPECT_EQ(r.warm_starts, 0u);
    EXPECT_DOUBLE_EQ(r.SavedShare(), 0);
    EXPECT_EQ(r.wait_mean_seconds, 0);
  }
}

TEST(PlacementSimTest, TheQuotaCapsWhatAJobAdopts) {
  PlacementSimOptions o = Quiet(16);
  o.keep_quota = 60 * kGB;  // 60 % of the dataset
  const PlacementResult r = Only(o, Placement::kPrefer);
  EXPECT_EQ(r.warm_starts, 5u * 31);
  EXPECT_NEAR(r.SavedShare(), 31.0 / 32 * 0.6, 1e-12);
}

TEST(PlacementSimTest, CopiesExpireAndSpaceEvictsThem) {
  // Every node warm at time 0 and busy with another user's job until 490 s.
  PlacementSimOptions o = Quiet(4);
  o.sweep_jobs = 1;
  o.runs = 1;
  o.warm_nodes = {0, 1, 2, 3};
  o.scripted_jobs = {ScriptedJob{.submit = -10, .nodes = 4, .seconds = 500, .pinned = {}}};
  EXPECT_EQ(Only(o, Placement::kRequire).warm_starts, 1u);
  o.keep_lifetime = 100;  // gone at 100 s: require no longer waits for anything
  const PlacementResult expired = Only(o, Placement::kRequire);
  EXPECT_EQ(expired.warm_starts, 0u);
  EXPECT_DOUBLE_EQ(expired.wait_mean_seconds, 490);  // the cluster was full until then
  // The other job's SSD grant leaves no room for the copy: evicted when it starts.
  o.keep_lifetime = 0;
  o.ssd_bytes = 150 * kGB;
  o.background_ssd_bytes = 100 * kGB;
  EXPECT_EQ(Only(o, Placement::kRequire).warm_starts, 0u);
  o.background_ssd_bytes = 50 * kGB;  // room for both
  EXPECT_EQ(Only(o, Placement::kRequire).warm_starts, 1u);
}

TEST(PlacementSimTest, OnABusyClusterPreferSavesAndRequireWaits) {
  PlacementSimOptions o;
  o.cluster_nodes = 256;
  o.dataset_bytes = 135 * kGB;
  o.ssd_bytes = 1200 * kGB;
  o.keep_quota = 150 * kGB;
  o.background_ssd_bytes = 300 * kGB;
  o.background_keep_bytes = 120 * kGB;
  o.keep_lifetime = 7 * 86400;
  o.runs = 10;
  const Result<std::vector<PlacementResult>> r = SimulatePlacement(o, kAllPlacements);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const PlacementResult& off = (*r)[0];
  const PlacementResult& prefer = (*r)[1];
  const PlacementResult& require = (*r)[2];
  EXPECT_LT(off.SavedShare(), 0.15);
  EXPECT_GT(prefer.SavedShare(), off.SavedShare() + 0.3);
  EXPECT_GE(require.SavedShare(), prefer.SavedShare());
  EXPECT_GT(require.wait_mean_seconds, prefer.wait_mean_seconds);
  EXPECT_GT(off.requeues, 0u);
  // The same seed gives the same figures; another seed others.
  const Result<std::vector<PlacementResult>> again = SimulatePlacement(o, kAllPlacements);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)[1].first_epoch_pfs_bytes, prefer.first_epoch_pfs_bytes);
  EXPECT_EQ((*again)[2].wait_p95_seconds, require.wait_p95_seconds);
  o.seed = 1;
  const Result<std::vector<PlacementResult>> other = SimulatePlacement(o, kAllPlacements);
  ASSERT_TRUE(other.ok());
  EXPECT_NE((*other)[1].first_epoch_pfs_bytes, prefer.first_epoch_pfs_bytes);
}

TEST(PlacementSimTest, TheTierHoldsWhatTheNodeReads) {
  PlacementSimOptions o = Quiet(8);
  EXPECT_EQ(SweepTierBytes(o), 100 * kGB);
  o.job_nodes = 4;
  o.epochs = 3;
  EXPECT_EQ(SweepTierBytes(o), static_cast<Bytes>(std::ceil(100e9 * (1 - 0.75 * 0.75 * 0.75))));
  o.job_ssd_bytes = 10 * kGB;
  EXPECT_EQ(SweepTierBytes(o), 10 * kGB);
}

TEST(PlacementSimTest, BadOptionsSayWhatToWrite) {
  PlacementSimOptions o = Quiet(4);
  o.job_nodes = 5;
  EXPECT_NE(o.Validate().message().find("write 1..4"), std::string::npos);
  o = Quiet(4);
  o.background_load = 1;
  EXPECT_NE(o.Validate().message().find("[0, 1)"), std::string::npos);
  o = Quiet(4);
  o.warm_nodes = {4};
  EXPECT_FALSE(o.Validate().ok());
  o = Quiet(4);
  o.ssd_bytes = 0;
  EXPECT_FALSE(SimulatePlacement(o, kAllPlacements).ok());
  EXPECT_NE(ParsePlacement("soft").status().message().find("off, prefer or require"),
            std::string::npos);
  EXPECT_EQ(*ParsePlacement("require"), Placement::kRequire);
}

}  // namespace
}  // namespace nopfs::policy
