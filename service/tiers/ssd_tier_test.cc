#include "service/tiers/ssd_tier.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "service/env/local_io.h"
#include "service/tiers/tier_test_util.h"

namespace nopfs::service {
namespace {

using testing::Content;
using testing::FetchContent;
using testing::OpenFdCount;
using testing::PlanOf;
using testing::TempDir;

namespace fs = std::filesystem;

const std::vector<uint64_t> kSizes = {1, 4096, 0, 100000, 4095, 4097, 8192, 12345, 7, 1 << 20};

// Whether files in `dir` can be opened with O_DIRECT.
bool AcceptsDirectIo(const std::string& dir) {
  const std::string p = dir + "/probe";
  const int fd = open(p.c_str(), O_RDWR | O_CREAT | O_DIRECT, 0600);
  if (fd >= 0) close(fd);
  unlink(p.c_str());
  return fd >= 0;
}

struct AlignedBuf {
  explicit AlignedBuf(uint64_t n)
      : size(n),
        p(static_cast<std::byte*>(std::aligned_alloc(4096, (n + 4095) / 4096 * 4096 + 4096))) {}
  ~AlignedBuf() { std::free(p); }
  AlignedBuf(const AlignedBuf&) = delete;
  AlignedBuf& operator=(const AlignedBuf&) = delete;
  std::span<std::byte> span() { return {p, size}; }
  uint64_t size;
  std::byte* p;
};

// Parameter: the scratch base. /var/tmp is normally on a disk file system (O_DIRECT works),
// /dev/shm is tmpfs (O_DIRECT refused: the tier must fall back to buffered I/O).
class SsdTierTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (!fs::is_directory(GetParam())) {
      GTEST_SKIP() << GetParam() << " does not exist here";
    }
    dir_ = std::make_unique<TempDir>(GetParam());
  }
  SsdTierOptions Options(const std::string& job = "job1", bool direct = true) const {
    return SsdTierOptions{dir_->path(), job, "n0", direct};
  }
  std::unique_ptr<SsdTier> MakeFilled(const std::vector<policy::SampleId>& order,
                                      uint64_t max_file = kDefaultSsdFileBytes,
                                      bool direct = true) {
    auto layout = TierLayout::Ssd(PlanOf(order, kSizes), kSizes, max_file);
    EXPECT_TRUE(layout.ok());
    auto tier = SsdTier::Create(Options("job1", direct), std::move(*layout));
    EXPECT_TRUE(tier.ok()) << tier.status().ToString();
    if (!tier.ok()) return nullptr;
    AlignedBuf bounce((*tier)->bounce_bytes());
    for (uint32_t slot = 0; slot < (*tier)->layout().slot_count(); ++slot) {
      EXPECT_TRUE((*tier)->slots().TryBeginFill(slot));
      auto h = (*tier)->Fill(slot, FetchContent, {bounce.p, bounce.size});
      EXPECT_TRUE(h.ok()) << h.status().ToString();
      (*tier)->slots().MarkReady(slot, *h);
    }
    return std::move(*tier);
  }
  std::unique_ptr<TempDir> dir_;
};

TEST_P(SsdTierTest, EveryByteReadBackAlignedAndNot) {
  const std::vector<policy::SampleId> order = {9, 3, 0, 1, 2, 4, 5, 6, 7};
  // Small files so that several data files are used.
  auto tier = MakeFilled(order, 1 << 20);
  ASSERT_TRUE(tier);
  EXPECT_GE(tier->layout().file_count(), 2u);
  // O_DIRECT exactly when the file system accepts it (tmpfs does since Linux 6.6, not before).
  EXPECT_EQ(tier->direct_io(), AcceptsDirectIo(dir_->path())) << GetParam();
  for (policy::SampleId k : order) {
    AlignedBuf a(kSizes[k]);
    ASSERT_TRUE(tier->Read(k, a.span()).ok()) << k;
    const auto want = Content(k, kSizes[k]);
    EXPECT_TRUE(std::equal(want.begin(), want.end(), a.p, a.p + a.size)) << k;
    std::vector<std::byte> u(kSizes[k] + 1);  // unaligned destination: buffered path
    ASSERT_TRUE(tier->Read(k, std::span<std::byte>(u).subspan(1)).ok()) << k;
    EXPECT_TRUE(std::equal(want.begin(), want.end(), u.begin() + 1, u.end())) << k;
  }
  std::vector<std::byte> buf(10);
  EXPECT_EQ(tier->Read(8, buf).code(), StatusCode::kNotFound);
}

