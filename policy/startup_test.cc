// Tests of the start-up model against hand-computed figures.
#include "policy/startup.h"

#include <gtest/gtest.h>

namespace nopfs::policy {
namespace {

TEST(StartupModelTest, SharedScanDividesTheWalkAndCountsEachFileOnce) {
  StartupModel m;
  m.files = 100'000;
  m.classes = 100;
  m.nodes = 4;
  m.scan_threads = 8;
  m.metadata_latency = 0.001;
  m.network_bandwidth = 1e9;
  m.round_latency = 0.001;
  m.path_bytes = 20;
  ASSERT_TRUE(m.Validate().ok());
  const StartupPrediction shared = PredictSharedScan(m);
  const StartupPrediction lone = PredictLoneScans(m);
  // Root: stat + listing + ceil(100 / 8) stats = 2 + 13 ms.
  EXPECT_DOUBLE_EQ(shared.root_seconds, 0.015);
  // Walk: 25 classes of 1,002 operations on 8 threads: ceil(25,050 / 8) ms.
  EXPECT_DOUBLE_EQ(shared.walk_seconds, 3.132);
  EXPECT_DOUBLE_EQ(lone.walk_seconds, 12.525);
  // One stat per file, a stat and a listing per class, the root's, each other node's open.
  EXPECT_EQ(shared.metadata_ops, 2u + 100 + 100'000 + 200 + 3);
  EXPECT_EQ(lone.metadata_ops, 4u * (2 + 100 + 100'000 + 200));
  EXPECT_GT(shared.exchange_seconds, 0.002);
  EXPECT_LT(shared.exchange_seconds, 0.01);
  // The peer link's start comes first: 0.45 s + 3 other nodes x 2 ms (the defaults).
  EXPECT_DOUBLE_EQ(shared.link_seconds, 0.45 + 3 * 0.002);
  // Building the catalog from the parts: 100,000 samples x 0.8 us (the default), alone too.
  EXPECT_DOUBLE_EQ(shared.catalog_seconds, 0.08);
  EXPECT_DOUBLE_EQ(lone.catalog_seconds, 0.08);
  EXPECT_NEAR(shared.total_seconds,
              shared.link_seconds + shared.root_seconds + shared.walk_seconds +
                  shared.exchange_seconds + shared.catalog_seconds,
              1e-12);
  // Scanning alone needs no peers.
  EXPECT_EQ(lone.link_seconds, 0);
  EXPECT_NEAR(lone.total_seconds, lone.root_seconds + lone.walk_seconds + lone.catalog_seconds,
              1e-12);
}

TEST(StartupModelTest, TheLinkCostsItsStartPlusOneHandshakePerOtherNode) {
  StartupModel m;
  m.files = 10'000;
  m.classes = 100;
  m.network_bandwidth = 1e9;
  m.link_start = 0.3;
  m.link_per_peer = 0.004;
  // One node: no peers, no link.
  m.nodes = 1;
  EXPECT_EQ(PredictSharedScan(m).link_seconds, 0);
  m.nodes = 2;
  EXPECT_DOUBLE_EQ(PredictSharedScan(m).link_seconds, 0.304);
  // Each further node adds its handshake, and the total grows with the link (the scan's share
  // shrinks, so compare the link alone and the total minus the scan's terms).
  for (uint32_t nodes : {3u, 64u, 1024u}) {
    m.nodes = nodes;
    const StartupPrediction p = PredictSharedScan(m);
    EXPECT_DOUBLE_EQ(p.link_seconds, 0.3 + 0.004 * (nodes - 1)) << nodes;
    EXPECT_NEAR(
        p.total_seconds - p.root_seconds - p.walk_seconds - p.exchange_seconds - p.catalog_seconds,
        p.link_seconds, 1e-12)
        << nodes;
  }
  // Without a network there is no link either: every node scans alone.
  m.network_bandwidth = 0;
  EXPECT_EQ(PredictSharedScan(m).link_seconds, 0);
}

TEST(StartupModelTest, MoreNodesThanClassesLeaveOneClassPerNode) {
  StartupModel m;
  m.files = 1'281'167;  // ImageNet-1k
  m.classes = 1000;
  m.nodes = 1024;
  m.network_bandwidth = 12.5e9;
  const StartupPrediction p = PredictSharedScan(m);
  // One class of ~1,283 operations on 8 threads.
  EXPECT_DOUBLE_EQ(p.walk_seconds, 0.161);
  // The link's start with 1,023 handshakes is most of the start-up at this scale.
  EXPECT_DOUBLE_EQ(p.link_seconds, 0.45 + 1023 * 0.002);
  EXPECT_GT(p.link_seconds, p.root_seconds + p.walk_seconds + p.exchange_seconds);
  EXPECT_LT(p.total_seconds, 5.0);
}

TEST(StartupModelTest, WithoutANetworkEveryNodeScansAlone) {
  StartupModel m;
  m.files = 1000;
  m.classes = 10;
  m.nodes = 3;
  const StartupPrediction p = PredictSharedScan(m);
  EXPECT_EQ(p.metadata_ops, PredictLoneScans(m).metadata_ops);
  EXPECT_DOUBLE_EQ(p.total_seconds, PredictLoneScans(m).total_seconds);
}

TEST(StartupModelTest, BadModelsSayWhichField) {
  StartupModel m;
  EXPECT_NE(m.Validate().message().find("files"), std::string::npos);
  m.files = 10;
  m.classes = 11;
  EXPECT_NE(m.Validate().message().find("classes"), std::string::npos);
  m.classes = 1;
  m.link_start = -0.1;
  EXPECT_NE(m.Validate().message().find("link start"), std::string::npos);
  m.link_start = 0;
  m.link_per_peer = -1e-3;
  EXPECT_NE(m.Validate().message().find("link per peer"), std::string::npos);
  m.link_per_peer = 0;
  m.catalog_per_sample = -1e-6;
  EXPECT_NE(m.Validate().message().find("catalog per sample"), std::string::npos);
  m.catalog_per_sample = 0;
  EXPECT_TRUE(m.Validate().ok());
}

}  // namespace
}  // namespace nopfs::policy
