// KeepSsdTier and KeptCopy against a real catalog (RocksDB over real files) and a real SSD tier:
// the round trip, a sample whose file changed, a kept byte flipped, a keeper killed with SIGKILL
// in the middle of its keep, and a disk failing under a keep or an adoption.
#include "service/reader/kept.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "common/unique_fd.h"
#include "kept/finish.h"
#include "service/env/local_io.h"
#include "service/reader/reader_test_util.h"
#include "service/tiers/tier_test_util.h"

namespace nopfs::service {
namespace {

namespace fs = std::filesystem;
using testing::PlanOf;
using testing::TempDir;

using testing::Bytes;
using testing::kFiles;

// Env::Default() whose every Stat first sleeps (a loaded PFS's metadata servers).
class SlowStatEnv final : public Env {
 public:
  explicit SlowStatEnv(std::chrono::milliseconds d) : delay_(d) {}
  Result<FileStat> Stat(const std::string& p) override {
    std::this_thread::sleep_for(delay_);
    return Env::Default()->Stat(p);
  }
  Result<std::vector<std::string>> ListDir(const std::string& d) override {
    return Env::Default()->ListDir(d);
  }
  Status ReadAt(const std::string& p, uint64_t o, std::span<std::byte> dst) override {
    return Env::Default()->ReadAt(p, o, dst);
  }
  Result<std::string> ReadFile(const std::string& p) override {
    return Env::Default()->ReadFile(p);
  }

 private:
  std::chrono::milliseconds delay_;
};

// Disk bytes of the regular files directly in `dir`.
uint64_t DiskBytes(const std::string& dir) {
  uint64_t bytes = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    struct stat st {};
    if (e.is_regular_file() && ::stat(e.path().c_str(), &st) == 0)
      bytes += uint64_t(st.st_blocks) * 512;
  }
  return bytes;
}

class KeptTest : public ::testing::Test {
 protected:
  void SetUp() override {
    data_ = dir_.path() + "/data";
    Result<std::unique_ptr<Catalog>> cat = testing::MakeDatasetAndCatalog(dir_.path());
    ASSERT_TRUE(cat.ok()) << cat.status().message();
    catalog_ = std::move(*cat);
    ASSERT_EQ(catalog_->size(), kFiles);
    scratch_ = dir_.path() + "/ssd";
    fs::create_directories(scratch_);
    place_.kept_dir = kept::KeptAreaDir(SsdTier::UserDir(scratch_, ::geteuid()));
    place_.dataset = data_;
    place_.key = kept::KeptKey(data_, "test");
    place_.tag = "job1.0";
    ssd_ = MakeTier("job1");
  }

  // An SSD tier under `scratch` (default scratch_) holding `samples` (default every sample),
  // filled unless `fill` is false.
  std::unique_ptr<SsdTier> MakeTier(const std::string& job, std::string scratch = "",
                                    std::vector<policy::SampleId> samples = {}, bool fill = true) {
    const std::vector<uint64_t> sizes(catalog_->sizes().begin(), catalog_->sizes().end());
    if (samples.empty()) {
      for (policy::SampleId k = 0; k < kFiles; ++k)
        samples.push_back(k);
    }
    auto layout = TierLayout::Ssd(PlanOf(samples, sizes), sizes);
    EXPECT_TRUE(layout.ok());
    auto t = SsdTier::Create(SsdTierOptions{scratch.empty() ? scratch_ : scratch, job, "0", true},
                             std::move(*layout));
    EXPECT_TRUE(t.ok()) << t.status().message();
    std::unique_ptr<SsdTier> tier = std::move(*t);
    if (fill) FillSlots(*tier, 0, tier->layout().slot_count());
    return tier;
  }

  // Fills slots [begin, end) of `tier` from the dataset and marks them ready.
  void FillSlots(SsdTier& tier, uint32_t begin, uint32_t end) {
    void* bounce = std::aligned_alloc(kSsdAlignment, tier.bounce_bytes());
    for (uint32_t s = begin; s < end; ++s) {
      SsdTier* t = &tier;
      EXPECT_TRUE(t->slots().TryBeginFill(s));
      Result<uint64_t> h =
          t->Fill(s,
                  [this](policy::SampleId id, std::span<std::byte> dst) -> Result<uint64_t> {
                    NOPFS_RETURN_IF_ERROR(catalog_->Read(id, dst));
                    return XXH3_64bits(dst.data(), dst.size());
                  },
                  {static_cast<std::byte*>(bounce), t->bounce_bytes()});
      EXPECT_TRUE(h.ok()) << h.status().message();
      t->slots().MarkReady(s, *h);
    }
    std::free(bounce);
  }

  KeepCommitOptions CommitOptions() const {
    KeepCommitOptions o;
    o.place = place_;
    o.unchanged_before_ns = Options().unchanged_before_ns;
    return o;
  }

