#include "policy/model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace nopfs::policy {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

void ExpectMessage(const Status& s, const std::vector<std::string>& words) {
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  for (const std::string& w : words) {
    EXPECT_NE(s.message().find(w), std::string::npos) << "'" << w << "' not in: " << s.message();
  }
}

TEST(BandwidthTableTest, InterpolatesAndClamps) {
  const BandwidthTable t({{1, 100}, {2, 300}, {4, 500}, {8, 400}});
  ASSERT_TRUE(t.Validate().ok());
  EXPECT_DOUBLE_EQ(t.At(0), 100);  // below the first point: clamped
  EXPECT_DOUBLE_EQ(t.At(1), 100);
  EXPECT_DOUBLE_EQ(t.At(1.5), 200);  // halfway up the first segment
  EXPECT_DOUBLE_EQ(t.At(2), 300);    // exactly on a point
  EXPECT_DOUBLE_EQ(t.At(3), 400);
  EXPECT_DOUBLE_EQ(t.At(6), 450);  // a falling segment
  EXPECT_DOUBLE_EQ(t.At(8), 400);
  EXPECT_DOUBLE_EQ(t.At(1000), 400);  // above the last point: clamped
  EXPECT_DOUBLE_EQ(t.At(kNaN), 100);
}

TEST(BandwidthTableTest, SinglePointConstantAndEmpty) {
  const BandwidthTable one({{16, 7e9}});
  EXPECT_DOUBLE_EQ(one.At(1), 7e9);
  EXPECT_DOUBLE_EQ(one.At(64), 7e9);
  const BandwidthTable c = BandwidthTable::Constant(2.5e9);
  EXPECT_TRUE(c.Validate().ok());
  EXPECT_DOUBLE_EQ(c.At(0), 2.5e9);
  EXPECT_DOUBLE_EQ(c.At(1e6), 2.5e9);
  const BandwidthTable empty;
  EXPECT_TRUE(empty.empty());
  EXPECT_DOUBLE_EQ(empty.At(3), 0);
  ExpectMessage(empty.Validate(), {"no point"});
}

TEST(BandwidthTableTest, ValidateNamesThePoint) {
  ExpectMessage(BandwidthTable({{1, 10}, {1, 20}}).Validate(), {"point 2", "larger than"});
  ExpectMessage(BandwidthTable({{2, 10}, {1, 20}}).Validate(), {"point 2", "increasing x"});
  ExpectMessage(BandwidthTable({{-1, 10}}).Validate(), {"point 1", ">= 0"});
  ExpectMessage(BandwidthTable({{kNaN, 10}}).Validate(), {"point 1"});
  ExpectMessage(BandwidthTable({{1, 10}, {2, 0}}).Validate(), {"point 2", "> 0 bytes/s"});
  ExpectMessage(BandwidthTable({{1, kInf}}).Validate(), {"point 1", "finite"});
  ExpectMessage(BandwidthTable({{1, -5}}).Validate(), {"point 1"});
}

StorageClass Ram(const std::string& name, double read, double write, uint32_t threads = 1) {
  StorageClass c;
  c.name = name;
  c.kind = ClassKind::kRam;
  c.capacity = 1 << 30;
  c.threads = threads;
  c.read = BandwidthTable::Constant(read);
  c.write = BandwidthTable::Constant(write);
  return c;
}

SystemModel Model() {
  SystemModel m;
  m.compute_rate = 1e9;
  m.preprocess_rate = 0;
  m.network_bandwidth = 1e9;
  m.pfs = BandwidthTable({{1, 1e9}, {4, 2e9}, {16, 4e9}});
  m.staging = Ram("staging", 20e9, 8e9, 4);
  m.classes.push_back(Ram("ram", 16e9, 8e9, 8));    // 2e9 per thread
  StorageClass ssd = Ram("ssd", 3.2e9, 1.6e9, 32);  // 1e8 per thread
  ssd.kind = ClassKind::kSsd;
  ssd.path = "/local/nopfs";
  m.classes.push_back(ssd);
  return m;
}

