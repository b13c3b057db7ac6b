// nopfs_checksum_bench: what verifying a cold RAM-tier sample costs, against memcpy of it.
//
//   nopfs_checksum_bench [--mib N] [--rounds 5] [--sizes 4KiB,128KiB,4MiB]
//
// For each sample size it fills a memfd of --mib MiB (by default twice the last-level cache, at
// least 512, so that every visit reads DRAM, as nopfsd's in-place verification of a real tier
// does), visits its samples in a shuffled order, and times per round, back to back:
//  - memcpy of each sample into a sample-sized buffer (the client's copy: the baseline);
//  - XXH3_64bits of each sample (the plain one-shot hash);
//  - ColdXxh3 of each sample (common/checksum.h: the same value, hashed with software prefetch;
//    what RamTier::Verify runs);
//  - ColdXxh3 then memcpy of each sample (a client that verified before it copied).
// It prints medians over the rounds in GB/s and each one's ratio to memcpy taken within its round
// (medians, ranges in brackets). A benchmark never fails.
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "common/checksum.h"
#include "common/units.h"

namespace {

using nopfs::bench::Max;
using nopfs::bench::Median;
using nopfs::bench::Min;
using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const std::string& msg) {
  std::fprintf(stderr, "checksum_bench: %s\n", msg.c_str());
  std::exit(1);
}

struct Args {
  uint64_t mib = 0;
  uint32_t rounds = 5;
  std::vector<uint64_t> sizes = {uint64_t{4} << 10, uint64_t{128} << 10, uint64_t{4} << 20};
};

const char* const kUsage =
    "usage: nopfs_checksum_bench [--mib N] [--rounds R] [--sizes 4KiB,128KiB,4MiB]\n";

enum Mode { kMemcpy, kPlain, kCold, kColdThenCopy, kModes };
const char* const kModeNames[kModes] = {"memcpy", "xxh3", "ColdXxh3", "ColdXxh3+memcpy"};

void RunSize(const Args& a, uint64_t size) {
  const uint64_t count = std::max<uint64_t>(8, (a.mib << 20) / size);
  const uint64_t bytes = count * size;
  const int fd = memfd_create("nopfs-checksum-bench", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) Die("memfd of the dataset");
  void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (m == MAP_FAILED) Die("mmap of the dataset");
  auto* data = static_cast<std::byte*>(m);
  std::mt19937_64 rng(42);
  for (uint64_t i = 0; i < bytes; i += 8) {
    const uint64_t v = rng();
    std::memcpy(data + i, &v, std::min<uint64_t>(8, bytes - i));
  }
  std::vector<uint64_t> order(count);
  for (uint64_t i = 0; i < count; ++i)
    order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<std::byte> sink(size);

  std::vector<double> gbs[kModes], ratio[kModes];
  uint64_t check = 0;  // keeps the hashes alive; plain and cold must agree
  for (uint32_t r = 0; r < a.rounds; ++r) {
    double round_gbs[kModes];
    for (int mode = 0; mode < kModes; ++mode) {
      uint64_t acc = 0;
      const auto t0 = Clock::now();
      for (const uint64_t i : order) {
        const std::span<const std::byte> s(data + i * size, size);
        switch (mode) {
          case kMemcpy:
            std::memcpy(sink.data(), s.data(), size);
            acc += static_cast<uint64_t>(sink[size / 2]);
            break;
          case kPlain:
            acc += XXH3_64bits(s.data(), size);
            break;
          case kCold:
            acc += nopfs::ColdXxh3(s);
            break;
          default:
            acc += nopfs::ColdXxh3(s);
            std::memcpy(sink.data(), s.data(), size);
            acc += static_cast<uint64_t>(sink[size / 2]);
        }
      }
      const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
      round_gbs[mode] = static_cast<double>(bytes) / secs / 1e9;
      if (mode == kPlain) check = acc;
      if (mode == kCold && acc != check) Die("ColdXxh3 and XXH3_64bits disagree");
    }
    for (int mode = 0; mode < kModes; ++mode) {
      gbs[mode].push_back(round_gbs[mode]);
      ratio[mode].push_back(round_gbs[mode] / round_gbs[kMemcpy]);
    }
  }
  munmap(m, bytes);
  close(fd);
  const std::string label = size >= (uint64_t{1} << 20) && size % (uint64_t{1} << 20) == 0
                                ? std::to_string(size >> 20) + " MiB"
                                : std::to_string(size >> 10) + " KiB";
  std::printf("%8s", label.c_str());
  for (int mode = 0; mode < kModes; ++mode) {
    if (mode == kMemcpy) {
      std::printf("  %s %6.2f GB/s", kModeNames[mode], Median(gbs[mode]));
    } else {
      std::printf("  %s %6.2f GB/s (%.2f [%.2f-%.2f])", kModeNames[mode], Median(gbs[mode]),
                  Median(ratio[mode]), Min(ratio[mode]), Max(ratio[mode]));
    }
  }
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  nopfs::bench::ParseFlags(
      argc, argv, "checksum_bench", kUsage, [&](const std::string& k, const std::string& v) {
        if (k == "--mib") {
          a.mib = std::stoull(v);
        } else if (k == "--rounds") {
          a.rounds = std::max<uint32_t>(1, static_cast<uint32_t>(std::stoul(v)));
        } else if (k == "--sizes") {
          std::optional<std::vector<uint64_t>> sizes = nopfs::bench::ParseSizeList(v);
          if (!sizes) Die("--sizes: write sizes separated by commas, e.g. 4KiB,128KiB");
          a.sizes = std::move(*sizes);
        } else {
          return false;
        }
        return true;
      });
  if (a.mib == 0) a.mib = nopfs::bench::DefaultDatasetMiB();
  std::printf(
      "nopfs_checksum_bench: %llu MiB per size in a memfd, shuffled order, %u rounds (GB/s, "
      "medians; ratio to memcpy in parentheses)\n",
      static_cast<unsigned long long>(a.mib), a.rounds);
  for (const uint64_t size : a.sizes)
    RunSize(a, size);
  return 0;
}
