// What both sides of the ring share beside its memory: the stall histogram's buckets and summary,
// the ring's size, and the mapping of a RAM tier read in place (Region). The producer is
// RingWriter (ring_writer.cc), the consumer RingReader (ring_reader.cc).
#include "protocol/ring.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <bit>
#include <cstring>

#include "protocol/ring_shared.h"

namespace nopfs::ring {

using shared::SlotTableBytes;

int StallBucket(uint64_t ns) {
  return ns == 0 ? 0 : std::min(63, static_cast<int>(std::bit_width(ns)));
}

void SummarizeStalls(RingStats* stats) {
  uint64_t total = 0;
  for (uint64_t c : stats->histogram)
    total += c;
  stats->stall_ns_median = 0;
  stats->stall_ns_p99 = 0;
  if (total == 0) return;
  auto quantile = [&](uint64_t rank) {  // rank in 1..total
    uint64_t cum = 0;
    for (int b = 0; b < kHistogramBuckets; ++b) {
      cum += stats->histogram[static_cast<size_t>(b)];
      if (cum >= rank) return b == 0 ? uint64_t{0} : uint64_t{1} << b;
    }
    return uint64_t{1} << 63;
  };
  stats->stall_ns_median = quantile((total + 1) / 2);
  stats->stall_ns_p99 = quantile(total - total / 100);
}

uint64_t RingBytes(uint64_t capacity, uint32_t slot_count) {
  return kHeaderBytes + SlotTableBytes(slot_count) + capacity;
}

// ---------------------------------------------------------------------------------------------
// Region

Result<std::shared_ptr<const Region>> Region::Map(int fd, uint64_t bytes) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return Status::FromErrno(errno, "ring: fstat of the region");
  if (bytes == 0 || static_cast<uint64_t>(st.st_size) < bytes) {
    return Status::Corruption("ring: the region is " + std::to_string(st.st_size) +
                              " bytes, the service said " + std::to_string(bytes));
  }
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    return Status::FailedPrecondition("ring: the region is not sealed against shrinking");
  }
  const int dup = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (dup < 0) return Status::FromErrno(errno, "ring: dup of the region's descriptor");
  void* m = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) {
    const int err = errno;
    ::close(dup);
    return Status::FromErrno(err, "ring: mmap of the region");
  }
  std::shared_ptr<Region> r(new Region());
  r->data_ = static_cast<const std::byte*>(m);
  r->bytes_ = bytes;
  r->dev_ = st.st_dev;
  r->ino_ = st.st_ino;
  r->fd_ = dup;
  return std::shared_ptr<const Region>(std::move(r));
}

Region::~Region() {
  if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), bytes_);
  if (fd_ >= 0) ::close(fd_);
}

void Region::Read(const std::byte* at, uint64_t size, std::byte* dst) const {
  const auto offset = static_cast<uint64_t>(at - data_);
  uint64_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd_, dst + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<uint64_t>(n);
  }
  // The file is sealed against shrinking and holds the mapping's bytes, so pread() cannot come
  // short; were it to, the mapping has the rest.
  if (done < size) std::memcpy(dst + done, at + done, size - done);
}

bool Region::Maps(int fd) const {
  struct stat st {};
  return ::fstat(fd, &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_;
}

}  // namespace nopfs::ring
