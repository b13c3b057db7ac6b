// nopfs_serve_bench: what a training process gets out of nopfsd, against the physical limits
// measured in the same run.
//
//   nopfs_serve_bench [--dir /var/tmp] [--mib N] [--epochs 3] [--rounds 3]
//                     [--sizes 4KiB,128KiB,4MiB] [--staging-threads N] [--batch N]
//                     [--verify on_fill|always]
//
// For samples of each size (--mib MiB of them per size, by default twice the last-level cache and
// at least 512; one ImageFolder class of files under --dir), it starts a real nopfsd (beside this
// program) whose RAM tier holds the whole dataset, with --staging-threads staging threads (by
// default one core is left to the client and nopfsd gets the others, at least 1: threads that
// take the client's core slow it down more than they help; docs/PERFORMANCE.md), and:
//  1. prefetch: times the RAM tier's fill from the directory (page cache dropped per file with
//     POSIX_FADV_DONTNEED before), against reading the same files directly with the same number
//     of threads (cache dropped the same way);
//  2. serve: one client reads rank 0's stream for --epochs epochs through the C++ client and
//     copies every sample out (what a loader does with it), twice: with nopfsd copying each
//     sample into the ring ("copy"), and with the client reading it in place from the RAM tier
//     ("zero-copy", the default); against memcpy of the same samples from a dataset-sized
//     buffer of shared memory (a memfd, like the tier), twice: streaming through it in address
//     order ("memcpy"), and visiting it in the stream's own shuffled order ("memcpy in stream
//     order"), and a verified serve's baseline ("verified": the same copies in stream order, each
//     sample first checked by a second thread with nopfsd's in-place check, ColdXxh3, up to
//     64 MiB ahead, as nopfsd's ring allows); the dataset should exceed the last-level cache
//     (--mib), or the baselines and the client run from the cache;
//     With --batch N (N > 1) the client takes N samples per call (Stream::NextBatch) and
//     releases them in one (ReleaseBatch) instead of one Next() and Release() per sample.
//  3. CPU: nopfsd's user+system CPU seconds (from /proc) per GB served (the stream's open, which
//     maps and populates the ring, is timed apart).
// The serves and their baselines run --rounds times, alternating, each serve's ratio taken to the
// baselines timed right after it (this machine's speed drifts by tens of percent over seconds);
// medians are printed, with the range of the ratios. A benchmark never fails.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "client/client.h"
#include "common/checksum.h"
#include "common/units.h"
#include "launch/process.h"

