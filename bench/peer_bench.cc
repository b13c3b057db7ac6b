// peer_bench: peer read throughput and latency between two PeerLinks (two nopfsd peer services in
// one process) over the loopback fabric, against iperf3 over the same loopback in the same run.
//
//   peer_bench [--seconds S] [--inflight N] [--no-iperf] [--only rma|replies]
//
// Two paths, each measured with its own pair of links: "rma", as nopfsd serves RAM-tier samples
// (node 0 answers with the sample's place in memory it exposed, node 1 fetches it with an RMA
// read and checks its xxh3), and "replies", as it serves SSD-tier samples or peers without RMA
// (the bytes copied into a tagged reply). Throughput: node 1 keeps N reads of distinct 128 KiB
// samples in flight (N threads) for S seconds, each read into a buffer of the reader's (as into
// a tier slot) and checked byte for byte. Latency: one thread, sequential 4 KiB reads, median and
// p99. Baseline: `iperf3 -c 127.0.0.1 -t S` against an iperf3 server started here; each path's
// ratio to it is printed.
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <xxhash.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/json.h"
#include "fabric/loopback_port.h"
#include "fabric/peer_link.h"

namespace {

using nopfs::fabric::PeerLink;
using nopfs::fabric::ReadStatus;
using nopfs::fabric::ServeResult;
using Clock = std::chrono::steady_clock;

// Sample s is `size` bytes, byte i = (s + i) mod 251; sizes are encoded in the sample id's top
// bits. The bytes are a slice of one precomputed pattern, so that making and checking them costs
// a memcpy/memcmp (what serving from a tier and a consumer's use cost), not the benchmark's own
// arithmetic.
constexpr uint64_t kMaxBenchSample = uint64_t{1} << 20;
const std::vector<std::byte>& Pattern() {
  static const std::vector<std::byte> p = [] {
    std::vector<std::byte> v(kMaxBenchSample + 251);
    for (size_t j = 0; j < v.size(); ++j)
      v[j] = static_cast<std::byte>(j % 251);
    return v;
  }();
  return p;
}
std::span<const std::byte> Expected(uint64_t sample) {
  const uint64_t size = std::min(sample >> 40, kMaxBenchSample);
  return {Pattern().data() + sample % 251, size};
}
std::vector<std::byte> Bytes(uint64_t sample) {
  const std::span<const std::byte> e = Expected(sample);
  return {e.begin(), e.end()};
}
bool Matches(std::span<const std::byte> got, uint64_t sample) {
  const std::span<const std::byte> e = Expected(sample);
  return got.size() == e.size() && std::memcmp(got.data(), e.data(), e.size()) == 0;
}
// The xxh3 of every sample (recorded at fill in a real tier): by size and offset in the pattern.
uint64_t RecordedXxh3(uint64_t sample) {
  static const auto table = [] {
    std::array<std::array<uint64_t, 251>, 2> t{};
    for (int k = 0; k < 2; ++k) {
      for (uint64_t off = 0; off < 251; ++off) {
        const uint64_t size = k == 0 ? (4 << 10) : (128 << 10);
        t[k][off] = XXH3_64bits(Pattern().data() + off, size);
      }
    }
    return t;
  }();
  const uint64_t size = sample >> 40;
  if (size == (4 << 10)) return table[0][sample % 251];
  if (size == (128 << 10)) return table[1][sample % 251];
  const std::span<const std::byte> e = Expected(sample);
  return XXH3_64bits(e.data(), e.size());
}

// Runs a shell command and returns its stdout.
std::string Run(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0)
    out.append(buf, n);
  ::pclose(p);
  return out;
}

