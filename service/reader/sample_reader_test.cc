// SampleReader against a real catalog (RocksDB over real files) and real RAM and SSD tiers, with
// no prefetcher running: what a staging read does when the tiers are not filled yet.
#include "service/reader/sample_reader.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "service/env/env.h"
#include "service/reader/reader_test_util.h"
#include "service/tiers/tier_test_util.h"

namespace nopfs::service {
namespace {

namespace fs = std::filesystem;
using testing::PlanOf;
using testing::TempDir;

using testing::Bytes;
using testing::kFiles;

policy::SystemModel Model() {
  policy::SystemModel m;
  m.pfs = policy::BandwidthTable::Constant(100e6);
  m.staging.name = "staging";
  m.staging.capacity = 1 << 20;
  m.staging.write = policy::BandwidthTable::Constant(4e9);
  policy::StorageClass ram{"ram",
                           policy::ClassKind::kRam,
                           "",
                           1 << 20,
                           1,
                           policy::BandwidthTable::Constant(6e9),
                           policy::BandwidthTable::Constant(4e9)};
  policy::StorageClass ssd{"ssd",
                           policy::ClassKind::kSsd,
                           "/tmp",
                           1 << 20,
                           1,
                           policy::BandwidthTable::Constant(1e9),
                           policy::BandwidthTable::Constant(800e6)};
  m.classes = {ram, ssd};
  return m;
}

class SampleReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<std::unique_ptr<Catalog>> cat = testing::MakeDatasetAndCatalog(dir_.path());
    ASSERT_TRUE(cat.ok()) << cat.status().message();
    catalog_ = std::move(*cat);
    ASSERT_EQ(catalog_->size(), kFiles);
    const std::vector<uint64_t> sizes(catalog_->sizes().begin(), catalog_->sizes().end());

    // Samples 0..7 belong in RAM, 8..13 on SSD, the rest in no tier.
    plan_.location.assign(kFiles, policy::kNotCached);
    std::vector<policy::SampleId> in_ram, on_ssd;
    for (policy::SampleId k = 0; k < 14; ++k) {
      (k < 8 ? in_ram : on_ssd).push_back(k);
      plan_.location[k] = k < 8 ? 0 : 1;
    }
    plan_.tiers = {PlanOf(in_ram, sizes), PlanOf(on_ssd, sizes)};
    auto rl = TierLayout::Ram(plan_.tiers[0], sizes);
    ASSERT_TRUE(rl.ok());
    auto ram = RamTier::Create("reader-test", std::move(*rl));
    ASSERT_TRUE(ram.ok()) << ram.status().message();
    ram_ = std::move(*ram);
    auto sl = TierLayout::Ssd(plan_.tiers[1], sizes);
    ASSERT_TRUE(sl.ok());
    fs::create_directories(dir_.path() + "/ssd");
    auto ssd =
        SsdTier::Create(SsdTierOptions{dir_.path() + "/ssd", "job1", "n0", true}, std::move(*sl));
    ASSERT_TRUE(ssd.ok()) << ssd.status().message();
    ssd_ = std::move(*ssd);
    model_ = Model();
    reader_ = std::make_unique<SampleReader>(
        *catalog_, plan_,
        std::vector<TierRef>{{"ram", ram_.get(), nullptr}, {"ssd", nullptr, ssd_.get()}}, model_,
        1);
  }

  std::string Read(policy::SampleId k, SourceId* from) {
    std::string out(catalog_->length(k), '\0');
    Result<SourceId> r = reader_->Read(k, {reinterpret_cast<std::byte*>(out.data()), out.size()});
    EXPECT_TRUE(r.ok()) << r.status().message();
    if (r.ok()) *from = *r;
    return out;
  }

  TempDir dir_;
  std::unique_ptr<Catalog> catalog_;
  policy::NodePlan plan_;
  std::unique_ptr<RamTier> ram_;
  std::unique_ptr<SsdTier> ssd_;
  policy::SystemModel model_;
  std::unique_ptr<SampleReader> reader_;
};

