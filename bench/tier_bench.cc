// nopfs_tier_bench: what the cache tiers' read paths cost against the raw operation they wrap.
//
//   nopfs_tier_bench [--dir /var/tmp] [--mib 64] [--rounds 3] [--startup-mib 1024]
//
// For samples of 4 KiB, 128 KiB and 4 MiB (`--mib` MiB of samples per size):
//  - SSD: an SsdTier under --dir, filled by a 2-thread Prefetcher, read sample by sample with
//    SsdTier::Read (aligned destination, checksum verified) against a raw pread loop over the same
//    data files, with the same block (each sample's padded size) and the same O_DIRECT mode;
//  - RAM: RamTier::Read (copy-out, checksum verified) against a plain memcpy of the same bytes
//    out of the same mapping.
// Each figure is the best of --rounds passes, printed in GB/s and as a ratio to its baseline of
// the same run (ratio < 1: the tier is slower).
// Then the RAM tier's start-up: RamTier::Create of --startup-mib MiB (memory committed later,
// chunk by chunk, as slots fill) and filling it with 128 KiB samples by memcpy, against
// committing the whole memfd up front (posix_fallocate + MAP_POPULATE) and the same fill.
// A benchmark prints figures; it never fails.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "service/tiers/prefetcher.h"
#include "service/tiers/ram_tier.h"
#include "service/tiers/ssd_tier.h"

