// peer_bench: peer read throughput and latency between two PeerLinks (two nopfsd peer services in
// one process) over the loopback fabric, against iperf3 over the same loopback in the same run.
//
//   peer_bench [--seconds S] [--inflight N] [--no-iperf]
//
// Throughput: node 1 keeps N reads of distinct 128 KiB samples in flight (N threads) against
// node 0 for S seconds; every reply is checked byte for byte. Latency: one thread, sequential
// 4 KiB reads, median and p99. Baseline: `iperf3 -c 127.0.0.1 -t S` against an iperf3 server
// started here; the ratio peer/iperf3 is printed.
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <thread>
#include <vector>

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
bool Matches(const std::vector<std::byte>& got, uint64_t sample) {
  const std::span<const std::byte> e = Expected(sample);
  return got.size() == e.size() && std::memcmp(got.data(), e.data(), e.size()) == 0;
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
  // The receiver's summary: "sum_received": {... "bits_per_second": X
  size_t at = out.find("\"sum_received\"");
  if (at == std::string::npos) return 0;
  at = out.find("\"bits_per_second\":", at);
  if (at == std::string::npos) return 0;
  return std::strtod(out.c_str() + at + 18, nullptr) / 8;
}

}  // namespace

int main(int argc, char** argv) {
  int seconds = 3;
  int inflight = 8;
  bool iperf = true;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--seconds" && i + 1 < argc) {
      seconds = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--inflight" && i + 1 < argc) {
      inflight = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--no-iperf") {
      iperf = false;
    } else {
      std::fprintf(stderr, "usage: peer_bench [--seconds S] [--inflight N] [--no-iperf]\n");
      return 2;
    }
  }
  spdlog::set_level(spdlog::level::warn);
  std::vector<nopfs::fabric::PeerAddress> peers{{"127.0.0.1", nopfs::fabric::FreeLoopbackPort()},
                                                {"127.0.0.1", nopfs::fabric::FreeLoopbackPort()}};
  auto opts = [&](uint32_t node) {
    nopfs::fabric::PeerLinkOptions o;
    o.node = node;
    o.peers = peers;
    o.secret.fill(0x42);
    o.timeout = std::chrono::milliseconds(5000);
    // The samples are in memory, as in a RAM tier: nopfsd answers those on the progress thread.
    o.serve_inline = [](uint64_t) { return true; };
    return o;
  };
  auto serve = [](uint64_t sample) { return ServeResult{ReadStatus::kOk, Bytes(sample)}; };
  auto n0 = PeerLink::Start(opts(0), serve);
  auto n1 = PeerLink::Start(opts(1), serve);
  if (!n0.ok() || !n1.ok()) {
    std::fprintf(stderr, "peer_bench: %s %s\n", n0.status().ToString().c_str(),
                 n1.status().ToString().c_str());
    return 1;
  }
  PeerLink& client = **n1;

  // Throughput, 128 KiB samples.
  const uint64_t big = uint64_t{128 << 10} << 40;
  std::atomic<uint64_t> bytes{0}, errors{0}, next{0};
  auto until = Clock::now() + std::chrono::seconds(seconds);
  auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < inflight; ++t) {
    threads.emplace_back([&] {
      while (Clock::now() < until) {
        uint64_t sample = big | next.fetch_add(1);
        auto got = client.Read(0, sample);
        if (!got.ok() || !Matches(*got, sample)) {
          errors.fetch_add(1);
          continue;
        }
        bytes.fetch_add(got->size());
      }
    });
  }
  for (auto& t : threads)
    t.join();
  double peer_bps =
      static_cast<double>(bytes.load()) / std::chrono::duration<double>(Clock::now() - t0).count();

  // Latency, 4 KiB samples.
  std::vector<double> lat;
  const uint64_t small = uint64_t{4 << 10} << 40;
  for (uint64_t i = 0; i < 2000; ++i) {
    auto s = Clock::now();
    auto got = client.Read(0, small | i);
    lat.push_back(std::chrono::duration<double, std::micro>(Clock::now() - s).count());
    if (!got.ok() || !Matches(*got, small | i)) errors.fetch_add(1);
  }
  std::sort(lat.begin(), lat.end());
  std::printf("peer_bench: provider %s, %d reads in flight, %d s\n", client.provider().c_str(),
              inflight, seconds);
  std::printf("peer read 128 KiB: %.1f MB/s (%llu errors)\n", peer_bps / 1e6,
              static_cast<unsigned long long>(errors.load()));
  std::printf("peer read 4 KiB latency: median %.1f us, p99 %.1f us\n", lat[lat.size() / 2],
              lat[lat.size() * 99 / 100]);
  n0->reset();
  n1->reset();
  if (iperf) {
    double ip = Iperf(seconds);
    if (ip <= 0) {
      std::printf("iperf3: not available (install iperf3)\n");
    } else {
      std::printf("iperf3 loopback: %.1f MB/s; peer/iperf3 = %.3f\n", ip / 1e6, peer_bps / ip);
    }
  }
  return errors.load() == 0 ? 0 : 1;
}