TEST(SystemModelTest, ValidateNamesTheClassAndTheField) {
  EXPECT_TRUE(Model().Validate().ok()) << Model().Validate().message();
  SystemModel m = Model();
  m.classes[1].write = BandwidthTable({{1, 5}, {1, 6}});
  ExpectMessage(m.Validate(), {"class 2 (\"ssd\")", "write", "point 2"});
  m = Model();
  m.classes[0].threads = 0;
  ExpectMessage(m.Validate(), {"class 1 (\"ram\")", "threads"});
  m = Model();
  m.classes[1].path.clear();
  ExpectMessage(m.Validate(), {"class 2 (\"ssd\")", "path", "directory"});
  m = Model();
  m.classes[0].path = "/tmp";
  ExpectMessage(m.Validate(), {"class 1 (\"ram\")", "path"});
  m = Model();
  m.classes[1].name = "ram";
  ExpectMessage(m.Validate(), {"class 2 (\"ram\")", "earlier class"});
  m = Model();
  m.classes[0].name.clear();
  ExpectMessage(m.Validate(), {"class 1", "name"});
  m = Model();
  m.staging.capacity = 0;
  ExpectMessage(m.Validate(), {"staging", "capacity"});
  m = Model();
  m.staging.read = BandwidthTable();  // optional for the staging buffer
  EXPECT_TRUE(m.Validate().ok());
  m.staging.write = BandwidthTable();
  ExpectMessage(m.Validate(), {"staging", "write", "no point"});
  m = Model();
  m.pfs = BandwidthTable();
  ExpectMessage(m.Validate(), {"pfs", "no point"});
  m = Model();
  m.compute_rate = -1;
  ExpectMessage(m.Validate(), {"compute_rate", "infinitely fast"});
  m = Model();
  m.network_bandwidth = kNaN;
  ExpectMessage(m.Validate(), {"network_bandwidth", "no reads from peers"});
  m = Model();
  m.preprocess_rate = kInf;
  ExpectMessage(m.Validate(), {"preprocess_rate"});
  m = Model();
  m.classes.resize(128, m.classes[0]);
  for (size_t j = 0; j < m.classes.size(); ++j)
    m.classes[j].name = std::string("c").append(std::to_string(j));
  ExpectMessage(m.Validate(), {"127"});
}

TEST(ModelTest, FetchTimes) {
  const SystemModel m = Model();
  // PFS: t(gamma)/gamma per reader; t(4) = 2e9 -> 5e8 per reader; t(10) = 3e9 -> 3e8.
  EXPECT_DOUBLE_EQ(PfsSeconds(m, 1'000'000, 4), 1e6 / 5e8);
  EXPECT_DOUBLE_EQ(PfsSeconds(m, 1'000'000, 10), 1e6 / 3e8);
  EXPECT_DOUBLE_EQ(PfsSeconds(m, 1'000'000, 0), PfsSeconds(m, 1'000'000, 1));
  EXPECT_DOUBLE_EQ(PfsSeconds(m, 0, 4), 0);
  // Local: r(p)/p per thread.
  EXPECT_DOUBLE_EQ(LocalSeconds(m.classes[0], 2'000'000), 1e-3);
  EXPECT_DOUBLE_EQ(LocalSeconds(m.classes[1], 1'000'000), 1e-2);
  // Peer: the slower of the network and the peer's per-thread read.
  EXPECT_DOUBLE_EQ(PeerSeconds(m, m.classes[0], 1'000'000), 1e-3);  // network 1e9 < 2e9
  EXPECT_DOUBLE_EQ(PeerSeconds(m, m.classes[1], 1'000'000), 1e-2);  // ssd 1e8 < 1e9
  SystemModel no_net = m;
  no_net.network_bandwidth = 0;
  EXPECT_EQ(PeerSeconds(no_net, m.classes[0], 1), kInf);
  // Staging write: max(s/beta, s/(w_0(p_0)/p_0)); w_0 = 8e9 over 4 threads = 2e9.
  EXPECT_DOUBLE_EQ(StagingWriteSeconds(m, 2'000'000), 1e-3);
  SystemModel prep = m;
  prep.preprocess_rate = 1e9;
  EXPECT_DOUBLE_EQ(StagingWriteSeconds(prep, 2'000'000), 2e-3);
  prep.preprocess_rate = 4e9;
  EXPECT_DOUBLE_EQ(StagingWriteSeconds(prep, 2'000'000), 1e-3);
}