namespace {

namespace fs = std::filesystem;
using nopfs::ParseSize;
using nopfs::Result;
using nopfs::bench::Max;
using nopfs::bench::Median;
using nopfs::bench::Min;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

const char* const kUsage =
    "usage: nopfs_serve_bench [--dir DIR] [--mib N] [--epochs E] [--rounds R] [--sizes "
    "4KiB,128KiB,4MiB] [--staging-threads N] [--batch N] [--verify on_fill|always]\n";

[[noreturn]] void Die(const std::string& msg) {
  std::fprintf(stderr, "serve_bench: %s\n", msg.c_str());
  std::exit(1);
}

void DropCache(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  fdatasync(fd);
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  close(fd);
}

// nopfsd's CPU seconds (user + system) from /proc/<pid>/stat.
double CpuSeconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close_paren = s.rfind(')');
  if (close_paren == std::string::npos) return 0;
  std::istringstream rest(s.substr(close_paren + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

struct Args {
  std::string dir = "/var/tmp";
  uint64_t mib = 0;  // 0: twice the last-level cache, at least 512 (the tier is read from DRAM)
  std::vector<uint64_t> sizes = {uint64_t{4} << 10, uint64_t{128} << 10, uint64_t{4} << 20};
  uint32_t epochs = 3;
  uint32_t rounds = 3;
  uint32_t staging_threads = 0;    // 0: one core for the client, the others for nopfsd (at least 1)
  uint32_t batch = 1;              // samples per client call (1: Next and Release per sample)
  std::string verify = "on_fill";  // the node config's `verify` for RAM hits
};

void RunSize(const Args& a, const std::string& bin, uint64_t size) {
  const uint64_t count = std::max<uint64_t>(8, (a.mib << 20) / size);
  const std::string root = a.dir + "/nopfs-serve-bench-" + std::to_string(getpid());
  const std::string data = root + "/data";
  fs::create_directories(data + "/class0");
  std::vector<std::string> files;
  {
    std::mt19937_64 rng(size);
    std::vector<uint64_t> buf((size + 7) / 8);
    for (uint64_t k = 0; k < count; ++k) {
      for (uint64_t& w : buf)
        w = rng();
      char name[64];
      std::snprintf(name, sizeof name, "/class0/s%07llu.bin", static_cast<unsigned long long>(k));
      files.push_back(data + name);
      std::ofstream(files.back(), std::ios::binary)
          .write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(size));
    }
  }
  for (const std::string& f : files)
    DropCache(f);
  const double dataset = static_cast<double>(count * size);
  {
    std::ofstream(root + "/bench.conf.lua")
        << "verify = \"" << a.verify << "\"\n"
        << "staging = { capacity = \"256M\", threads = " << a.staging_threads << " }\n"
        << "classes = { ram { capacity = \"" << (count * (size + 64) + (1 << 20))
        << "\", threads = 2 } }\n";
  }

  // 1. Direct read of the files with 2 threads (the prefetcher's thread count).
  double direct = 0;
  {
    std::atomic<uint64_t> next{0};
    const auto t0 = Clock::now();
    std::vector<std::thread> ts;
    for (int t = 0; t < 2; ++t) {
      ts.emplace_back([&] {
        std::vector<char> b(size);
        for (uint64_t k; (k = next.fetch_add(1)) < count;) {
          const int fd = open(files[k].c_str(), O_RDONLY | O_CLOEXEC);
          if (fd < 0 || pread(fd, b.data(), size, 0) != static_cast<ssize_t>(size)) Die(files[k]);
          close(fd);
        }
      });
    }
    for (auto& t : ts)
      t.join();
    direct = Since(t0);
  }
  for (const std::string& f : files)
    DropCache(f);

  // nopfsd, prefetching into RAM.
  const std::string run = root + "/run";
  nopfs::launch::Child::Options o;
  std::vector<std::string> argv = {bin + "/nopfsd",
                                   "--run-dir",
                                   run,
                                   "--dataset",
                                   data,
                                   "--seed",
                                   "1",
                                   "--epochs",
                                   std::to_string(a.epochs),
                                   "--ranks",
                                   "1",
                                   "--batch",
                                   "32",
                                   "--config",
                                   root + "/bench.conf.lua"};
  if (geteuid() == 0) argv.push_back("--allow-root");
  nopfs::Result<nopfs::launch::Child> d = nopfs::launch::Child::Spawn(argv, o);
  if (!d.ok()) Die(d.status().message());
  while (!fs::exists(run + "/ready")) {
    if (d->Wait(std::chrono::milliseconds(1)).ok()) Die("nopfsd exited; see " + run);
  }
  // Prefetch starts just before `ready` (after the catalog scan and the plan); timed from there.
  const auto t_start = Clock::now();
  auto client = nopfs::client::Client::Connect(run + "/nopfsd.sock");
  if (!client.ok()) Die(client.status().message());
  double prefetch = 0;
  for (;;) {
    auto rep = (*client)->Report();
    if (!rep.ok()) Die(rep.status().message());
    if (std::any_of(rep->tiers.begin(), rep->tiers.end(), [](const nopfs::report::Tier& t) {
          return t.state == nopfs::report::TierState::kDone;
        })) {
      prefetch = Since(t_start);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }

  // 2. One client reads rank 0's whole stream and copies each sample out: once with samples
  //    copied into the ring by nopfsd, once in place from the RAM tier (zero copy); each round
  //    also times the memcpy baselines right after, and ratios are taken within the round.
  struct Served {
    double seconds = 0, cpu = 0, opened = 0, stalled = 0;
    uint64_t samples = 0, bytes = 0;
  };
  std::vector<std::byte> sink(size);
  std::vector<uint32_t> order;  // the sample ids in the order the stream delivered them
  auto serve = [&](bool zero_copy) {
    Served r;
    const double cpu0 = CpuSeconds(d->pid());
    nopfs::client::OpenOptions open_options;
    open_options.zero_copy = zero_copy;
    const auto t_open = Clock::now();
    auto stream = (*client)->Open(0, open_options);
    if (!stream.ok()) Die(stream.status().message());
    r.opened = Since(t_open);
    order.clear();
    const auto t1 = Clock::now();
    std::vector<nopfs::client::Sample> batch;
    while (a.batch > 1) {
      batch.clear();
      auto n = (*stream)->NextBatch(a.batch, &batch);
      if (!n.ok()) Die(n.status().message());
      if (*n == 0) break;
      for (const nopfs::client::Sample& x : batch) {
        std::memcpy(sink.data(), x.data, x.size);
        order.push_back(x.sample_id);
        r.bytes += x.size;
      }
      r.samples += *n;
      if (auto rel = (*stream)->ReleaseBatch(batch); !rel.ok()) Die(rel.message());
    }
    while (a.batch <= 1) {
      auto s = (*stream)->Next();
      if (!s.ok()) Die(s.status().message());
      if (!s->has_value()) break;
      std::memcpy(sink.data(), (*s)->data, (*s)->size);
      order.push_back((*s)->sample_id);
      r.bytes += (*s)->size;
      ++r.samples;
      if (auto rel = (*stream)->Release(**s); !rel.ok()) Die(rel.message());
    }
    r.seconds = Since(t1);
    r.cpu = CpuSeconds(d->pid()) - cpu0;
    r.stalled = static_cast<double>((*stream)->stats().stall_ns_total) / 1e9;
    return r;
  };
  // memcpy of the same samples out of a dataset-sized buffer of the tier's kind of memory (a memfd,
  // read through a second, read-only mapping, as the client maps the tier): streaming through it
  // in address order, and visiting it in the stream's order (sample k at k's place). Anonymous
  // heap memory copies about 15 % faster on this machine than shared memory; the tier is shared.
  const uint64_t src_bytes = count * size;
  const int src_fd = memfd_create("nopfs-serve-bench-baseline", MFD_CLOEXEC);
  if (src_fd < 0 || ftruncate(src_fd, static_cast<off_t>(src_bytes)) != 0) Die("memfd");
  void* rw = mmap(nullptr, src_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, src_fd, 0);
  void* ro = mmap(nullptr, src_bytes, PROT_READ, MAP_SHARED, src_fd, 0);
  if (rw == MAP_FAILED || ro == MAP_FAILED) Die("mmap of the baseline buffer");
  std::memset(rw, 1, src_bytes);
  const auto* src = static_cast<const std::byte*>(ro);
  const uint64_t per_buf = std::max<uint64_t>(1, src_bytes / size);
  auto memcpy_gbs = [&](bool stream_order) {
    const auto t = Clock::now();
    for (uint64_t k = 0; k < order.size(); ++k) {
      const uint64_t at = stream_order ? order[k] % per_buf : k % per_buf;
      std::memcpy(sink.data(), src + at * size, size);
    }
    return static_cast<double>(order.size()) * static_cast<double>(size) / Since(t) / 1e9;
  };
  // A verified serve's baseline: the same copies in stream order, each sample first checked by a
  // second thread with nopfsd's in-place check (ColdXxh3) as far ahead of the copy as nopfsd's
  // ring lets it run (the 256 MB of staging for one rank, capped at 64 MiB), and no sample copied
  // before its check is done. (A lead of a few MiB would let the copy hit the last-level cache
  // and run faster than memcpy from memory; docs/PERFORMANCE.md.)
  uint64_t check_sink = 0;
  auto verified_gbs = [&] {
    const uint64_t lead = std::max<uint64_t>(1, (uint64_t{64} << 20) / size);
    std::atomic<uint64_t> checked{0}, copied{0};
    std::thread checker([&] {
      uint64_t acc = 0;
      for (uint64_t k = 0; k < order.size(); ++k) {
        while (k >= copied.load(std::memory_order_acquire) + lead)
          std::this_thread::yield();
        acc += nopfs::ColdXxh3({src + (order[k] % per_buf) * size, size});
        checked.store(k + 1, std::memory_order_release);
      }
      check_sink += acc;
    });
    const auto t = Clock::now();
    for (uint64_t k = 0; k < order.size(); ++k) {
      while (checked.load(std::memory_order_acquire) <= k)
        std::this_thread::yield();
      std::memcpy(sink.data(), src + (order[k] % per_buf) * size, size);
      copied.store(k + 1, std::memory_order_release);
    }
    const double secs = Since(t);
    checker.join();
    return static_cast<double>(order.size()) * static_cast<double>(size) / secs / 1e9;
  };
  struct Row {
    std::vector<double> samples_s, gbs, ratio, ratio_order, ratio_verified, cpu_gb, open_ms,
        stalled;
  };
  Row rows[2];  // copy, zero-copy
  std::vector<double> mem_all, order_all, verified_all;
  for (uint32_t round = 0; round < a.rounds; ++round) {
    for (int zc = 0; zc < 2; ++zc) {
      const Served r = serve(zc == 1);
      const double mem = memcpy_gbs(false);
      const double in_order = memcpy_gbs(true);
      const double verified = verified_gbs();
      const double gbs = static_cast<double>(r.bytes) / r.seconds / 1e9;
      Row& row = rows[zc];
      row.samples_s.push_back(static_cast<double>(r.samples) / r.seconds);
      row.gbs.push_back(gbs);
      row.ratio.push_back(gbs / mem);
      row.ratio_order.push_back(gbs / in_order);
      row.ratio_verified.push_back(gbs / verified);
      row.cpu_gb.push_back(r.cpu / (static_cast<double>(r.bytes) / 1e9));
      row.open_ms.push_back(r.opened * 1e3);
      row.stalled.push_back(r.stalled / r.seconds);
      mem_all.push_back(mem);
      order_all.push_back(in_order);
      verified_all.push_back(verified);
    }
  }
  d->Signal(SIGTERM);
  (void)d->Wait(std::chrono::seconds(30));
  munmap(rw, src_bytes);
  munmap(ro, src_bytes);
  close(src_fd);

  const std::string label = size >= (1u << 20) ? std::to_string(size >> 20) + " MiB"
                                               : std::to_string(size >> 10) + " KiB";
  std::printf(
      "%8s  prefetch %6.2f GB/s (direct read %6.2f GB/s, ratio %.2f)   memcpy %6.2f GB/s, in "
      "stream order %6.2f GB/s, verified %6.2f GB/s (medians of %u rounds)\n",
      label.c_str(), dataset / prefetch / 1e9, dataset / direct / 1e9, direct / prefetch,
      Median(mem_all), Median(order_all), Median(verified_all), a.rounds);
  for (int zc = 0; zc < 2; ++zc) {
    const Row& r = rows[zc];
    std::printf(
        "%8s  serve %-9s %8.0f samples/s %6.2f GB/s (ratio to memcpy %.2f [%.2f-%.2f], in "
        "stream order %.2f [%.2f-%.2f], verified %.2f [%.2f-%.2f])   nopfsd CPU %.2f s/GB, open "
        "%.0f ms, client waited %.0f %%\n",
        "", zc == 0 ? "copy" : "zero-copy", Median(r.samples_s), Median(r.gbs), Median(r.ratio),
        Min(r.ratio), Max(r.ratio), Median(r.ratio_order), Min(r.ratio_order), Max(r.ratio_order),
        Median(r.ratio_verified), Min(r.ratio_verified), Max(r.ratio_verified), Median(r.cpu_gb),
        Median(r.open_ms), 100 * Median(r.stalled));
  }
  if (check_sink == 1) std::printf(" ");  // keeps the checks from being optimized away
  std::fflush(stdout);
  fs::remove_all(root);
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  nopfs::bench::ParseFlags(
      argc, argv, "serve_bench", kUsage, [&](const std::string& k, const std::string& v) {
        if (k == "--dir") {
          a.dir = v;
        } else if (k == "--mib") {
          a.mib = std::stoull(v);
        } else if (k == "--epochs") {
          a.epochs = static_cast<uint32_t>(std::stoul(v));
        } else if (k == "--rounds") {
          a.rounds = std::max<uint32_t>(1, static_cast<uint32_t>(std::stoul(v)));
        } else if (k == "--staging-threads") {
          a.staging_threads = static_cast<uint32_t>(std::stoul(v));
          if (a.staging_threads == 0) Die("--staging-threads: write 1 or more");
        } else if (k == "--verify") {
          if (v != "on_fill" && v != "always") Die("--verify: write on_fill or always");
          a.verify = v;
        } else if (k == "--batch") {
          a.batch = static_cast<uint32_t>(std::stoul(v));
          if (a.batch == 0) Die("--batch: write 1 (one sample per call) or more");
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
  if (a.staging_threads == 0) {
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    a.staging_threads = static_cast<uint32_t>(std::max(1L, cores - 1));
  }
  const std::string bin = fs::read_symlink("/proc/self/exe").parent_path().string();
  std::printf(
      "nopfs_serve_bench: %llu MiB per size under %s, %u epochs, one client, RAM tier, %u "
      "staging thread(s), %u rounds, %u sample(s) per client call\n",
      static_cast<unsigned long long>(a.mib), a.dir.c_str(), a.epochs, a.staging_threads, a.rounds,
      a.batch);
  for (uint64_t size : a.sizes)
    RunSize(a, bin, size);
  return 0;
}