  // What root's epilog does for a killed nopfsd's tier <scratch_>/nopfs-<uid>/<job>.0.
  Result<kept::FinishResult> FinishAsTheEpilog(const std::string& job, uint64_t max_bytes = 0) {
    const std::string user_dir = SsdTier::UserDir(scratch_, ::geteuid());
    const UniqueFd ufd(::open(user_dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    EXPECT_TRUE(ufd.valid());
    kept::FinishRequest r;
    r.user_dir_fd = ufd.get();
    r.user_dir = user_dir;
    r.uid = ::geteuid();
    r.tier_name = job + ".0";
    r.dataset = data_;
    r.max_bytes = max_bytes;
    r.now = ::time(nullptr);
    return kept::FinishKept(r);
  }

  // The samples of the kept record in `tier`'s directory (-1: none, or not whole).
  int64_t RecordedSamples(const SsdTier& tier) {
    std::ifstream in(tier.dir() + "/" + kept::kKeepRecordName, std::ios::binary);
    if (!in) return -1;
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    Result<kept::KeepRecord> r = kept::ParseKeepRecord(bytes);
    return r.ok() ? int64_t(r->samples.size()) : -1;
  }

  KeepOptions Options() const {
    KeepOptions o;
    o.place = place_;
    // The files were written just now: every ctime is before "the job's start".
    o.unchanged_before_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count() +
                            10'000'000'000;
    return o;
  }

  std::string Fetch(KeptCopy& k, policy::SampleId id, Status* status) {
    std::string out(catalog_->length(id), '\0');
    Result<uint64_t> h = k.Fetch(id, {reinterpret_cast<std::byte*>(out.data()), out.size()});
    *status = h.status();
    return out;
  }

  TempDir dir_;
  std::string data_, scratch_;
  std::unique_ptr<Catalog> catalog_;
  std::unique_ptr<SsdTier> ssd_;
  KeptPlace place_;
};

TEST_F(KeptTest, KeepThenAdopt) {
  Result<KeepResult> r = KeepSsdTier(Options(), *ssd_, *catalog_, Env::Default());
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->samples, kFiles);
  EXPECT_EQ(r->skipped, 0u);
  EXPECT_EQ(r->dir, place_.kept_dir + "/" + place_.key);
  EXPECT_FALSE(fs::exists(ssd_->DataPath(0)));  // moved, not copied
  ASSERT_TRUE(ssd_->Destroy().ok());
  Result<std::vector<kept::KeptDataset>> l = kept::ListKept(place_.kept_dir);
  ASSERT_TRUE(l.ok());
  ASSERT_EQ(l->size(), 1u);
  EXPECT_TRUE((*l)[0].complete);
  EXPECT_EQ((*l)[0].samples, kFiles);
  EXPECT_EQ((*l)[0].dataset, data_);
  // The listing counts every inode of the entry: its files and its directory's own blocks.
  EXPECT_GE((*l)[0].bytes, r->bytes);
  EXPECT_LE((*l)[0].bytes, r->bytes + 64 * 1024);

  // One file rewritten (same size) after the keep: only that sample is rejected.
  const std::string victim = catalog_->path(5);
  {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.put('\x5a');
  }
  Result<std::unique_ptr<KeptCopy>> k = KeptCopy::Adopt(place_, *catalog_, Env::Default());
  ASSERT_TRUE(k.ok()) << k.status().message();
  EXPECT_EQ((*k)->kept_samples(), kFiles);
  EXPECT_FALSE(fs::exists(r->dir));  // renamed to a private entry
  for (policy::SampleId id = 0; id < kFiles; ++id) {
    Status s;
    const std::string got = Fetch(**k, id, &s);
    if (id == 5) {
      EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.message();
    } else {
      ASSERT_TRUE(s.ok()) << id << ": " << s.message();
      EXPECT_EQ(got, Bytes(id)) << id;
    }
  }
  Status again;
  Fetch(**k, 5, &again);
  EXPECT_EQ(again.code(), StatusCode::kNotFound);
  EXPECT_EQ((*k)->adopted_samples(), kFiles - 1);
  EXPECT_EQ((*k)->rejected_samples(), 1u);
  const std::string adopted_dir = (*k)->dir();
  k->reset();
  EXPECT_FALSE(fs::exists(adopted_dir));
  EXPECT_TRUE(fs::is_empty(place_.kept_dir));
  Result<std::unique_ptr<KeptCopy>> none = KeptCopy::Adopt(place_, *catalog_, Env::Default());
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
}

// Two SSD classes on two scratch directories, each tier holding half of the samples (as nopfsd
// keeps every SSD class): each keeps its half in its own kept area under the same key, and the two
// adopted copies together give back every sample, each from the copy that kept it.
TEST_F(KeptTest, TwoClassesKeepTheirOwnSamplesAndTogetherGiveBackEverySample) {
  ssd_.reset();
  const std::string scratch2 = dir_.path() + "/ssd2";
  fs::create_directories(scratch2);
  std::vector<policy::SampleId> even, odd;
  for (policy::SampleId k = 0; k < kFiles; ++k)
    (k % 2 == 0 ? even : odd).push_back(k);
  std::unique_ptr<SsdTier> tiers[2] = {MakeTier("job1", scratch_, even),
                                       MakeTier("job1", scratch2, odd)};
  KeptPlace places[2] = {place_, place_};
  places[1].kept_dir = kept::KeptAreaDir(SsdTier::UserDir(scratch2, ::geteuid()));
  for (int c = 0; c < 2; ++c) {
    KeepOptions o = Options();
    o.place = places[c];
    Result<KeepResult> r = KeepSsdTier(o, *tiers[c], *catalog_, Env::Default());
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r->samples, (c == 0 ? even : odd).size());
    EXPECT_EQ(r->dir, places[c].kept_dir + "/" + place_.key);
    ASSERT_TRUE(tiers[c]->Destroy().ok());
  }
  std::unique_ptr<KeptCopy> copies[2];
  for (int c = 0; c < 2; ++c) {
    Result<std::unique_ptr<KeptCopy>> k = KeptCopy::Adopt(places[c], *catalog_, Env::Default());
    ASSERT_TRUE(k.ok()) << k.status().message();
    EXPECT_EQ((*k)->kept_samples(), (c == 0 ? even : odd).size());
    copies[c] = std::move(*k);
  }
  for (policy::SampleId id = 0; id < kFiles; ++id) {
    const int owner = id % 2;
    Status s;
    EXPECT_EQ(Fetch(*copies[owner], id, &s), Bytes(id)) << id;
    EXPECT_TRUE(s.ok()) << id << ": " << s.message();
    Fetch(*copies[1 - owner], id, &s);
    EXPECT_EQ(s.code(), StatusCode::kNotFound) << id;
  }
  EXPECT_EQ(copies[0]->adopted_samples() + copies[1]->adopted_samples(), kFiles);
  EXPECT_EQ(copies[0]->rejected_samples() + copies[1]->rejected_samples(), 0u);
}

// The check ahead stats each file once, in the given order; Fetch then takes the checked samples
// without a stat of its own and serves the files' bytes. A file changed after the adoption, before
// the check reaches it, is rejected by the check, and Fetch never serves its kept bytes.
TEST_F(KeptTest, CheckAheadStatsEachFileOnceAndCatchesAFileChangedAfterAdoption) {
  Result<KeepResult> r = KeepSsdTier(Options(), *ssd_, *catalog_, Env::Default());
  ASSERT_TRUE(r.ok()) << r.status().message();
  FaultInjectionEnv env(Env::Default());  // no faults: it counts the stats
  Result<std::unique_ptr<KeptCopy>> k = KeptCopy::Adopt(place_, *catalog_, &env);
  ASSERT_TRUE(k.ok()) << k.status().message();
  {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::fstream f(catalog_->path(7), std::ios::in | std::ios::out | std::ios::binary);
    f.put('\x5a');
  }
  std::vector<policy::SampleId> order;
  for (policy::SampleId id = kFiles; id-- > 0;)
    order.push_back(id);
  (*k)->CheckAhead(order, 4);
  (*k)->WaitChecks();
  EXPECT_EQ(env.stats(), kFiles);
  EXPECT_EQ((*k)->checked_files(), kFiles);
  EXPECT_EQ((*k)->rejected_samples(), 1u);
  for (policy::SampleId id = 0; id < kFiles; ++id) {
    Status s;
    const std::string got = Fetch(**k, id, &s);
    if (id == 7) {
      EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.message();
    } else {
      ASSERT_TRUE(s.ok()) << id << ": " << s.message();
      EXPECT_EQ(got, Bytes(id)) << id;
    }
  }
  EXPECT_EQ(env.stats(), kFiles);  // no stat of Fetch's own
  EXPECT_EQ((*k)->adopted_samples(), kFiles - 1);
  EXPECT_EQ((*k)->rejected_samples(), 1u);
}

// A kept byte flipped on disk is caught by the hash even when the file was checked ahead.
TEST_F(KeptTest, CheckedAheadSampleWithAFlippedByteIsRejected) {
  Result<KeepResult> r = KeepSsdTier(Options(), *ssd_, *catalog_, Env::Default());
  ASSERT_TRUE(r.ok()) << r.status().message();
  const SlotExtent e = ssd_->layout().Extent(ssd_->layout().SlotOf(4));
  {
    std::fstream f(r->dir + "/data." + std::to_string(e.file),
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(e.offset + 1));
    f.put('\x02');
  }
  Result<std::unique_ptr<KeptCopy>> k = KeptCopy::Adopt(place_, *catalog_, Env::Default());
  ASSERT_TRUE(k.ok()) << k.status().message();
  (*k)->CheckAhead({}, 2);
  (*k)->WaitChecks();
  EXPECT_EQ((*k)->rejected_samples(), 0u);
  Status s;
  Fetch(**k, 4, &s);
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.message();
  EXPECT_EQ((*k)->rejected_samples(), 1u);
}

// Release punches the adopted samples' bytes out of the adopted copy (its disk shrinks), only
// those: a sample not adopted yet stays and is still served; a released one is not served again.
TEST_F(KeptTest, ReleaseFreesTheDiskOfAdoptedSamplesOnly) {
  Result<KeepResult> r = KeepSsdTier(Options(), *ssd_, *catalog_, Env::Default());
  ASSERT_TRUE(r.ok()) << r.status().message();
  Result<std::unique_ptr<KeptCopy>> k = KeptCopy::Adopt(place_, *catalog_, Env::Default());
  ASSERT_TRUE(k.ok()) << k.status().message();
  const uint64_t before = DiskBytes((*k)->dir());
  std::vector<policy::SampleId> all;
  for (policy::SampleId id = 0; id < kFiles; ++id) {
    all.push_back(id);
    if (id == 3) continue;  // not adopted yet
    Status s;
    EXPECT_EQ(Fetch(**k, id, &s), Bytes(id)) << id;
    ASSERT_TRUE(s.ok()) << s.message();
  }
  EXPECT_EQ((*k)->Release(all), kFiles - 1);
  EXPECT_EQ((*k)->released_samples(), kFiles - 1);
  // Each released sample's slot is punched out: its bytes and its padding.
  uint64_t slot_bytes = 0;
  for (policy::SampleId id = 0; id < kFiles; ++id)
    if (id != 3)
      slot_bytes += (catalog_->length(id) + kSsdAlignment - 1) / kSsdAlignment * kSsdAlignment;
  EXPECT_EQ((*k)->released_bytes(), slot_bytes);
  const uint64_t after = DiskBytes((*k)->dir());
  // Freed on disk too, less the blocks the file system may add to map the holes (ext4's extent
  // tree).
  ASSERT_GT(slot_bytes, 8 * 4096u);
  EXPECT_LE(after + slot_bytes, before + 2 * 4096) << before << " -> " << after;
  Status s;
  Fetch(**k, 5, &s);
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.message();
  EXPECT_EQ(Fetch(**k, 3, &s), Bytes(3));
  EXPECT_TRUE(s.ok()) << s.message();
  EXPECT_EQ((*k)->rejected_samples(), 0u);
  EXPECT_EQ((*k)->Release(all), 1u);  // 3, adopted just now
}

// A new SSD tier with the kept tier's layout (the same plan) takes the kept data file over: the
// samples whose file is unchanged become ready in it without a read or a copy, and every read of
// the tier still checks the kept xxh3. A changed file's sample stays for the prefetch (its new
// bytes), a flipped kept byte fails the tier's read (the reader then goes to the PFS), and
// Release leaves the taken-over file alone. A tier with another layout takes nothing over.
TEST_F(KeptTest, ATierWithTheSameLayoutTakesTheKeptFileOverInPlace) {
  Result<KeepResult> r = KeepSsdTier(Options(), *ssd_, *catalog_, Env::Default());
  ASSERT_TRUE(r.ok()) << r.status().message();
  const SlotExtent e9 = ssd_->layout().Extent(ssd_->layout().SlotOf(9));
  {
    std::fstream f(r->dir + "/data." + std::to_string(e9.file),
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(e9.offset + 3));
    f.put('\x07');
  }
  ASSERT_TRUE(ssd_->Destroy().ok());
  ssd_.reset();
  {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::fstream f(catalog_->path(6), std::ios::in | std::ios::out | std::ios::binary);
    f.put('\x5a');
  }
  Result<std::unique_ptr<KeptCopy>> k = KeptCopy::Adopt(place_, *catalog_, Env::Default());
  ASSERT_TRUE(k.ok()) << k.status().message();
  const std::vector<uint64_t> sizes(catalog_->sizes().begin(), catalog_->sizes().end());
  std::vector<policy::SampleId> all, reversed;
  for (policy::SampleId id = 0; id < kFiles; ++id)
    all.push_back(id);
  reversed.assign(all.rbegin(), all.rend());

  // Another order, another layout: nothing to take over.
  Result<TierLayout> other = TierLayout::Ssd(PlanOf(reversed, sizes), sizes);
  ASSERT_TRUE(other.ok());
  for (const std::string& f : (*k)->InPlaceFiles(*other))
    EXPECT_EQ(f, "");

  Result<TierLayout> layout = TierLayout::Ssd(PlanOf(all, sizes), sizes);
  ASSERT_TRUE(layout.ok());
  SsdTierOptions so{scratch_, "job2", "0", true};
  so.adopt_data = (*k)->InPlaceFiles(*layout);
  ASSERT_EQ(so.adopt_data.size(), 1u);
  EXPECT_EQ(so.adopt_data[0], (*k)->dir() + "/data.0");
  Result<std::unique_ptr<SsdTier>> t = SsdTier::Create(so, std::move(*layout));
  ASSERT_TRUE(t.ok()) << t.status().message();
  SsdTier& tier = **t;
  EXPECT_TRUE(tier.adopted(0));
  EXPECT_FALSE(fs::exists((*k)->dir() + "/data.0"));  // renamed, not copied
  (*k)->SetInPlaceTier(&tier);
  (*k)->CheckAhead(all, 4);
  (*k)->WaitChecks();
  EXPECT_EQ((*k)->in_place_samples(), kFiles - 1);
  EXPECT_EQ((*k)->adopted_samples(), kFiles - 1);
  EXPECT_EQ((*k)->rejected_samples(), 1u);
  EXPECT_EQ(tier.slots().state(tier.layout().SlotOf(6)), SlotState::kEmpty);
  for (policy::SampleId id = 0; id < kFiles; ++id) {
    if (id == 6) continue;
    ASSERT_EQ(tier.slots().state(tier.layout().SlotOf(id)), SlotState::kReady) << id;
    std::string got(catalog_->length(id), '\0');
    const Status s = tier.Read(id, {reinterpret_cast<std::byte*>(got.data()), got.size()});
    if (id == 9) {
      EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.message();
      EXPECT_EQ(tier.slots().state(tier.layout().SlotOf(id)), SlotState::kFailed);
    } else {
      ASSERT_TRUE(s.ok()) << id << ": " << s.message();
      EXPECT_EQ(got, Bytes(id)) << id;
    }
  }
  // The reader's next source for it is the kept copy: rejected there too, and no longer counted
  // as adopted (no byte of it was served).
  Status s;
  Fetch(**k, 9, &s);
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.message();
  EXPECT_EQ((*k)->adopted_samples(), kFiles - 2);
  EXPECT_EQ((*k)->rejected_samples(), 2u);
  EXPECT_EQ((*k)->Release(all), 0u);  // the tier's own file: nothing punched
  std::string got(catalog_->length(2), '\0');
  ASSERT_TRUE(tier.Read(2, {reinterpret_cast<std::byte*>(got.data()), got.size()}).ok());
  EXPECT_EQ(got, Bytes(2));
  (*k)->StopChecks();
  ASSERT_TRUE(tier.Destroy().ok());
}

// A nopfsd that fails to start after its tier took the kept data file over gives the copy back
// whole: the next adoption serves every sample.
TEST_F(KeptTest, PutBackReturnsTheDataFilesATierTookOver) {
  Result<KeepResult> r = KeepSsdTier(Options(), *ssd_, *catalog_, Env::Default());
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_TRUE(ssd_->Destroy().ok());
  ssd_.reset();
  std::vector<policy::SampleId> all;
  for (policy::SampleId id = 0; id < kFiles; ++id)
    all.push_back(id);
  const std::vector<uint64_t> sizes(catalog_->sizes().begin(), catalog_->sizes().end());
  {
    Result<std::unique_ptr<KeptCopy>> k = KeptCopy::Adopt(place_, *catalog_, Env::Default());
    ASSERT_TRUE(k.ok()) << k.status().message();
    Result<TierLayout> layout = TierLayout::Ssd(PlanOf(all, sizes), sizes);
    ASSERT_TRUE(layout.ok());
    SsdTierOptions so{scratch_, "job2", "0", true};
    so.adopt_data = (*k)->InPlaceFiles(*layout);
    Result<std::unique_ptr<SsdTier>> t = SsdTier::Create(so, std::move(*layout));
    ASSERT_TRUE(t.ok()) << t.status().message();
    ASSERT_TRUE((*t)->adopted(0));
    (*k)->SetInPlaceTier(t->get());
    (*k)->CheckAhead(all, 2);
    (*k)->PutBack();
    ASSERT_TRUE((*t)->Destroy().ok());
  }
  ASSERT_TRUE(fs::exists(r->dir + "/data.0"));
  Result<std::unique_ptr<KeptCopy>> k = KeptCopy::Adopt(place_, *catalog_, Env::Default());
  ASSERT_TRUE(k.ok()) << k.status().message();
  for (policy::SampleId id = 0; id < kFiles; ++id) {
    Status s;
    EXPECT_EQ(Fetch(**k, id, &s), Bytes(id)) << id;
    EXPECT_TRUE(s.ok()) << id << ": " << s.message();
  }
}

std::string FileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A job that keeps nothing borrows the kept copy: it reads every sample from it where it is,
// under the copy's lock (no other job takes it meanwhile, and root counts it as in use), frees
// nothing and lends no data file to its tier; when it is done the copy is still kept, byte for
// byte as it was, with its MANIFEST's last use now, and the next job adopts all of it.
TEST_F(KeptTest, AJobThatKeepsNothingReadsTheCopyAndLeavesItKept) {
  Result<KeepResult> r = KeepSsdTier(Options(), *ssd_, *catalog_, Env::Default());
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_TRUE(ssd_->Destroy().ok());
  ssd_.reset();
  // Kept a while ago.
  Result<kept::KeptManifest> m = kept::ParseKeptManifest(FileBytes(r->dir + "/MANIFEST"));
  ASSERT_TRUE(m.ok()) << m.status().message();
  const int64_t long_ago = ::time(nullptr) - 3600;
  m->created = m->last_used = long_ago;
  ASSERT_TRUE(kept::WriteFileDurably(r->dir, "MANIFEST", kept::EncodeKeptManifest(*m)).ok());
  const std::string index = FileBytes(r->dir + "/index");
  const std::string data = FileBytes(r->dir + "/data.0");
  const uint64_t disk = DiskBytes(r->dir);
  std::vector<policy::SampleId> all;
  for (policy::SampleId id = 0; id < kFiles; ++id)
    all.push_back(id);
  {
    Result<std::unique_ptr<KeptCopy>> k =
        KeptCopy::Adopt(place_, *catalog_, Env::Default(), nullptr, AdoptMode::kBorrow);
    ASSERT_TRUE(k.ok()) << k.status().message();
    EXPECT_TRUE((*k)->borrowed());
    EXPECT_EQ((*k)->dir(), r->dir);  // read where it is
    EXPECT_EQ((*k)->created(), long_ago);
    EXPECT_TRUE(kept::KeptLockHeld(place_.kept_dir, place_.key));
    // Held: another job (that keeps or not) finds nothing to adopt.
    EXPECT_EQ(KeptCopy::Adopt(place_, *catalog_, Env::Default()).status().code(),
              StatusCode::kNotFound);
    EXPECT_EQ(KeptCopy::Adopt(place_, *catalog_, Env::Default(), nullptr, AdoptMode::kBorrow)
                  .status()
                  .code(),
              StatusCode::kNotFound);
    // No data file for a tier of the same layout to take over.
    const std::vector<uint64_t> sizes(catalog_->sizes().begin(), catalog_->sizes().end());
    Result<TierLayout> layout = TierLayout::Ssd(PlanOf(all, sizes), sizes);
    ASSERT_TRUE(layout.ok());
    for (const std::string& f : (*k)->InPlaceFiles(*layout))
      EXPECT_EQ(f, "");
    (*k)->CheckAhead(all, 2);
    for (policy::SampleId id = 0; id < kFiles; ++id) {
      Status s;
      EXPECT_EQ(Fetch(**k, id, &s), Bytes(id)) << id;
      EXPECT_TRUE(s.ok()) << id << ": " << s.message();
    }
    EXPECT_EQ((*k)->adopted_samples(), kFiles);
    // Held in the job's tiers: nothing is punched out of a borrowed copy.
    EXPECT_EQ((*k)->Release(all), 0u);
    EXPECT_EQ(DiskBytes(r->dir), disk);
  }
  EXPECT_FALSE(kept::KeptLockHeld(place_.kept_dir, place_.key));
  Result<std::vector<kept::KeptDataset>> l = kept::ListKept(place_.kept_dir);
  ASSERT_TRUE(l.ok());
  ASSERT_EQ(l->size(), 1u);
  EXPECT_EQ((*l)[0].key, place_.key);
  EXPECT_TRUE((*l)[0].complete);
  EXPECT_EQ((*l)[0].samples, kFiles);
  EXPECT_EQ((*l)[0].created, long_ago);
  EXPECT_GE((*l)[0].last_used, ::time(nullptr) - 60);
  EXPECT_EQ(FileBytes(r->dir + "/index"), index);
  EXPECT_EQ(FileBytes(r->dir + "/data.0"), data);
  // The next job (one that keeps) adopts every sample.
  Result<std::unique_ptr<KeptCopy>> next = KeptCopy::Adopt(place_, *catalog_, Env::Default());
  ASSERT_TRUE(next.ok()) << next.status().message();
  EXPECT_FALSE((*next)->borrowed());
  for (policy::SampleId id = 0; id < kFiles; ++id) {
    Status s;
    EXPECT_EQ(Fetch(**next, id, &s), Bytes(id)) << id;
    EXPECT_TRUE(s.ok()) << id << ": " << s.message();
  }
}

// A job that keeps replaces the copy another job borrows: the borrower's end leaves the new
// entry as it was kept (its MANIFEST is not the borrowed one's).
TEST_F(KeptTest, ACopyKeptAgainWhileBorrowedIsLeftAlone) {
  Result<KeepResult> r = KeepSsdTier(Options(), *ssd_, *catalog_, Env::Default());
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_TRUE(ssd_->Destroy().ok());
  Result<std::unique_ptr<KeptCopy>> k =
      KeptCopy::Adopt(place_, *catalog_, Env::Default(), nullptr, AdoptMode::kBorrow);
  ASSERT_TRUE(k.ok()) << k.status().message();
  // Another job's tier of half the samples, kept over it.
  std::vector<policy::SampleId> half;
  for (policy::SampleId id = 0; id < kFiles / 2; ++id)
    half.push_back(id);
  std::unique_ptr<SsdTier> other = MakeTier("job2", "", half);
  KeepOptions o = Options();
  o.created = 12345;
  Result<KeepResult> again = KeepSsdTier(o, *other, *catalog_, Env::Default());
  ASSERT_TRUE(again.ok()) << again.status().message();
  ASSERT_TRUE(other->Destroy().ok());
  const std::string manifest = FileBytes(r->dir + "/MANIFEST");
  k->reset();
  EXPECT_EQ(FileBytes(r->dir + "/MANIFEST"), manifest);
  Result<std::vector<kept::KeptDataset>> l = kept::ListKept(place_.kept_dir);
  ASSERT_TRUE(l.ok());
  ASSERT_EQ(l->size(), 1u);
  EXPECT_TRUE((*l)[0].complete);
  EXPECT_EQ((*l)[0].samples, kFiles / 2);
  EXPECT_EQ((*l)[0].created, 12345);
}

TEST_F(KeptTest, FlippedKeptByteIsRejected) {
  Result<KeepResult> r = KeepSsdTier(Options(), *ssd_, *catalog_, Env::Default());
  ASSERT_TRUE(r.ok()) << r.status().message();
  const SlotExtent e = ssd_->layout().Extent(ssd_->layout().SlotOf(9));
  {
    std::fstream f(r->dir + "/data." + std::to_string(e.file),
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(e.offset + e.size / 2));
    f.put('\x01');
  }
  Result<std::unique_ptr<KeptCopy>> k = KeptCopy::Adopt(place_, *catalog_, Env::Default());
  ASSERT_TRUE(k.ok()) << k.status().message();
  Status s;
  Fetch(**k, 9, &s);
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.message();
  EXPECT_EQ(Fetch(**k, 8, &s), Bytes(8));
  EXPECT_TRUE(s.ok()) << s.message();
  EXPECT_EQ((*k)->rejected_samples(), 1u);
}

TEST_F(KeptTest, BudgetAndChangedFilesLimitWhatIsKept) {
  KeepOptions o = Options();
  o.max_bytes = 3 * kSsdAlignment;  // the first slots (first access first) that fit
  Result<KeepResult> r = KeepSsdTier(o, *ssd_, *catalog_, Env::Default());
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_GT(r->samples, 0u);
  EXPECT_LT(r->samples, kFiles);
  EXPECT_EQ(r->samples + r->skipped, kFiles);
  EXPECT_LE(r->bytes, o.max_bytes + 2 * 4096);  // + index and MANIFEST
  // A job that started before the files' last change keeps none of them.
  auto tier = MakeTier("job2");
  o = Options();
  o.unchanged_before_ns = 0;
  r = KeepSsdTier(o, *tier, *catalog_, Env::Default());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->samples, 0u);
  EXPECT_EQ(r->skipped, kFiles);
}

