// nopfs_serve_bench: what a training process gets out of nopfsd, against the physical limits
// measured in the same run.
//
//   nopfs_serve_bench [--dir /var/tmp] [--mib 128] [--epochs 3] [--rounds 1]
//
// For samples of 4 KiB, 128 KiB and 4 MiB (--mib MiB of samples per size, one ImageFolder class
// of files under --dir), it starts a real nopfsd (beside this program) whose RAM tier holds the
// whole dataset and:
//  1. prefetch: times the RAM tier's fill from the directory (page cache dropped per file with
//     POSIX_FADV_DONTNEED before), against reading the same files directly with the same number
//     of threads (cache dropped the same way);
//  2. serve: one client reads rank 0's stream for --epochs epochs through the C++ client and
//     copies every sample out (what a loader does with it), twice: with nopfsd copying each
//     sample into the ring ("copy"), and with the client reading it in place from the RAM tier
//     ("zero-copy", the default); against memcpy of the same samples from one buffer (the
//     ceiling for bytes handed over in memory);
//  3. CPU: nopfsd's user+system CPU seconds (from /proc) per GB served (the stream's open, which
//     maps and populates the ring, is timed apart).
// Figures are printed with the ratio to their baseline; a benchmark never fails.
#include <fcntl.h>
#include <signal.h>
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

#include "cli/process.h"
#include "client/client.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

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
  uint64_t mib = 128;
  uint32_t epochs = 3;
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
        << "staging = { capacity = \"256MB\", threads = 2 }\n"
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
  nopfs::cli::Child::Options o;
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
  nopfs::Result<nopfs::cli::Child> d = nopfs::cli::Child::Spawn(argv, o);
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
    auto text = (*client)->StatusText();
    if (!text.ok()) Die(text.status().message());
    if (text->find("prefetch done") != std::string::npos) {
      prefetch = Since(t_start);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }

  // 2. One client reads rank 0's whole stream and copies each sample out: once with samples
  //    copied into the ring by nopfsd, once in place from the RAM tier (zero copy).
  struct Served {
    double seconds = 0, cpu = 0, opened = 0;
    uint64_t samples = 0, bytes = 0;
  };
  std::vector<std::byte> sink(size);
  auto serve = [&](bool zero_copy) {
    Served r;
    const double cpu0 = CpuSeconds(d->pid());
    nopfs::client::OpenOptions open_options;
    open_options.zero_copy = zero_copy;
    const auto t_open = Clock::now();
    auto stream = (*client)->Open(0, open_options);
    if (!stream.ok()) Die(stream.status().message());
    r.opened = Since(t_open);
    const auto t1 = Clock::now();
    for (;;) {
      auto s = (*stream)->Next();
      if (!s.ok()) Die(s.status().message());
      if (!s->has_value()) break;
      std::memcpy(sink.data(), (*s)->data, (*s)->size);
      r.bytes += (*s)->size;
      ++r.samples;
      if (auto rel = (*stream)->Release(**s); !rel.ok()) Die(rel.message());
    }
    r.seconds = Since(t1);
    r.cpu = CpuSeconds(d->pid()) - cpu0;
    return r;
  };
  const Served copied = serve(false);
  const Served in_place = serve(true);
  d->Signal(SIGTERM);
  (void)d->Wait(std::chrono::seconds(30));

  // memcpy of the same number of samples of the same size, out of a dataset-sized buffer.
  std::vector<std::byte> src(std::min<uint64_t>(count * size, uint64_t{256} << 20));
  std::memset(src.data(), 1, src.size());
  const uint64_t per_buf = std::max<uint64_t>(1, src.size() / size);
  const auto t2 = Clock::now();
  for (uint64_t k = 0; k < copied.samples; ++k)
    std::memcpy(sink.data(), src.data() + (k % per_buf) * size, size);
  const double mem = Since(t2);
  const double mem_gbs = static_cast<double>(copied.bytes) / mem / 1e9;

  const std::string label = size >= (1u << 20) ? std::to_string(size >> 20) + " MiB"
                                               : std::to_string(size >> 10) + " KiB";
  std::printf("%8s  prefetch %6.2f GB/s (direct read %6.2f GB/s, ratio %.2f)   memcpy %6.2f GB/s\n",
              label.c_str(), dataset / prefetch / 1e9, dataset / direct / 1e9, direct / prefetch,
              mem_gbs);
  for (const auto& [name, r] : {std::pair<const char*, const Served&>{"copy", copied},
                                std::pair<const char*, const Served&>{"zero-copy", in_place}}) {
    const double gbs = static_cast<double>(r.bytes) / r.seconds / 1e9;
    std::printf(
        "%8s  serve %-9s %8.0f samples/s %6.2f GB/s (ratio to memcpy %.2f)   nopfsd CPU %.2f "
        "s/GB, open %.0f ms\n",
        "", name, static_cast<double>(r.samples) / r.seconds, gbs, gbs / mem_gbs,
        r.cpu / (static_cast<double>(r.bytes) / 1e9), r.opened * 1e3);
  }
  std::fflush(stdout);
  fs::remove_all(root);
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--dir") {
      a.dir = v;
    } else if (k == "--mib") {
      a.mib = std::stoull(v);
    } else if (k == "--epochs") {
      a.epochs = static_cast<uint32_t>(std::stoul(v));
    } else {
      Die("unknown flag " + k + "; flags: --dir DIR --mib N --epochs E");
    }
  }
  const std::string bin = fs::read_symlink("/proc/self/exe").parent_path().string();
  std::printf("nopfs_serve_bench: %llu MiB per size under %s, %u epochs, one client, RAM tier\n",
              static_cast<unsigned long long>(a.mib), a.dir.c_str(), a.epochs);
  for (uint64_t size : {uint64_t{4} << 10, uint64_t{128} << 10, uint64_t{4} << 20})
    RunSize(a, bin, size);
  return 0;
}
