#include "service/tiers/ram_tier.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#include "service/tiers/tier_test_util.h"

namespace nopfs::service {
namespace {

using testing::Content;
using testing::FetchContent;
using testing::OpenFdCount;
using testing::PlanOf;

const std::vector<uint64_t> kSizes = {1, 4096, 0, 100000, 63, 64, 65, 12345, 7, 1 << 20};

// A stray write by the daemon itself, through its own (the only writable) mapping.
std::byte* DaemonByte(RamTier& tier, uint64_t offset) {
  return const_cast<std::byte*>(tier.mapping().data()) + offset;
}

std::unique_ptr<RamTier> MakeFilled(const std::vector<policy::SampleId>& order) {
  auto layout = TierLayout::Ram(PlanOf(order, kSizes), kSizes);
  EXPECT_TRUE(layout.ok()) << layout.status().ToString();
  auto tier = RamTier::Create("test", std::move(*layout));
  EXPECT_TRUE(tier.ok()) << tier.status().ToString();
  RamTier& t = **tier;
  for (uint32_t slot = 0; slot < t.layout().slot_count(); ++slot) {
    EXPECT_TRUE(t.slots().TryBeginFill(slot));
    auto h = t.Fill(slot, FetchContent, {});
    EXPECT_TRUE(h.ok());
    t.slots().MarkReady(slot, *h);
  }
  return std::move(*tier);
}

TEST(RamTier, EveryByteReadBackAndViewed) {
  const std::vector<policy::SampleId> order = {9, 3, 0, 1, 2, 5, 7};
  auto tier = MakeFilled(order);
  EXPECT_GE(tier->mapped_bytes(), tier->layout().total_bytes());
  for (policy::SampleId k : order) {
    ASSERT_TRUE(tier->IsReady(k));
    std::vector<std::byte> got(kSizes[k]);
    ASSERT_TRUE(tier->Read(k, got).ok()) << k;
    EXPECT_EQ(got, Content(k, kSizes[k])) << k;
    auto view = tier->View(k);
    ASSERT_TRUE(view.ok());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(view->data()) % kRamAlignment, 0u);
    EXPECT_TRUE(std::equal(view->begin(), view->end(), got.begin(), got.end()));
    EXPECT_TRUE(tier->Verify(k).ok());
  }
  // Not held, not ready, wrong size.
  std::vector<std::byte> buf(kSizes[4]);
  EXPECT_EQ(tier->Read(4, buf).code(), StatusCode::kNotFound);
  EXPECT_EQ(tier->View(4).status().code(), StatusCode::kNotFound);
  std::vector<std::byte> small(3);
  EXPECT_EQ(tier->Read(9, small).code(), StatusCode::kInvalidArgument);
}

TEST(RamTier, NotReadyIsFailedPrecondition) {
  auto layout = TierLayout::Ram(PlanOf({1, 3}, kSizes), kSizes);
  ASSERT_TRUE(layout.ok());
  auto tier = RamTier::Create("test", std::move(*layout));
  ASSERT_TRUE(tier.ok());
  std::vector<std::byte> buf(kSizes[1]);
  EXPECT_EQ((*tier)->Read(1, buf).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ((*tier)->WaitReady(1, std::chrono::milliseconds(1)).code(), StatusCode::kTimedOut);
  EXPECT_EQ((*tier)->WaitReady(2, std::chrono::milliseconds(1)).code(), StatusCode::kNotFound);
}

TEST(RamTier, CorruptionDetectedAndSlotFailed) {
  auto tier = MakeFilled({3, 7, 9});
  // Flip one byte of sample 9, as a stray write of the daemon would.
  const SlotExtent e = tier->layout().Extent(tier->layout().SlotOf(9));
  *DaemonByte(*tier, e.offset + 777) ^= std::byte{0x5a};
  std::vector<std::byte> got(kSizes[9]);
  EXPECT_EQ(tier->Read(9, got).code(), StatusCode::kCorruption);
  EXPECT_EQ(tier->slots().state(tier->layout().SlotOf(9)), SlotState::kFailed);
  EXPECT_EQ(tier->WaitReady(9, std::chrono::seconds(1)).code(), StatusCode::kUnavailable);
  // The others are unaffected; a refill repairs the slot.
  EXPECT_TRUE(tier->Verify(7).ok());
  const uint32_t slot = tier->layout().SlotOf(9);
  ASSERT_TRUE(tier->slots().TryBeginFill(slot));
  auto h = tier->Fill(slot, FetchContent, {});
  ASSERT_TRUE(h.ok());
  tier->slots().MarkReady(slot, *h);
  ASSERT_TRUE(tier->Read(9, got).ok());
  EXPECT_EQ(got, Content(9, kSizes[9]));
  // Verify (zero-copy path) detects corruption too.
  *DaemonByte(*tier, e.offset + 777) ^= std::byte{0x5a};
  EXPECT_EQ(tier->Verify(9).code(), StatusCode::kCorruption);
  EXPECT_EQ(tier->slots().state(slot), SlotState::kFailed);
}

// Verify hashes a 1 MiB sample in prefetched steps (common/checksum.h): a flip in any of them,
// the last byte included, fails it.
TEST(RamTier, VerifySeesAFlipAnywhereInALargeSample) {
  for (const uint64_t at : {uint64_t{0}, uint64_t{1024}, uint64_t{524287}, kSizes[9] - 1}) {
    auto tier = MakeFilled({9});
    const SlotExtent e = tier->layout().Extent(tier->layout().SlotOf(9));
    ASSERT_TRUE(tier->Verify(9).ok());
    *DaemonByte(*tier, e.offset + at) ^= std::byte{0x01};
    EXPECT_EQ(tier->Verify(9).code(), StatusCode::kCorruption) << "byte " << at;
  }
}

TEST(RamTier, ReadOnlyFdAndSealedSize) {
  auto tier = MakeFilled({1, 3});
  auto ro = tier->OpenReadOnlyFd();
  ASSERT_TRUE(ro.ok()) << ro.status().ToString();
  std::vector<std::byte> got(kSizes[3]);
  const SlotExtent e = tier->layout().Extent(tier->layout().SlotOf(3));
  ASSERT_EQ(pread(*ro, got.data(), got.size(), static_cast<off_t>(e.offset)),
            static_cast<ssize_t>(got.size()));
  EXPECT_EQ(got, Content(3, kSizes[3]));
  EXPECT_LT(write(*ro, got.data(), 1), 0);
  EXPECT_NE(ftruncate(tier->fd(), 0), 0);  // sealed
  EXPECT_EQ(fcntl(tier->fd(), F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  close(*ro);
}

// A client that reopens its read-only descriptor read-write (as /proc/self/fd/N allows for a
// memfd) gets nothing writable: not write(), not a writable shared mapping, not mprotect of a
// read-only one. The tier's bytes stay intact and the daemon's own mapping still fills slots.
TEST(RamTier, NoWritableViewThroughAReopenedDescriptor) {
  auto tier = MakeFilled({1, 3, 9});
  auto ro = tier->OpenReadOnlyFd();
  ASSERT_TRUE(ro.ok()) << ro.status().ToString();
  const std::string path = "/proc/self/fd/" + std::to_string(*ro);
  const int rw = open(path.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(rw, 0) << "reopening " << path << ": " << std::strerror(errno);
  const SlotExtent e = tier->layout().Extent(tier->layout().SlotOf(3));
  const std::vector<std::byte> junk(4096, std::byte{0xee});

  errno = 0;
  EXPECT_LT(pwrite(rw, junk.data(), junk.size(), static_cast<off_t>(e.offset)), 0);
  EXPECT_EQ(errno, EPERM);
  EXPECT_LT(pwrite(tier->fd(), junk.data(), junk.size(), static_cast<off_t>(e.offset)), 0);

  const size_t bytes = tier->mapped_bytes();
  errno = 0;
  void* w = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0);
  EXPECT_EQ(w, MAP_FAILED);
  EXPECT_EQ(errno, EPERM);
  if (w != MAP_FAILED) {
    std::memset(static_cast<std::byte*>(w) + e.offset, 0xee, e.size);  // what a stray rank did
    munmap(w, bytes);
  }

  void* r = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, rw, 0);
  ASSERT_NE(r, MAP_FAILED) << std::strerror(errno);
  EXPECT_NE(mprotect(r, bytes, PROT_READ | PROT_WRITE), 0);
  munmap(r, bytes);
  close(rw);
  close(*ro);

  for (policy::SampleId k : {1u, 3u, 9u}) {
    std::vector<std::byte> got(kSizes[k]);
    ASSERT_TRUE(tier->Read(k, got).ok()) << k;
    EXPECT_EQ(got, Content(k, kSizes[k])) << k;
  }
  const uint32_t slot = tier->layout().SlotOf(3);
  tier->slots().MarkFailed(slot);
  ASSERT_TRUE(tier->slots().TryBeginFill(slot));
  auto h = tier->Fill(slot, FetchContent, {});
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  tier->slots().MarkReady(slot, *h);
  EXPECT_TRUE(tier->Verify(3).ok());
}

TEST(RamTier, NothingLeftAfterDestruction) {
  const uint64_t fds = OpenFdCount();
  {
    auto tier = MakeFilled({0, 1, 9});
    EXPECT_EQ(OpenFdCount(), fds + 1);
    // memfd: nothing named in /dev/shm.
    for (const auto& ent : std::filesystem::directory_iterator("/dev/shm")) {
      EXPECT_EQ(ent.path().filename().string().find("nopfs-test"), std::string::npos);
    }
  }
  EXPECT_EQ(OpenFdCount(), fds);
}

// Bytes of memory the memfd holds (shmem counts its pages in st_blocks).
uint64_t AllocatedBytes(const RamTier& tier) {
  struct stat st {};
  EXPECT_EQ(fstat(tier.fd(), &st), 0);
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

TEST(RamTier, MemoryIsCommittedChunkByChunkAsSlotsFill) {
  // Ten samples of 10 MiB: 100 MiB, four chunks of 32 MiB (the last one 4 MiB).
  const uint64_t mib = 1 << 20;
  const std::vector<uint64_t> sizes(10, 10 * mib);
  auto layout = TierLayout::Ram(PlanOf({0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, sizes), sizes);
  ASSERT_TRUE(layout.ok());
  auto created = RamTier::Create("test", std::move(*layout));
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  RamTier& t = **created;
  ASSERT_EQ(RamTier::kReserveChunk, 32 * mib);
  // Start-up commits nothing, whatever the size.
  EXPECT_EQ(t.reserved_bytes(), 0u);
  EXPECT_EQ(AllocatedBytes(t), 0u);
  const auto fill = [&t](uint32_t slot) {
    ASSERT_TRUE(t.slots().TryBeginFill(slot));
    auto h = t.Fill(slot, FetchContent, {});
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    t.slots().MarkReady(slot, *h);
  };
  fill(0);  // bytes 0..10 MiB: the first chunk
  EXPECT_EQ(t.reserved_bytes(), 32 * mib);
  EXPECT_EQ(AllocatedBytes(t), 32 * mib);
  fill(9);  // bytes 90..100 MiB: the third and the last chunk, out of order
  EXPECT_EQ(t.reserved_bytes(), 32 * mib + 32 * mib + 4 * mib);
  EXPECT_EQ(AllocatedBytes(t), 68 * mib);
  for (uint32_t slot = 1; slot < 9; ++slot)
    fill(slot);
  EXPECT_EQ(t.reserved_bytes(), t.mapped_bytes());
  EXPECT_EQ(AllocatedBytes(t), t.mapped_bytes());
  for (policy::SampleId k = 0; k < 10; ++k) {
    std::vector<std::byte> got(10 * mib);
    ASSERT_TRUE(t.Read(k, got).ok());
    EXPECT_TRUE(got == Content(k, 10 * mib)) << k;
  }
}

TEST(RamTier, EmptyTier) {
  auto layout = TierLayout::Ram(PlanOf({}, kSizes), kSizes);
  ASSERT_TRUE(layout.ok());
  auto tier = RamTier::Create("test", std::move(*layout));
  ASSERT_TRUE(tier.ok());
  EXPECT_EQ((*tier)->mapped_bytes(), 0u);
}

}  // namespace
}  // namespace nopfs::service