TEST_F(KeptTest, KeeperKilledMidKeepLeavesNothingTrusted) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    SlowStatEnv slow(std::chrono::milliseconds(200));
    KeepOptions o = Options();
    o.stat_threads = 1;
    (void)KeepSsdTier(o, *ssd_, *catalog_, &slow);
    ::_exit(0);
  }
  // The child holds its .tmp.keep.* entry's lock while it stats the files (24 × 200 ms).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::string tmp;
  while (tmp.empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    Result<std::vector<kept::KeptDataset>> l = kept::ListKept(place_.kept_dir);
    if (l.ok() && !l->empty() && kept::KeptEntryInUse(place_.kept_dir, (*l)[0].key))
      tmp = (*l)[0].key;
  }
  ASSERT_FALSE(tmp.empty());
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status));

  Result<std::vector<kept::KeptDataset>> l = kept::ListKept(place_.kept_dir);
  ASSERT_TRUE(l.ok());
  ASSERT_EQ(l->size(), 1u);
  EXPECT_EQ((*l)[0].key, tmp);
  EXPECT_FALSE((*l)[0].complete);
  EXPECT_FALSE(kept::KeptEntryInUse(place_.kept_dir, tmp));  // its lock died with it
  EXPECT_EQ(KeptCopy::Adopt(place_, *catalog_, Env::Default()).status().code(),
            StatusCode::kNotFound);
  Result<uint64_t> removed = CleanKeptArea(place_.kept_dir);
  ASSERT_TRUE(removed.ok());
  EXPECT_EQ(*removed, 1u);
  EXPECT_TRUE(fs::is_empty(place_.kept_dir));
  // The tier is still whole: a keep now succeeds.
  Result<KeepResult> r = KeepSsdTier(Options(), *ssd_, *catalog_, Env::Default());
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->samples, kFiles);
}