// iperf3 throughput in bytes/s (receiver side), or 0 if iperf3 is missing.
double Iperf(int seconds) {
  uint16_t port = nopfs::fabric::FreeLoopbackPort();
  std::fflush(stdout);
  pid_t server = ::fork();
  if (server == 0) {
    int null = ::open("/dev/null", O_WRONLY);
    if (null >= 0) ::dup2(null, STDOUT_FILENO);
    std::string p = std::to_string(port);
    ::execlp("iperf3", "iperf3", "-s", "-1", "-p", p.c_str(), "-B", "127.0.0.1", nullptr);
    ::_exit(127);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::string out = Run("iperf3 -J -c 127.0.0.1 -p " + std::to_string(port) + " -t " +
                        std::to_string(seconds) + " 2>/dev/null");
  int status = 0;
  ::waitpid(server, &status, 0);
  // The receiver's summary: end.sum_received.bits_per_second.
  const nopfs::Json doc = nopfs::Json::parse(out, nullptr, /*allow_exceptions=*/false);
  const nopfs::Json::json_pointer where("/end/sum_received/bits_per_second");
  if (doc.is_discarded() || !doc.contains(where) || !doc[where].is_number()) return 0;
  return doc[where].get<double>() / 8;
}

struct PathResult {
  double bytes_per_s = 0;
  double median_us = 0;
  double p99_us = 0;
  uint64_t errors = 0;
  uint64_t remote = 0;  // reads that went by RMA
  std::string provider;
};

// One path: a fresh pair of links, then throughput and latency.
PathResult Measure(bool rma, int seconds, int inflight) {
  PathResult out;
  std::vector<nopfs::fabric::PeerAddress> peers{{"127.0.0.1", nopfs::fabric::FreeLoopbackPort()},
                                                {"127.0.0.1", nopfs::fabric::FreeLoopbackPort()}};
  auto opts = [&](uint32_t node) {
    nopfs::fabric::PeerLinkOptions o;
    o.node = node;
    o.peers = peers;
    o.secret.fill(0x42);
    o.timeout = std::chrono::milliseconds(5000);
    o.remote_read = rma;
    // The samples are in memory, as in a RAM tier: nopfsd answers those on the progress thread.
    o.serve_inline = [](uint64_t) { return true; };
    return o;
  };
  // RMA: in place from the exposed pattern, as a RAM tier; replies: copied, as an SSD tier read.
  nopfs::fabric::ServeFn serve = [rma](uint64_t sample) {
    return rma ? ServeResult::InPlace(Expected(sample), RecordedXxh3(sample))
               : ServeResult::Copied(Bytes(sample));
  };
  auto n0 = PeerLink::Start(opts(0), serve);
  auto n1 = PeerLink::Start(opts(1), serve);
  if (!n0.ok() || !n1.ok()) {
    std::fprintf(stderr, "peer_bench: %s %s\n", n0.status().ToString().c_str(),
                 n1.status().ToString().c_str());
    out.errors = 1;
    return out;
  }
  if (rma) {
    const nopfs::Status st = (*n0)->ExposeForRemoteRead(Pattern());
    if (!st.ok()) {
      std::fprintf(stderr, "peer_bench: no RMA: %s\n", st.ToString().c_str());
      out.errors = 1;
      return out;
    }
  }
  PeerLink& client = **n1;
  out.provider = client.provider();

  // Throughput, 128 KiB samples.
  const uint64_t big = uint64_t{128 << 10} << 40;
  std::atomic<uint64_t> bytes{0}, errors{0}, next{0};
  auto until = Clock::now() + std::chrono::seconds(seconds);
  auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < inflight; ++t) {
    threads.emplace_back([&] {
      std::vector<std::byte> dst(128 << 10);
      while (Clock::now() < until) {
        uint64_t sample = big | next.fetch_add(1);
        auto got = client.ReadInto(0, sample, dst);
        if (!got.ok() || !Matches(dst, sample)) {
          errors.fetch_add(1);
          continue;
        }
        bytes.fetch_add(dst.size());
      }
    });
  }
  for (auto& t : threads)
    t.join();
  out.bytes_per_s =
      static_cast<double>(bytes.load()) / std::chrono::duration<double>(Clock::now() - t0).count();

  // Latency, 4 KiB samples.
  std::vector<double> lat;
  const uint64_t small = uint64_t{4 << 10} << 40;
  std::vector<std::byte> dst(4 << 10);
  for (uint64_t i = 0; i < 2000; ++i) {
    auto s = Clock::now();
    auto got = client.ReadInto(0, small | i, dst);
    lat.push_back(std::chrono::duration<double, std::micro>(Clock::now() - s).count());
    if (!got.ok() || !Matches(dst, small | i)) errors.fetch_add(1);
  }
  std::sort(lat.begin(), lat.end());
  out.median_us = lat[lat.size() / 2];
  out.p99_us = lat[lat.size() * 99 / 100];
  out.errors = errors.load();
  out.remote = client.counters().fetched_remote;
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int seconds = 3;
  int inflight = 8;
  bool iperf = true;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--seconds" && i + 1 < argc) {
      seconds = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--inflight" && i + 1 < argc) {
      inflight = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--no-iperf") {
      iperf = false;
    } else if (a == "--only" && i + 1 < argc &&
               (std::string(argv[i + 1]) == "rma" || std::string(argv[i + 1]) == "replies")) {
      only = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: peer_bench [--seconds S] [--inflight N] [--no-iperf] "
                   "[--only rma|replies]\n");
      return 2;
    }
  }
  spdlog::set_level(spdlog::level::warn);
  uint64_t errors = 0;
  std::vector<std::pair<std::string, PathResult>> results;
  for (const bool rma : {true, false}) {
    const std::string name = rma ? "rma" : "replies";
    if (!only.empty() && only != name) continue;
    PathResult r = Measure(rma, seconds, inflight);
    errors += r.errors;
    std::printf("peer_bench: %s path, provider %s, %d reads in flight, %d s\n", name.c_str(),
                r.provider.c_str(), inflight, seconds);
    std::printf("peer read 128 KiB (%s): %.1f MB/s (%llu errors, %llu reads by RMA)\n",
                name.c_str(), r.bytes_per_s / 1e6, static_cast<unsigned long long>(r.errors),
                static_cast<unsigned long long>(r.remote));
    std::printf("peer read 4 KiB latency (%s): median %.1f us, p99 %.1f us\n", name.c_str(),
                r.median_us, r.p99_us);
    if (rma && r.remote == 0) {
      std::printf("peer_bench: the rma path made no RMA read\n");
      ++errors;
    }
    results.emplace_back(name, r);
  }
  if (iperf) {
    double ip = Iperf(seconds);
    if (ip <= 0) {
      std::printf("iperf3: not available (install iperf3)\n");
    } else {
      std::printf("iperf3 loopback: %.1f MB/s", ip / 1e6);
      for (const auto& [name, r] : results)
        std::printf("; %s/iperf3 = %.3f", name.c_str(), r.bytes_per_s / ip);
      std::printf("\n");
    }
  }
  return errors == 0 ? 0 : 1;
}