// adopt_data: a file of the layout's size becomes the data file with its bytes (renamed, not
// copied); one of another size is left where it is and a new empty data file is made.
TEST_P(SsdTierTest, AdoptDataTakesAFileOfTheRightSizeOnly) {
  const std::vector<policy::SampleId> order = {2, 0, 1};
  auto layout = TierLayout::Ssd(PlanOf(order, kSizes), kSizes);
  ASSERT_TRUE(layout.ok());
  const uint64_t bytes = layout->file_bytes(0);
  const std::string right = dir_->path() + "/right", wrong = dir_->path() + "/wrong";
  {
    std::ofstream(right, std::ios::binary) << std::string(bytes, 'r');
    std::ofstream(wrong, std::ios::binary) << std::string(bytes + 1, 'w');
  }
  SsdTierOptions o = Options("job1");
  o.adopt_data = {wrong};
  auto fresh = SsdTier::Create(o, *layout);
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  EXPECT_FALSE((*fresh)->adopted(0));
  EXPECT_TRUE(fs::exists(wrong));
  ASSERT_TRUE((*fresh)->Destroy().ok());

  o = Options("job2");
  o.adopt_data = {right};
  auto taken = SsdTier::Create(o, std::move(*layout));
  ASSERT_TRUE(taken.ok()) << taken.status().ToString();
  EXPECT_TRUE((*taken)->adopted(0));
  EXPECT_FALSE(fs::exists(right));
  (*taken)->WaitPreallocated();  // allocating the rest keeps the bytes
  std::ifstream in((*taken)->DataPath(0), std::ios::binary);
  const std::string got((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(got, std::string(bytes, 'r'));
  ASSERT_TRUE((*taken)->Destroy().ok());
}

TEST_P(SsdTierTest, BufferedIoWhenDirectDisabled) {
  const std::vector<policy::SampleId> order = {5, 9, 4, 0, 7};
  auto tier = MakeFilled(order, 1 << 20, /*direct=*/false);
  ASSERT_TRUE(tier);
  EXPECT_FALSE(tier->direct_io());
  for (policy::SampleId k : order) {
    AlignedBuf a(kSizes[k]);
    ASSERT_TRUE(tier->Read(k, a.span()).ok()) << k;
    const auto want = Content(k, kSizes[k]);
    EXPECT_TRUE(std::equal(want.begin(), want.end(), a.p, a.p + a.size)) << k;
  }
}

TEST_P(SsdTierTest, CorruptFileByteDetected) {
  auto tier = MakeFilled({3, 9, 7});
  ASSERT_TRUE(tier);
  const SlotExtent e = tier->layout().Extent(tier->layout().SlotOf(9));
  {
    const int fd = open(tier->DataPath(e.file).c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    const char garbage[4] = {'b', 'a', 'd', '!'};
    ASSERT_EQ(pwrite(fd, garbage, 4, static_cast<off_t>(e.offset + 5000)), 4);
    close(fd);
  }
  AlignedBuf a(kSizes[9]);
  const Status s = tier->Read(9, a.span());
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
  EXPECT_NE(s.message().find(tier->DataPath(e.file)), std::string::npos);
  EXPECT_EQ(tier->slots().state(tier->layout().SlotOf(9)), SlotState::kFailed);
  EXPECT_EQ(tier->Read(9, a.span()).code(), StatusCode::kFailedPrecondition);
  AlignedBuf b(kSizes[3]);
  EXPECT_TRUE(tier->Read(3, b.span()).ok());
}

TEST_P(SsdTierTest, TooSmallDiskIsResourceExhaustedAndLeavesNothing) {
  std::vector<uint64_t> huge = {uint64_t{1} << 50, 10};
  auto layout = TierLayout::Ssd(PlanOf({0, 1}, huge), huge);
  ASSERT_TRUE(layout.ok());
  const uint64_t fds = OpenFdCount();
  auto tier = SsdTier::Create(Options(), std::move(*layout));
  ASSERT_FALSE(tier.ok());
  EXPECT_EQ(tier.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(tier.status().message().find(dir_->path()), std::string::npos)
      << tier.status().ToString();
  EXPECT_EQ(OpenFdCount(), fds);
  EXPECT_TRUE(fs::is_empty(dir_->path()));
}

TEST_P(SsdTierTest, DestroyRemovesEverythingAndClosesFds) {
  const uint64_t fds = OpenFdCount();
  std::string dir;
  {
    auto tier = MakeFilled({0, 1, 3, 9}, 1 << 20);
    ASSERT_TRUE(tier);
    dir = tier->dir();
    EXPECT_TRUE(fs::is_directory(dir));
    struct stat st {};
    ASSERT_EQ(stat(dir.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0700u);
    EXPECT_GT(OpenFdCount(), fds);
  }
  EXPECT_FALSE(fs::exists(dir));
  EXPECT_TRUE(fs::is_empty(dir_->path()));  // the per-user directory went too
  EXPECT_EQ(OpenFdCount(), fds);
}

TEST_P(SsdTierTest, StaleDirectoryOfDeadDaemonIsRemovedLiveOneKept) {
  auto live = MakeFilled({1, 3});
  ASSERT_TRUE(live);
  // A crashed daemon: a job directory with an unlocked lock file and a data file.
  const std::string udir = SsdTier::UserDir(dir_->path(), geteuid());
  const std::string dead = udir + "/deadjob.n0";
  fs::create_directory(dead);
  {
    std::FILE* f = std::fopen((dead + "/lock").c_str(), "w");
    ASSERT_TRUE(f);
    std::fclose(f);
  }
  {
    std::FILE* f = std::fopen((dead + "/data.0").c_str(), "w");
    ASSERT_TRUE(f);
    std::fclose(f);
  }
  // The kept area and the sibling registry have no lock file, and are not a job's tier.
  fs::create_directory(udir + "/kept");
  fs::create_directory(udir + "/live");
  auto removed = SsdTier::CleanupStale(dir_->path(), geteuid());
  ASSERT_TRUE(removed.ok()) << removed.status().ToString();
  EXPECT_EQ(*removed, 1u);
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_TRUE(fs::is_directory(live->dir()));
  EXPECT_TRUE(fs::is_directory(udir + "/kept"));
  EXPECT_TRUE(fs::is_directory(udir + "/live"));
  fs::remove(udir + "/kept");
  fs::remove(udir + "/live");
  // A second daemon for the same job and node is refused while the first lives.
  auto layout = TierLayout::Ssd(PlanOf({1}, kSizes), kSizes);
  ASSERT_TRUE(layout.ok());
  auto second = SsdTier::Create(Options(), std::move(*layout));
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(live->Read(1, AlignedBuf(kSizes[1]).span()).ok());
}

TEST_P(SsdTierTest, RejectsBadNames) {
  auto layout = TierLayout::Ssd(PlanOf({1}, kSizes), kSizes);
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(SsdTier::Create(Options("../x"), std::move(*layout)).status().code(),
            StatusCode::kInvalidArgument);
}

// Faults of the local disk, injected under the tier: every failure names the file, fails only its
// slot, and no wrong byte is ever returned as the sample.
TEST_P(SsdTierTest, DiskFaultsFailTheirSlotAndNeverReturnWrongBytes) {
  FaultInjectionLocalIo io(LocalIo::Default());
  // Samples of 1 MiB, 100000, 4097, 8192, 12345 and 4096 bytes.
  const std::vector<policy::SampleId> order = {9, 3, 5, 6, 7, 1};
  auto layout = TierLayout::Ssd(PlanOf(order, kSizes), kSizes, 1 << 20);
  ASSERT_TRUE(layout.ok());
  SsdTierOptions o = Options();
  o.io = &io;
  auto created = SsdTier::Create(o, std::move(*layout));
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  SsdTier& tier = **created;
  AlignedBuf bounce(tier.bounce_bytes());
  auto fill = [&](policy::SampleId k) -> Status {
    const uint32_t slot = tier.layout().SlotOf(k);
    EXPECT_TRUE(tier.slots().TryBeginFill(slot));
    Result<uint64_t> h = tier.Fill(slot, FetchContent, {bounce.p, bounce.size});
    if (!h.ok()) {
      tier.slots().MarkFailed(slot);
      return h.status();
    }
    tier.slots().MarkReady(slot, *h);
    return Status::Ok();
  };
  auto read_ok = [&](policy::SampleId k) {
    AlignedBuf a(kSizes[k]);
    const Status s = tier.Read(k, a.span());
    const auto want = Content(k, kSizes[k]);
    return s.ok() && std::equal(want.begin(), want.end(), a.p, a.p + a.size);
  };
  const std::string data0 = tier.DataPath(0);

  // A full disk, at once and after one block of the sample.
  io.FailWrites(ENOSPC);
  Status s = fill(9);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("writing " + data0), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("No space"), std::string::npos) << s.ToString();
  io.FailWrites(ENOSPC, 4096);
  EXPECT_FALSE(fill(3).ok());
  io.ClearFaults();
  for (const policy::SampleId k : std::vector<policy::SampleId>{5, 6, 7, 1})
    ASSERT_TRUE(fill(k).ok()) << k;
  EXPECT_EQ(tier.Read(9, AlignedBuf(kSizes[9]).span()).code(), StatusCode::kFailedPrecondition);

  // Short reads are completed; slow reads are only slow.
  io.ShortReads(true);
  io.SetDelay(std::chrono::milliseconds(1));
  EXPECT_TRUE(read_ok(7));
  std::vector<std::byte> u(kSizes[6] + 1);  // unaligned: the buffered path
  ASSERT_TRUE(tier.Read(6, std::span<std::byte>(u).subspan(1)).ok());
  const auto want1 = Content(6, kSizes[6]);
  EXPECT_TRUE(std::equal(want1.begin(), want1.end(), u.begin() + 1, u.end()));
  EXPECT_GT(io.short_reads(), 0u);
  io.ClearFaults();

  // A flipped byte is Corruption; an I/O error is that error; each fails its slot for good.
  io.FlipReads(true);
  AlignedBuf a(kSizes[5]);
  s = tier.Read(5, a.span());
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
  EXPECT_GT(io.flipped_reads(), 0u);
  io.ClearFaults();
  io.FailReads(EIO);
  s = tier.Read(1, AlignedBuf(kSizes[1]).span());
  EXPECT_EQ(s.code(), StatusCode::kIoError) << s.ToString();
  EXPECT_NE(s.message().find("slot marked failed"), std::string::npos) << s.ToString();
  io.ClearFaults();
  EXPECT_EQ(tier.slots().state(tier.layout().SlotOf(5)), SlotState::kFailed);
  EXPECT_EQ(tier.slots().state(tier.layout().SlotOf(1)), SlotState::kFailed);
  EXPECT_EQ(tier.Read(1, AlignedBuf(kSizes[1]).span()).code(), StatusCode::kFailedPrecondition);
  // The rest of the tier is untouched.
  EXPECT_TRUE(read_ok(6));
  EXPECT_TRUE(read_ok(7));
}

// ReadIfCached: the bytes when they are in the page cache, Unavailable (nothing marked) when the
// read would wait for the disk, the same checks as Read otherwise.
TEST_P(SsdTierTest, ReadIfCachedReadsThePageCacheAndNeverWaitsForTheDisk) {
  FaultInjectionLocalIo io(LocalIo::Default());
  const std::vector<policy::SampleId> order = {9, 3, 5, 6, 7, 1};
  auto layout = TierLayout::Ssd(PlanOf(order, kSizes), kSizes, 1 << 20);
  ASSERT_TRUE(layout.ok());
  SsdTierOptions o = Options();
  o.io = &io;
  auto created = SsdTier::Create(o, std::move(*layout));
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  SsdTier& tier = **created;
  AlignedBuf bounce(tier.bounce_bytes());
  for (const policy::SampleId k : order) {
    const uint32_t slot = tier.layout().SlotOf(k);
    ASSERT_TRUE(tier.slots().TryBeginFill(slot));
    Result<uint64_t> h = tier.Fill(slot, FetchContent, {bounce.p, bounce.size});
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    tier.slots().MarkReady(slot, *h);
  }
  const auto matches = [](policy::SampleId k, std::span<const std::byte> got) {
    const auto want = Content(k, kSizes[k]);
    return std::equal(want.begin(), want.end(), got.begin(), got.end());
  };
  // tmpfs refuses RWF_NOWAIT, and its files are in memory: ReadIfCached reads them.
  struct statfs fs {};
  ASSERT_EQ(statfs(dir_->path().c_str(), &fs), 0);
  const bool in_memory = fs.f_type == TMPFS_MAGIC;
  if (!in_memory) {
    // Dropped from the page cache: not there, and not waited for.
    for (uint32_t f = 0; f < tier.layout().file_count(); ++f) {
      const int fd = open(tier.DataPath(f).c_str(), O_RDONLY | O_CLOEXEC);
      ASSERT_GE(fd, 0);
      EXPECT_EQ(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
      close(fd);
    }
    std::vector<std::byte> b(kSizes[9]);
    const Status s = tier.ReadIfCached(9, b);
    EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
    EXPECT_EQ(tier.slots().state(tier.layout().SlotOf(9)), SlotState::kReady);
  }
  // A buffered read (unaligned) leaves the bytes in the page cache: then they come at once,
  // aligned destination or not.
  for (const policy::SampleId k : order) {
    std::vector<std::byte> u(kSizes[k] + 1);
    ASSERT_TRUE(tier.Read(k, std::span<std::byte>(u).subspan(1)).ok()) << k;
    std::vector<std::byte> b(kSizes[k]);
    const Status s = tier.ReadIfCached(k, b);
    ASSERT_TRUE(s.ok()) << k << ": " << s.ToString();
    EXPECT_TRUE(matches(k, b)) << k;
    AlignedBuf a(kSizes[k]);
    ASSERT_TRUE(tier.ReadIfCached(k, a.span()).ok()) << k;
    EXPECT_TRUE(matches(k, a.span())) << k;
  }
  // A disk that would make the read wait: Unavailable, the slot still ready, Read still works.
  io.SetDelay(std::chrono::milliseconds(1));
  std::vector<std::byte> b7(kSizes[7]);
  EXPECT_EQ(tier.ReadIfCached(7, b7).code(), StatusCode::kUnavailable);
  EXPECT_EQ(tier.slots().state(tier.layout().SlotOf(7)), SlotState::kReady);
  ASSERT_TRUE(tier.Read(7, b7).ok());
  EXPECT_TRUE(matches(7, b7));
  io.ClearFaults();
  // A short read is not half an answer: Unavailable, and Read completes it (tmpfs: completed).
  io.ShortReads(true);
  std::vector<std::byte> b9(kSizes[9]);
  EXPECT_EQ(tier.ReadIfCached(9, b9).code(),
            in_memory ? StatusCode::kOk : StatusCode::kUnavailable);
  ASSERT_TRUE(tier.Read(9, b9).ok());
  EXPECT_TRUE(matches(9, b9));
  io.ClearFaults();
  // Bytes that fail their checksum are Corruption and fail the slot, as in Read.
  io.FlipReads(true);
  std::vector<std::byte> b5(kSizes[5]);
  EXPECT_EQ(tier.ReadIfCached(5, b5).code(), StatusCode::kCorruption);
  io.ClearFaults();
  EXPECT_EQ(tier.slots().state(tier.layout().SlotOf(5)), SlotState::kFailed);
  EXPECT_EQ(tier.ReadIfCached(5, b5).code(), StatusCode::kFailedPrecondition);
  // Not in the tier, or the wrong size: as Read.
  std::vector<std::byte> ten(10);
  EXPECT_EQ(tier.ReadIfCached(8, ten).code(), StatusCode::kNotFound);
  EXPECT_EQ(tier.ReadIfCached(6, ten).code(), StatusCode::kInvalidArgument);
}

TEST_P(SsdTierTest, PreallocationThatFailsFailsTheFillsOfItsChunksAndLeavesNothing) {
  for (const int err : {ENOSPC, EIO}) {
    SCOPED_TRACE(err);
    FaultInjectionLocalIo io(LocalIo::Default());
    io.FailFallocate(err);
    auto layout = TierLayout::Ssd(PlanOf({0, 1, 3}, kSizes), kSizes);
    ASSERT_TRUE(layout.ok());
    SsdTierOptions o = Options();
    o.io = &io;
    const uint64_t fds = OpenFdCount();
    {
      auto tier = SsdTier::Create(o, std::move(*layout));
      ASSERT_TRUE(tier.ok()) << tier.status().ToString();
      (*tier)->WaitPreallocated();
      EXPECT_EQ((*tier)->allocated_bytes(), 0u);
      AlignedBuf bounce((*tier)->bounce_bytes());
      const uint32_t slot = (*tier)->layout().SlotOf(3);
      ASSERT_TRUE((*tier)->slots().TryBeginFill(slot));
      Result<uint64_t> h = (*tier)->Fill(slot, FetchContent, {bounce.p, bounce.size});
      ASSERT_FALSE(h.ok());
      EXPECT_EQ(h.status().code(), StatusCode::kResourceExhausted) << h.status().ToString();
      EXPECT_NE(h.status().message().find("preallocating"), std::string::npos)
          << h.status().ToString();
      (*tier)->slots().MarkFailed(slot);
      EXPECT_EQ((*tier)->Read(3, AlignedBuf(kSizes[3]).span()).code(),
                StatusCode::kFailedPrecondition);
    }
    EXPECT_EQ(OpenFdCount(), fds);
    EXPECT_TRUE(fs::is_empty(dir_->path()));
  }
}

// A LocalIo whose preallocation waits until opened: Create must not wait for it.
class GatedFallocate final : public LocalIo {
 public:
  ssize_t Pread(int fd, void* dst, size_t n, off_t off) override {
    return LocalIo::Default()->Pread(fd, dst, n, off);
  }
  ssize_t Pwrite(int fd, const void* src, size_t n, off_t off) override {
    return LocalIo::Default()->Pwrite(fd, src, n, off);
  }
  int Fallocate(int fd, off_t off, off_t len) override {
    while (!open_.load())
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    calls_.fetch_add(1);
    return LocalIo::Default()->Fallocate(fd, off, len);
  }
  std::atomic<bool> open_{false};
  std::atomic<uint64_t> calls_{0};
};

TEST_P(SsdTierTest, StartsWithoutAllocatingAndAllocatesEverythingInTheBackground) {
  GatedFallocate io;
  // Two files of several chunks each: 1 MiB samples, 160 MiB files.
  const std::vector<uint64_t> sizes(400, uint64_t{1} << 20);
  std::vector<policy::SampleId> order(sizes.size());
  for (policy::SampleId k = 0; k < order.size(); ++k)
    order[k] = k;
  auto layout = TierLayout::Ssd(PlanOf(order, sizes), sizes, uint64_t{256} << 20);
  ASSERT_TRUE(layout.ok());
  SsdTierOptions o = Options();
  o.io = &io;
  auto tier = SsdTier::Create(o, std::move(*layout));  // returns with the gate still closed
  ASSERT_TRUE(tier.ok()) << tier.status().ToString();
  EXPECT_EQ((*tier)->allocated_bytes(), 0u);
  EXPECT_EQ(io.calls_.load(), 0u);
  io.open_ = true;
  (*tier)->WaitPreallocated();
  uint64_t total = 0;
  for (uint32_t f = 0; f < (*tier)->layout().file_count(); ++f) {
    total += (*tier)->layout().file_bytes(f);
    struct stat st {};
    ASSERT_EQ(stat((*tier)->DataPath(f).c_str(), &st), 0);
    EXPECT_GE(static_cast<uint64_t>(st.st_blocks) * 512, (*tier)->layout().file_bytes(f)) << f;
  }
  EXPECT_GE((*tier)->layout().file_count(), 2u);
  EXPECT_EQ((*tier)->allocated_bytes(), total);
  EXPECT_GE(io.calls_.load(), total / SsdTier::kAllocChunk);
  // Fills after that write into allocated space and read back.
  AlignedBuf bounce((*tier)->bounce_bytes());
  for (const policy::SampleId k : {policy::SampleId{399}, policy::SampleId{0}}) {
    const uint32_t slot = (*tier)->layout().SlotOf(k);
    ASSERT_TRUE((*tier)->slots().TryBeginFill(slot));
    Result<uint64_t> h = (*tier)->Fill(slot, FetchContent, {bounce.p, bounce.size});
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    (*tier)->slots().MarkReady(slot, *h);
    AlignedBuf a(sizes[k]);
    ASSERT_TRUE((*tier)->Read(k, a.span()).ok());
    const auto want = Content(k, sizes[k]);
    EXPECT_TRUE(std::equal(want.begin(), want.end(), a.p, a.p + a.size)) << k;
  }
}

INSTANTIATE_TEST_SUITE_P(Fs, SsdTierTest, ::testing::Values("/var/tmp", "/dev/shm"));

}  // namespace
}  // namespace nopfs::service