// The keep's last step, the rename into place, fails: the half-made entry is removed, nothing is
// left to adopt or to clean.
TEST_F(KeptTest, KeepFailingAtItsRenameIntoPlaceLeavesNothingToAdopt) {
  FaultInjectionLocalIo io(LocalIo::Default());
  io.OnlyPaths(place_.key);
  io.FailRename(EIO);
  KeepOptions o = Options();
  o.io = &io;
  Result<KeepResult> r = KeepSsdTier(o, *ssd_, *catalog_, Env::Default());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("renaming"), std::string::npos) << r.status().message();
  EXPECT_EQ(io.failed_calls(), 1u);
  EXPECT_TRUE(fs::is_empty(place_.kept_dir));
  EXPECT_EQ(KeptCopy::Adopt(place_, *catalog_, Env::Default()).status().code(),
            StatusCode::kNotFound);
}

// Reads failing under an adoption: a MANIFEST that cannot be read makes the entry unusable (and
// removed); a kept sample whose bytes cannot be read is rejected, never served, and read from its
// source thereafter.
TEST_F(KeptTest, ReadsFailingUnderAnAdoptionServeNothing) {
  ASSERT_TRUE(KeepSsdTier(Options(), *ssd_, *catalog_, Env::Default()).ok());
  FaultInjectionLocalIo io(LocalIo::Default());
  io.FailReads(EIO);
  Result<std::unique_ptr<KeptCopy>> k = KeptCopy::Adopt(place_, *catalog_, Env::Default(), &io);
  ASSERT_FALSE(k.ok());
  EXPECT_NE(k.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(fs::is_empty(place_.kept_dir));

  auto tier = MakeTier("job2");
  ASSERT_TRUE(KeepSsdTier(Options(), *tier, *catalog_, Env::Default()).ok());
  io.ClearFaults();
  k = KeptCopy::Adopt(place_, *catalog_, Env::Default(), &io);
  ASSERT_TRUE(k.ok()) << k.status().message();
  io.FailReads(EIO);
  Status s;
  Fetch(**k, 3, &s);
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.message();
  io.ClearFaults();
  Fetch(**k, 3, &s);
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.message();
  EXPECT_EQ(Fetch(**k, 4, &s), Bytes(4));
  EXPECT_TRUE(s.ok()) << s.message();
  EXPECT_EQ((*k)->rejected_samples(), 1u);
  EXPECT_EQ((*k)->adopted_samples(), 1u);
}

// nopfsd killed after a commit (no keep at exit): root's finish makes the entry, and the next job
// adopts every sample with its bytes.
TEST_F(KeptTest, ACommittedRecordIsFinishedByTheEpilogAndAdoptedByteForByte) {
  KeepCommitter c(CommitOptions(), *ssd_, *catalog_, Env::Default());
  Result<bool> w = c.Commit(/*force=*/true);
  ASSERT_TRUE(w.ok()) << w.status().message();
  EXPECT_TRUE(*w);
  EXPECT_EQ(c.commits(), 1u);
  EXPECT_EQ(c.committed_samples(), kFiles);
  EXPECT_EQ(RecordedSamples(*ssd_), int64_t(kFiles));
  Result<kept::FinishResult> f = FinishAsTheEpilog("job1");
  ASSERT_TRUE(f.ok()) << f.status().message();
  ASSERT_TRUE(f->found);
  EXPECT_EQ(f->samples, kFiles);
  EXPECT_EQ(f->key, place_.key);
  ssd_.reset();
  Result<std::unique_ptr<KeptCopy>> k = KeptCopy::Adopt(place_, *catalog_, Env::Default());
  ASSERT_TRUE(k.ok()) << k.status().message();
  for (policy::SampleId id = 0; id < kFiles; ++id) {
    Status s;
    EXPECT_EQ(Fetch(**k, id, &s), Bytes(id)) << id;
    EXPECT_TRUE(s.ok()) << id << ": " << s.message();
  }
  EXPECT_EQ((*k)->adopted_samples(), kFiles);
  EXPECT_EQ((*k)->rejected_samples(), 0u);
}

// Records are written in batches: at least min_new_samples new ones and a quarter of those
// written before, or whatever is new once the fill stops.
TEST_F(KeptTest, TheRecordIsCommittedInBatchesAsTheTierFills) {
  auto tier = MakeTier("job2", "", {}, /*fill=*/false);
  KeepCommitOptions o = CommitOptions();
  o.min_new_samples = 4;
  o.quiet = std::chrono::milliseconds(0);
  KeepCommitter c(o, *tier, *catalog_, Env::Default());
  ASSERT_FALSE(*c.Commit(false));  // nothing ready
  EXPECT_EQ(RecordedSamples(*tier), -1);
  FillSlots(*tier, 0, 10);
  ASSERT_TRUE(*c.Commit(false));
  EXPECT_EQ(RecordedSamples(*tier), 10);
  FillSlots(*tier, 10, 11);
  ASSERT_FALSE(*c.Commit(false));  // one new: the fill goes on
  EXPECT_EQ(RecordedSamples(*tier), 10);
  ASSERT_TRUE(*c.Commit(false));  // none became ready since: the fill paused
  EXPECT_EQ(RecordedSamples(*tier), 11);
  FillSlots(*tier, 11, kFiles);
  ASSERT_TRUE(*c.Commit(false));
  EXPECT_EQ(RecordedSamples(*tier), int64_t(kFiles));
  ASSERT_FALSE(*c.Commit(false));
  ASSERT_FALSE(*c.Commit(true));  // nothing new: no rewrite
  EXPECT_EQ(c.commits(), 3u);
  c.Discard();
  EXPECT_EQ(RecordedSamples(*tier), -1);
}

// Woken when the tier's prefetch is done, the thread commits at once, not at its next look.
TEST_F(KeptTest, AWokenCommitterCommitsAtOnce) {
  KeepCommitOptions o = CommitOptions();
  o.interval = std::chrono::hours(1);
  KeepCommitter c(o, *ssd_, *catalog_, Env::Default());
  c.Start();
  c.Wake();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (RecordedSamples(*ssd_) < 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(RecordedSamples(*ssd_), int64_t(kFiles));
  c.Stop();
  EXPECT_EQ(c.commits(), 1u);
}

// The same rules as a keep at exit: files changed since the job's start are never recorded, and
// the budget bounds the record.
TEST_F(KeptTest, TheRecordHoldsOnlyUnchangedFilesWithinTheBudget) {
  KeepCommitOptions o = CommitOptions();
  o.unchanged_before_ns = 0;
  {
    KeepCommitter c(o, *ssd_, *catalog_, Env::Default());
    ASSERT_FALSE(*c.Commit(true));
    EXPECT_EQ(RecordedSamples(*ssd_), -1);
  }
  o = CommitOptions();
  o.max_bytes = 3 * kSsdAlignment;
  KeepCommitter c(o, *ssd_, *catalog_, Env::Default());
  ASSERT_TRUE(*c.Commit(true));
  const int64_t n = RecordedSamples(*ssd_);
  EXPECT_GT(n, 0);
  EXPECT_LT(n, int64_t(kFiles));
  // Root applies its own grant again, below nopfsd's.
  Result<kept::FinishResult> f = FinishAsTheEpilog("job1", kSsdAlignment);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->samples, 1u);
  EXPECT_EQ(f->dropped, uint64_t(n - 1));
}

// The record stays within the size root reads: the samples whose index entries do not fit are
// not recorded, and the epilog finishes the record it gets.
TEST_F(KeptTest, TheRecordStaysWithinTheSizeRootReads) {
  const TierLayout& layout = ssd_->layout();
  uint64_t five = 0;
  for (uint32_t s = 0; s < 5; ++s)
    five += kept::KeptIndexEntryBytes(catalog_->relative_path(layout.SampleAt(s)).size());
  KeepCommitOptions o = CommitOptions();
  o.max_record_bytes = kept::kKeepRecordOverheadBytes + five;
  KeepCommitter c(o, *ssd_, *catalog_, Env::Default());
  ASSERT_TRUE(*c.Commit(true));
  EXPECT_EQ(RecordedSamples(*ssd_), 5);
  EXPECT_LE(fs::file_size(ssd_->dir() + "/" + kept::kKeepRecordName), o.max_record_bytes);
  Result<kept::FinishResult> f = FinishAsTheEpilog("job1");
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->samples, 5u);
}