TEST_F(SampleReaderTest, FetchAndCacheReadsThePfsOncePerPlannedSample) {
  uint64_t first_pass = 0;
  // Nothing is prefetched: every first read comes from the PFS, and the planned ones stay.
  for (policy::SampleId k = 0; k < kFiles; ++k) {
    SourceId from;
    EXPECT_EQ(Read(k, &from), Bytes(k)) << k;
    EXPECT_EQ(from.index, SourceId::kPfs) << k;
    first_pass += catalog_->length(k);
  }
  EXPECT_EQ(reader_->pfs_bytes_total(), first_pass);
  EXPECT_EQ(reader_->cached_on_read(0).reads.load(), 8u);
  EXPECT_EQ(reader_->cached_on_read(1).reads.load(), 6u);
  for (policy::SampleId k = 0; k < 14; ++k) {
    EXPECT_TRUE(k < 8 ? ram_->IsReady(k) : ssd_->IsReady(k)) << k;
  }

  // The second pass reads the planned samples from their tiers, checked against the hash
  // recorded when staging kept them; only the unplanned ones go to the PFS again.
  uint64_t unplanned = 0;
  for (policy::SampleId k = 0; k < kFiles; ++k) {
    SourceId from;
    EXPECT_EQ(Read(k, &from), Bytes(k)) << k;
    EXPECT_EQ(from.index, k < 8 ? 0 : k < 14 ? 1 : SourceId::kPfs) << k;
    if (k >= 14) unplanned += catalog_->length(k);
  }
  EXPECT_EQ(reader_->pfs_bytes_total(), first_pass + unplanned);
  EXPECT_EQ(reader_->class_counters(0).reads.load(), 8u);
  EXPECT_EQ(reader_->class_counters(1).reads.load(), 6u);
  EXPECT_EQ(reader_->corruptions(), 0u);
}

// verify = "always" re-hashes every RAM hit, copied out or in place, and reads a damaged sample
// again from the PFS; verify = "on_fill" serves the RAM tier's bytes as they lie (the sealed
// memfd is only writable by nopfsd itself): the trade-off docs/tiers.md describes. Here nopfsd's
// own mapping is damaged on purpose, the one way its bytes can change after the fill.
TEST_F(SampleReaderTest, RamHitsAreVerifiedOrNotAsTheConfigSays) {
  for (policy::SampleId k = 0; k < 8; ++k) {
    SourceId from;
    ASSERT_EQ(Read(k, &from), Bytes(k));  // fetch-and-cache fills the RAM tier
  }
  const auto damage = [&](policy::SampleId k) {
    const SlotExtent e = ram_->layout().Extent(ram_->layout().SlotOf(k));
    std::byte* b = const_cast<std::byte*>(ram_->mapping().data()) + e.offset;
    *b ^= std::byte{0x01};
  };
  // always (the reader's default without a config): caught, copied out and in place.
  damage(1);
  damage(2);
  SourceId from;
  EXPECT_EQ(Read(1, &from), Bytes(1));
  EXPECT_EQ(from.index, SourceId::kPfs);
  EXPECT_FALSE(reader_->ReadInPlace(2).has_value());
  EXPECT_EQ(reader_->corruptions(), 2u);
  // on_fill: a hit is served as it lies, copied out or in place, and nothing is counted.
  reader_->set_verify_ram_hits(false);
  damage(3);
  damage(4);
  std::string want = Bytes(3);
  want[0] = static_cast<char>(want[0] ^ 0x01);
  EXPECT_EQ(Read(3, &from), want);
  EXPECT_EQ(from.index, 0);
  const std::optional<SampleReader::InPlace> in_place = reader_->ReadInPlace(4);
  ASSERT_TRUE(in_place.has_value());
  EXPECT_EQ(in_place->size, catalog_->length(4));
  EXPECT_EQ(reader_->corruptions(), 2u);
  // Undamaged samples read the same either way.
  EXPECT_EQ(Read(5, &from), Bytes(5));
  EXPECT_EQ(from.index, 0);
}