TEST(ModelTest, ChooseSourcePicksTheFastestAndBreaksTiesInOrder) {
  SystemModel m = Model();
  const Bytes s = 1'000'000;
  // Nothing cached anywhere: the PFS.
  SourceChoice c = ChooseSource(m, s, -1, -1, 4);
  EXPECT_EQ(c.kind, SourceKind::kPfs);
  EXPECT_EQ(c.klass, -1);
  EXPECT_DOUBLE_EQ(c.seconds, PfsSeconds(m, s, 4));
  // Local RAM beats everything here.
  c = ChooseSource(m, s, 0, 0, 4);
  EXPECT_EQ(c.kind, SourceKind::kLocal);
  EXPECT_EQ(c.klass, 0);
  EXPECT_DOUBLE_EQ(c.seconds, 5e-4);
  // Local SSD (1e8 per thread) loses to a peer's RAM over the network (1e9) and to the PFS (5e8).
  c = ChooseSource(m, s, 1, 0, 4);
  EXPECT_EQ(c.kind, SourceKind::kPeer);
  EXPECT_EQ(c.klass, 0);
  c = ChooseSource(m, s, 1, -1, 4);
  EXPECT_EQ(c.kind, SourceKind::kPfs);
  // With many readers the PFS per reader falls below the SSD: 4e9/64 = 6.25e7 < 1e8.
  c = ChooseSource(m, s, 1, -1, 64);
  EXPECT_EQ(c.kind, SourceKind::kLocal);
  EXPECT_EQ(c.klass, 1);
  // Ties: local over peer over PFS. Make all three 1e9 bytes/s.
  m.classes[0] = Ram("ram", 1e9, 1e9, 1);
  m.pfs = BandwidthTable::Constant(1e9);
  c = ChooseSource(m, s, 0, 0, 1);
  EXPECT_EQ(c.kind, SourceKind::kLocal);
  c = ChooseSource(m, s, -1, 0, 1);
  EXPECT_EQ(c.kind, SourceKind::kPeer);
  // A class the model does not have is a caller's bug.
  EXPECT_THROW(ChooseSource(m, s, 2, -1, 1), std::out_of_range);
  EXPECT_THROW(ChooseSource(m, s, -1, 7, 1), std::out_of_range);
  EXPECT_STREQ(SourceKindName(SourceKind::kPeer), "peer");
}

TEST(ModelTest, PeerPresumedReady) {
  // Entry 100 of a peer's list is presumed there once this node has prefetched past 120.
  EXPECT_FALSE(PeerPresumedReady(120, 100, false));
  EXPECT_TRUE(PeerPresumedReady(121, 100, false));
  EXPECT_TRUE(PeerPresumedReady(0, 100, true));  // the peer said the class is complete
  EXPECT_FALSE(PeerPresumedReady(0, 0, false));
  EXPECT_TRUE(PeerPresumedReady(1, 0, false, 0));
  EXPECT_FALSE(PeerPresumedReady(UINT64_MAX, UINT64_MAX - 5, false));  // no overflow
  EXPECT_TRUE(PeerPresumedReady(UINT64_MAX, UINT64_MAX - 21, false));
  EXPECT_EQ(kDefaultReadinessMargin, 20u);
}

}  // namespace
}  // namespace nopfs::policy