namespace {

using nopfs::service::FetchFn;
using nopfs::service::Prefetcher;
using nopfs::service::RamTier;
using nopfs::service::SsdTier;
using nopfs::service::SsdTierOptions;
using nopfs::service::TierLayout;
namespace policy = nopfs::policy;

nopfs::Result<uint64_t> Fetch(policy::SampleId k, std::span<std::byte> dst) {
  for (uint64_t j = 0; j < dst.size(); ++j)
    dst[j] = static_cast<std::byte>((k * 131 + j) & 0xff);
  return XXH3_64bits(dst.data(), dst.size());
}

// Best wall time in seconds of `rounds` calls of f.
double Best(int rounds, const std::function<void()>& f) {
  double best = 1e300;
  for (int r = 0; r < rounds; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

void Die(const nopfs::Status& s) {
  std::fprintf(stderr, "tier_bench: %s\n", s.ToString().c_str());
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "/var/tmp";
  uint64_t mib = 64;
  int rounds = 3;
  uint64_t startup_mib = 1024;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--dir")
      dir = argv[i + 1];
    else if (a == "--mib")
      mib = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--rounds")
      rounds = std::atoi(argv[i + 1]);
    else if (a == "--startup-mib")
      startup_mib = std::strtoull(argv[i + 1], nullptr, 10);
  }
  std::printf("%-6s %-4s %10s %10s %8s  %s\n", "tier", "size", "tier GB/s", "base GB/s", "ratio",
              "baseline");
  for (const uint64_t size : {uint64_t{4} << 10, uint64_t{128} << 10, uint64_t{4} << 20}) {
    const uint64_t n = std::max<uint64_t>(1, (mib << 20) / size);
    std::vector<uint64_t> sizes(n, size);
    policy::TierPlan plan;
    for (uint64_t k = 0; k < n; ++k)
      plan.prefetch_order.push_back(k);
    plan.bytes = n * size;
    const double gb = static_cast<double>(n * size) / 1e9;

    // SSD.
    {
      auto layout = TierLayout::Ssd(plan, sizes);
      if (!layout.ok()) Die(layout.status());
      auto tier = SsdTier::Create(SsdTierOptions{dir, "bench", "n0", true}, std::move(*layout));
      if (!tier.ok()) Die(tier.status());
      SsdTier& t = **tier;
      {
        Prefetcher pf(t, Fetch, 2);
        if (auto s = pf.Start(); !s.ok()) Die(s);
        pf.Wait();
      }
      const uint64_t padded = t.layout().max_padded_size();
      auto* buf = static_cast<std::byte*>(std::aligned_alloc(4096, padded));
      const double tt = Best(rounds, [&] {
        for (uint64_t k = 0; k < n; ++k) {
          if (auto s = t.Read(k, {buf, size}); !s.ok()) Die(s);
        }
      });
      std::vector<int> fds;
      for (uint32_t f = 0; f < t.layout().file_count(); ++f) {
        const int fd = open(t.DataPath(f).c_str(), O_RDONLY | (t.direct_io() ? O_DIRECT : 0));
        if (fd < 0) Die(nopfs::Status::FromErrno(errno, "opening " + t.DataPath(f)));
        fds.push_back(fd);
      }
      const double tb = Best(rounds, [&] {
        for (uint64_t k = 0; k < n; ++k) {
          const auto e = t.layout().Extent(static_cast<uint32_t>(k));
          if (pread(fds[e.file], buf, t.layout().PaddedSizeOf(static_cast<uint32_t>(k)),
                    static_cast<off_t>(e.offset)) < 0) {
            Die(nopfs::Status::FromErrno(errno, "pread"));
          }
        }
      });
      for (int fd : fds)
        close(fd);
      std::free(buf);
      std::printf("%-6s %-4s %10.2f %10.2f %8.2f  pread loop (%s)\n", "ssd",
                  size == 4096           ? "4K"
                  : size == (128u << 10) ? "128K"
                                         : "4M",
                  gb / tt, gb / tb, tb / tt, t.direct_io() ? "O_DIRECT" : "buffered");
    }
    // RAM.
    {
      auto layout = TierLayout::Ram(plan, sizes);
      if (!layout.ok()) Die(layout.status());
      auto tier = RamTier::Create("bench", std::move(*layout));
      if (!tier.ok()) Die(tier.status());
      RamTier& t = **tier;
      {
        Prefetcher pf(t, Fetch, 2);
        if (auto s = pf.Start(); !s.ok()) Die(s);
        pf.Wait();
      }
      std::vector<std::byte> dst(size);
      std::vector<const std::byte*> src(n);
      for (uint64_t k = 0; k < n; ++k)
        src[k] = t.View(k)->data();
      const double tt = Best(rounds, [&] {
        for (uint64_t k = 0; k < n; ++k) {
          if (auto s = t.Read(k, dst); !s.ok()) Die(s);
        }
      });
      const double tb = Best(rounds, [&] {
        for (uint64_t k = 0; k < n; ++k) {
          std::memcpy(dst.data(), src[k], size);
          asm volatile("" : : "r"(dst.data()) : "memory");
        }
      });
      std::printf("%-6s %-4s %10.2f %10.2f %8.2f  memcpy\n", "ram",
                  size == 4096           ? "4K"
                  : size == (128u << 10) ? "128K"
                                         : "4M",
                  gb / tt, gb / tb, tb / tt);
    }
  }
  // RAM tier start-up: lazy commit against committing up front.
  {
    const uint64_t size = uint64_t{128} << 10;
    const uint64_t n = std::max<uint64_t>(1, (startup_mib << 20) / size);
    std::vector<uint64_t> sizes(n, size);
    policy::TierPlan plan;
    for (uint64_t k = 0; k < n; ++k)
      plan.prefetch_order.push_back(k);
    plan.bytes = n * size;
    std::vector<std::byte> sample(size, std::byte{0x5a});
    const FetchFn copy = [&](policy::SampleId,
                             std::span<std::byte> dst) -> nopfs::Result<uint64_t> {
      std::memcpy(dst.data(), sample.data(), dst.size());
      return uint64_t{0};
    };
    double create = 1e300, fill = 1e300, old_create = 1e300, old_fill = 1e300;
    for (int r = 0; r < rounds; ++r) {
      auto layout = TierLayout::Ram(plan, sizes);
      if (!layout.ok()) Die(layout.status());
      const auto t0 = std::chrono::steady_clock::now();
      auto tier = RamTier::Create("bench", std::move(*layout));
      if (!tier.ok()) Die(tier.status());
      const auto t1 = std::chrono::steady_clock::now();
      RamTier& t = **tier;
      for (uint32_t slot = 0; slot < n; ++slot) {
        if (!t.slots().TryBeginFill(slot)) Die(nopfs::Status::Internal("slot taken"));
        auto h = t.Fill(slot, copy, {});
        if (!h.ok()) Die(h.status());
        t.slots().MarkReady(slot, *h);
      }
      const auto t2 = std::chrono::steady_clock::now();
      create = std::min(create, std::chrono::duration<double>(t1 - t0).count());
      fill = std::min(fill, std::chrono::duration<double>(t2 - t1).count());
    }
    for (int r = 0; r < rounds; ++r) {
      const uint64_t bytes = n * size;
      const auto t0 = std::chrono::steady_clock::now();
      const int fd = memfd_create("bench-upfront", MFD_CLOEXEC);
      if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0 ||
          posix_fallocate(fd, 0, static_cast<off_t>(bytes)) != 0) {
        Die(nopfs::Status::FromErrno(errno, "memfd"));
      }
      void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
      if (p == MAP_FAILED) Die(nopfs::Status::FromErrno(errno, "mmap"));
      const auto t1 = std::chrono::steady_clock::now();
      auto* base = static_cast<std::byte*>(p);
      for (uint64_t k = 0; k < n; ++k) {
        std::memcpy(base + k * size, sample.data(), size);
        asm volatile("" : : "r"(base) : "memory");
      }
      const auto t2 = std::chrono::steady_clock::now();
      munmap(p, bytes);
      close(fd);
      old_create = std::min(old_create, std::chrono::duration<double>(t1 - t0).count());
      old_fill = std::min(old_fill, std::chrono::duration<double>(t2 - t1).count());
    }
    std::printf(
        "\nram tier start-up, %llu MiB of 128K samples (best of %d):\n"
        "  create %8.4f s   committed up front %8.4f s   ratio %.3f\n"
        "  create + fill %8.4f s   committed up front + fill %8.4f s   ratio %.2f\n",
        static_cast<unsigned long long>(startup_mib), rounds, create, old_create,
        create / old_create, create + fill, old_create + old_fill,
        (create + fill) / (old_create + old_fill));
  }
  return 0;
}