// A sample a peer pushed (read from the PFS there first) is kept in its planned tier, RAM or SSD,
// when the slot is empty, so this node never reads it from the PFS; a push that does not match
// (size, xxh3, the catalog's checksum), of an unplanned sample or of a filled slot changes
// nothing.
TEST_F(SampleReaderTest, PushedSamplesAreKeptOnlyInAnEmptyPlannedSlot) {
  auto push = [&](policy::SampleId k, const std::string& bytes, uint64_t xxh3) {
    return reader_->KeepPushed(k, {reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()},
                               xxh3);
  };
  auto hash = [](const std::string& b) { return XXH3_64bits(b.data(), b.size()); };
  EXPECT_TRUE(push(2, Bytes(2), hash(Bytes(2))));      // RAM
  EXPECT_TRUE(push(9, Bytes(9), hash(Bytes(9))));      // SSD
  EXPECT_FALSE(push(2, Bytes(2), hash(Bytes(2))));     // filled already
  EXPECT_FALSE(push(20, Bytes(20), hash(Bytes(20))));  // not planned here
  std::string wrong = Bytes(3);
  wrong[0] = static_cast<char>(wrong[0] ^ 1);
  EXPECT_FALSE(push(3, wrong, hash(Bytes(3))));  // bytes that do not hash to the xxh3 given
  EXPECT_FALSE(push(4, Bytes(4) + "x", hash(Bytes(4) + "x")));  // wrong size
  // Once this node knows a sample's checksum (here from a PFS read that did not keep it), a push
  // must match it; before, the job's own authenticated nodes are believed, as for peer reads.
  std::string five(catalog_->length(5), '\0');
  ASSERT_TRUE(
      reader_->FetchFromPfs(5, {reinterpret_cast<std::byte*>(five.data()), five.size()}, false)
          .ok());
  std::string wrong5 = Bytes(5);
  wrong5[0] = static_cast<char>(wrong5[0] ^ 1);
  EXPECT_FALSE(push(5, wrong5, hash(wrong5)));
  EXPECT_FALSE(ram_->IsReady(3));
  EXPECT_FALSE(ram_->IsReady(4));
  EXPECT_FALSE(ram_->IsReady(5));
  EXPECT_EQ(reader_->pushed_kept(0).reads.load(), 1u);
  EXPECT_EQ(reader_->pushed_kept(1).reads.load(), 1u);
  EXPECT_EQ(reader_->cached_on_read(0).reads.load(), 0u);  // not counted as staging's
  // The kept ones are served from their tiers, checked against the pushed xxh3; no PFS read.
  SourceId from;
  EXPECT_EQ(Read(2, &from), Bytes(2));
  EXPECT_EQ(from.index, 0);
  EXPECT_EQ(Read(9, &from), Bytes(9));
  EXPECT_EQ(from.index, 1);
  EXPECT_EQ(reader_->pfs_bytes_total(), five.size());  // only the read above
}

TEST_F(SampleReaderTest, AFillUnderWayIsWaitedForNotDuplicated) {
  // A prefetcher owns the slot of sample 3 (filling) and finishes a little later: the staging
  // read waits for it and serves the tier's copy; the PFS is read only by the filler.
  const uint32_t slot = ram_->layout().SlotOf(3);
  ASSERT_TRUE(ram_->slots().TryBeginFill(slot));
  std::thread filler([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    Result<uint64_t> h = ram_->Fill(slot,
                                    [&](policy::SampleId k, std::span<std::byte> dst) {
                                      return reader_->FetchFromPfs(k, dst, /*staging=*/false);
                                    },
                                    {});
    ASSERT_TRUE(h.ok());
    ram_->slots().MarkReady(slot, *h);
  });
  SourceId from;
  EXPECT_EQ(Read(3, &from), Bytes(3));
  filler.join();
  EXPECT_EQ(from.index, 0);
  EXPECT_EQ(reader_->pfs_bytes_total(), catalog_->length(3));
  EXPECT_EQ(reader_->cached_on_read(0).reads.load(), 0u);
}

}  // namespace
}  // namespace nopfs::service
