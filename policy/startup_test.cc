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
  EXPECT_NEAR(shared.total_seconds,
              shared.root_seconds + shared.walk_seconds + shared.exchange_seconds, 1e-12);
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
}

}  // namespace
}  // namespace nopfs::policy