// nopfsd killed with SIGKILL at moments spread over its fill, its committer running: each time
// the epilog either keeps a whole record, whose every sample the next job adopts with its bytes,
// or keeps nothing.
TEST_F(KeptTest, KilledAnyTimeWhileFillingLeavesAnAdoptableEntryOrNothing) {
  uint64_t kept_runs = 0;
  for (int delay_ms : {0, 15, 40, 90, 160, 400}) {
    SCOPED_TRACE(delay_ms);
    const std::string job = "kill" + std::to_string(delay_ms);
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      auto tier = MakeTier(job, "", {}, /*fill=*/false);
      KeepCommitOptions o = CommitOptions();
      o.min_new_samples = 1;
      o.interval = std::chrono::milliseconds(3);
      o.quiet = std::chrono::milliseconds(0);
      KeepCommitter c(o, *tier, *catalog_, Env::Default());
      c.Start();
      for (uint32_t s = 0; s < kFiles; ++s) {
        FillSlots(*tier, s, s + 1);
        std::this_thread::sleep_for(std::chrono::milliseconds(8));
      }
      std::this_thread::sleep_for(std::chrono::seconds(30));  // killed before
      ::_exit(0);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    ASSERT_EQ(::kill(child, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status));
    Result<kept::FinishResult> f = FinishAsTheEpilog(job);
    if (!f.ok() || !f->found) {
      Result<std::unique_ptr<KeptCopy>> none = KeptCopy::Adopt(place_, *catalog_, Env::Default());
      EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
      continue;
    }
    ++kept_runs;
    Result<std::unique_ptr<KeptCopy>> k = KeptCopy::Adopt(place_, *catalog_, Env::Default());
    ASSERT_TRUE(k.ok()) << k.status().message();
    EXPECT_EQ((*k)->kept_samples(), f->samples);
    for (policy::SampleId id = 0; id < kFiles; ++id) {
      Status s;
      const std::string got = Fetch(**k, id, &s);
      if (s.ok()) {
        EXPECT_EQ(got, Bytes(id)) << id;
      }
    }
    EXPECT_EQ((*k)->adopted_samples(), f->samples);
    EXPECT_EQ((*k)->rejected_samples(), 0u);
  }
  EXPECT_GT(kept_runs, 0u);  // the later kills find a record
}

}  // namespace
}  // namespace nopfs::service
