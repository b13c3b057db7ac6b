// link_start_bench: what one more peer costs a daemon's peer link at start-up. One hub (node 0, a
// fresh process running nopfsd's own peer start: PeerService::Start, then WaitForPeers) starts
// after K peers (nodes 1..K, PeerLinks in other processes, already listening), handshakes with
// each of them while each handshakes with it (as every nopfsd does with every other), and reports
// its wall time from its launch to WaitForPeers' return, its CPU time and its resident memory; a
// least-squares fit over K gives the cost per peer. Loopback, tcp;ofi_rxm.
//
//   link_start_bench [--peers 1,8,32,64,128] [--trials 1] [--per-process 32]
//
// The peers stand in for other hosts: each has made its first send (which grows ofi_rxm's send
// buffer pool) before the hub starts, runs without serving threads and pre-posts 64 receive
// buffers instead of nopfsd's 1,024 (about 38 MB per peer link instead of 55); the hub runs with
// nopfsd's settings (fabric::kLibfabricDefaults). Each peer, once the hub listens, reads a sample
// from it (the read starts its handshake with the hub; the hub, not serving yet, answers "not
// available", as nopfsd does before its tiers exist), so the hub serves K handshakes as well as
// making K.
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "fabric/loopback_port.h"
#include "fabric/peer_link.h"
#include "service/peers/peers.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kUsage =
    "usage: link_start_bench [--peers 1,8,32,64,128] [--trials 1] [--per-process 32]\n"
    "  --peers K,...     peer counts, each run with a fresh hub and fresh peers\n"
    "  --trials N        runs per peer count\n"
    "  --per-process P   peer links per peer process\n";

// The secret every node of the benchmark's job shares.
nopfs::fabric::Secret BenchSecret() {
  nopfs::fabric::Secret s;
  s.fill(0x42);
  return s;
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

// VmRSS of this process, bytes (0 if unknown).
uint64_t RssBytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10) << 10;
  }
  return 0;
}

double Seconds(const timeval& t) {
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6;
}

double CpuSeconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return Seconds(u.ru_utime) + Seconds(u.ru_stime);
}

std::vector<nopfs::fabric::PeerAddress> ParseList(const char* text) {
  auto list = nopfs::fabric::ParsePeerList(text);
  if (!list.ok()) {
    std::fprintf(stderr, "link_start_bench: %s\n", list.status().ToString().c_str());
    std::exit(2);
  }
  return *list;
}

// A line from `in` without its newline ("" at the end of the stream).
std::string ReadLine(FILE* in) {
  char buf[512];
  if (std::fgets(buf, sizeof(buf), in) == nullptr) return "";
  std::string s = buf;
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

// Reads sample 1 from node `from` on every link at once (one thread each); how many were answered
// "not available" (the handshake passed and the node answered the read).
int ReadFromAll(const std::vector<std::unique_ptr<nopfs::fabric::PeerLink>>& links, uint32_t from) {
  std::vector<int> ok(links.size(), 0);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < links.size(); ++i) {
    threads.emplace_back([&, i] {
      auto got = links[i]->Read(from, 1);
      ok[i] = !got.ok() && got.status().code() == nopfs::StatusCode::kNotFound;
      if (!ok[i]) {
        std::fprintf(stderr, "link_start_bench: node %u reading from node %u: %s\n",
                     links[i]->node(), from,
                     got.ok() ? "read a sample" : got.status().ToString().c_str());
      }
    });
  }
  for (std::thread& t : threads)
    t.join();
  return static_cast<int>(std::count(ok.begin(), ok.end(), 1));
}

// --role peers: nodes first..first+count-1 of the hub's list. Each link first handshakes with a
// warm-up node of this process (node K+1, known to the peers only: the MACs bind the two node
// numbers, not the list), so that its first send's buffer pool is grown (17 MB zeroed) before the
// hub starts, as a daemon on another host would have done on its own cores. Then prints
// "ready", reads from node 0 on "go", prints "done OK" and exits on "quit".
int RunPeers(const char* list_text, uint32_t first, uint32_t count, uint16_t warm_port) {
  std::vector<nopfs::fabric::PeerAddress> list = ParseList(list_text);
  const auto warm = static_cast<uint32_t>(list.size());
  list.push_back({"127.0.0.1", warm_port});
  const auto start = [&](uint32_t node) {
    nopfs::fabric::PeerLinkOptions o;
    o.node = node;
    o.peers = list;
    o.secret = BenchSecret();
    o.timeout = std::chrono::milliseconds(30000);
    o.serve_threads = 0;
    auto link = nopfs::fabric::PeerLink::Start(o, [](uint64_t) {
      return nopfs::fabric::ServeResult::Refused(nopfs::fabric::ReadStatus::kNotAvailable);
    });
    if (!link.ok()) {
      std::printf("error node %u: %s\n", node, link.status().ToString().c_str());
      std::exit(1);
    }
    return std::move(*link);
  };
  std::unique_ptr<nopfs::fabric::PeerLink> warm_link = start(warm);
  std::vector<std::unique_ptr<nopfs::fabric::PeerLink>> links;
  for (uint32_t node = first; node < first + count; ++node)
    links.push_back(start(node));
  if (ReadFromAll(links, warm) != static_cast<int>(count)) return 1;
  std::printf("ready\n");
  std::fflush(stdout);
  if (ReadLine(stdin) != "go") return 1;
  std::printf("done %d\n", ReadFromAll(links, 0));
  std::fflush(stdout);
  ReadLine(stdin);  // "quit" or the end of the stream
  return 0;
}

// --role hub: node 0, as nopfsd starts its peers. Prints "listening" after Start, then
// "result <listening_s> <joined_s> <cpu_listening_s> <cpu_s> <rss_listening> <rss_joined> <ok>"
// (seconds from `launched`, the coordinator's clock when it forked this process), then, on "quit"
// (every peer has read), "after <cpu_s> <rss>" and exits.
int RunHub(const char* list_text, int64_t launched) {
  (void)nopfs::fabric::SetLibfabricDefaults();  // nopfsd does this at its start
  nopfs::service::PeerServiceOptions po;
  po.node = 0;
  po.peers = ParseList(list_text);
  po.secret = BenchSecret();
  auto ps = nopfs::service::PeerService::Start(po);
  if (!ps.ok()) {
    std::printf("error %s\n", ps.status().ToString().c_str());
    return 1;
  }
  const int64_t listening = NowNs();
  const double cpu_listening = CpuSeconds();
  const uint64_t rss_listening = RssBytes();
  std::printf("listening\n");
  std::fflush(stdout);
  const nopfs::Status joined = (*ps)->WaitForPeers(Clock::now() + std::chrono::seconds(120));
  const int64_t done = NowNs();
  const double cpu = CpuSeconds();
  const uint64_t rss_joined = RssBytes();
  if (!joined.ok()) std::fprintf(stderr, "link_start_bench: hub: %s\n", joined.ToString().c_str());
  std::printf("result %.6f %.6f %.6f %.6f %" PRIu64 " %" PRIu64 " %d\n",
              static_cast<double>(listening - launched) / 1e9,
              static_cast<double>(done - launched) / 1e9, cpu_listening, cpu, rss_listening,
              rss_joined, joined.ok() ? 1 : 0);
  std::fflush(stdout);
  ReadLine(stdin);
  std::printf("after %.6f %" PRIu64 "\n", CpuSeconds(), RssBytes());
  std::fflush(stdout);
  return 0;
}

// A child running this program with `args`, its stdin and stdout on pipes.
struct Child {
  pid_t pid = -1;
  FILE* in = nullptr;   // the child's stdin
  FILE* out = nullptr;  // the child's stdout
};

Child Spawn(const std::vector<std::string>& args, const std::vector<std::string>& env) {
  int to[2], from[2];
  if (::pipe2(to, O_CLOEXEC) != 0 || ::pipe2(from, O_CLOEXEC) != 0) {
    std::perror("link_start_bench: pipe");
    std::exit(1);
  }
  std::fflush(stdout);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(to[0], STDIN_FILENO);
    ::dup2(from[1], STDOUT_FILENO);
    for (const std::string& e : env)
      ::putenv(const_cast<char*>(e.c_str()));
    std::vector<char*> argv;
    for (const std::string& a : args)
      argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv("/proc/self/exe", argv.data());
    ::_exit(127);
  }
  ::close(to[0]);
  ::close(from[1]);
  return {pid, ::fdopen(to[1], "w"), ::fdopen(from[0], "r")};
}

void Send(const Child& c, const char* line) {
  std::fprintf(c.in, "%s\n", line);
  std::fflush(c.in);
}

// Waits for the child; adds its CPU seconds to `cpu` and its peak RSS (bytes) to `maxrss`.
bool Reap(Child& c, double* cpu = nullptr, double* maxrss = nullptr) {
  std::fclose(c.in);
  std::fclose(c.out);
  int status = 0;
  rusage u{};
  ::wait4(c.pid, &status, 0, &u);
  if (cpu != nullptr) *cpu += Seconds(u.ru_utime) + Seconds(u.ru_stime);
  if (maxrss != nullptr) *maxrss += static_cast<double>(u.ru_maxrss) * 1024;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

struct Run {
  uint32_t peers = 0;
  double listening_s = 0, joined_s = 0, cpu_listening_s = 0, cpu_s = 0, cpu_after_s = 0;
  double rss_listening = 0, rss_joined = 0, rss_after = 0;
  double peers_cpu_s = 0, peers_rss = 0;  // all peer processes together, start to exit
  bool ok = false;
};

// One run: K peers in processes of `per_process` links, then the hub.
Run Measure(uint32_t k, uint32_t per_process) {
  Run r;
  r.peers = k;
  // Distinct free ports: the K + 1 nodes', then one warm-up node's per peer process.
  const uint32_t processes = (k + per_process - 1) / per_process;
  std::vector<uint16_t> ports;
  while (ports.size() < k + 1 + processes) {
    const uint16_t port = nopfs::fabric::FreeLoopbackPort();
    if (std::find(ports.begin(), ports.end(), port) == ports.end()) ports.push_back(port);
  }
  std::string list;
  for (uint32_t i = 0; i <= k; ++i) {
    if (i != 0) list += ',';
    list += "127.0.0.1:";
    list += std::to_string(ports[i]);
  }
  std::vector<Child> peers;
  for (uint32_t first = 1; first <= k; first += per_process) {
    const uint32_t count = std::min(per_process, k + 1 - first);
    peers.push_back(Spawn({"link_start_bench", "--role", "peers", "--list", list, "--first",
                           std::to_string(first), "--count", std::to_string(count), "--warm-port",
                           std::to_string(ports[k + 1 + peers.size()])},
                          {"FI_OFI_RXM_MSG_RX_SIZE=64"}));
  }
  bool ok = true;
  for (Child& c : peers) {
    const std::string line = ReadLine(c.out);
    if (line != "ready") {
      std::fprintf(stderr, "link_start_bench: a peer process said \"%s\"\n", line.c_str());
      ok = false;
    }
  }
  Child hub;
  if (ok) {
    const int64_t launched = NowNs();
    hub = Spawn({"link_start_bench", "--role", "hub", "--list", list, "--launched",
                 std::to_string(launched)},
                {});
    ok = ReadLine(hub.out) == "listening";
    for (Child& c : peers)
      Send(c, ok ? "go" : "quit");
    if (ok) {
      int joined = 0;
      ok = std::sscanf(ReadLine(hub.out).c_str(), "result %lf %lf %lf %lf %lf %lf %d",
                       &r.listening_s, &r.joined_s, &r.cpu_listening_s, &r.cpu_s, &r.rss_listening,
                       &r.rss_joined, &joined) == 7 &&
           joined == 1;
    }
    uint32_t read = 0;
    for (Child& c : peers) {
      unsigned n = 0;
      if (std::sscanf(ReadLine(c.out).c_str(), "done %u", &n) == 1) read += n;
    }
    ok = ok && read == k;
    if (read != k) std::fprintf(stderr, "link_start_bench: %u of %u peers read\n", read, k);
    Send(hub, "quit");
    ok = std::sscanf(ReadLine(hub.out).c_str(), "after %lf %lf", &r.cpu_after_s, &r.rss_after) ==
             2 &&
         ok;
    ok = Reap(hub) && ok;
  }
  for (Child& c : peers) {
    Send(c, "quit");
    ok = Reap(c, &r.peers_cpu_s, &r.peers_rss) && ok;
  }
  r.ok = ok;
  return r;
}

// The least-squares slope of y over x.
double Slope(const std::vector<double>& x, const std::vector<double>& y) {
  const double n = static_cast<double>(x.size());
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    sx += x[i];
    sy += y[i];
    sxx += x[i] * x[i];
    sxy += x[i] * y[i];
  }
  const double d = n * sxx - sx * sx;
  return d == 0 ? 0 : (n * sxy - sx * sy) / d;
}

}  // namespace

int main(int argc, char** argv) {
  // The children's roles.
  if (argc >= 2 && std::string(argv[1]) == "--role") {
    spdlog::set_level(spdlog::level::warn);
    std::string role, list;
    uint32_t first = 0, count = 0;
    int64_t launched = 0;
    uint16_t warm_port = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
      const std::string f = argv[i];
      if (f == "--role") role = argv[i + 1];
      if (f == "--list") list = argv[i + 1];
      if (f == "--first") first = static_cast<uint32_t>(std::atoi(argv[i + 1]));
      if (f == "--count") count = static_cast<uint32_t>(std::atoi(argv[i + 1]));
      if (f == "--launched") launched = std::atoll(argv[i + 1]);
      if (f == "--warm-port") warm_port = static_cast<uint16_t>(std::atoi(argv[i + 1]));
    }
    if (role == "peers") return RunPeers(list.c_str(), first, count, warm_port);
    if (role == "hub") return RunHub(list.c_str(), launched);
    return 2;
  }

  // A child that failed has closed its pipe: the write to it fails instead of killing this one.
  std::signal(SIGPIPE, SIG_IGN);
  std::vector<uint32_t> ks = {1, 8, 32, 64, 128};
  uint32_t trials = 1;
  uint32_t per_process = 32;
  nopfs::bench::ParseFlags(
      argc, argv, "link_start_bench", kUsage, [&](const std::string& f, const std::string& v) {
        if (f == "--peers") {
          ks.clear();
          for (size_t at = 0; at <= v.size();) {
            const size_t comma = std::min(v.find(',', at), v.size());
            const int k = std::atoi(v.substr(at, comma - at).c_str());
            if (k < 1) return false;
            ks.push_back(static_cast<uint32_t>(k));
            at = comma + 1;
          }
          return !ks.empty();
        }
        if (f == "--trials") return (trials = static_cast<uint32_t>(std::atoi(v.c_str()))) >= 1;
        if (f == "--per-process") {
          return (per_process = static_cast<uint32_t>(std::atoi(v.c_str()))) >= 1;
        }
        return false;
      });

  std::printf(
      "link_start_bench: one hub (nopfsd's PeerService) and K peers, tcp;ofi_rxm on "
      "loopback, %u peer links per peer process\n",
      per_process);
  std::printf("%6s %12s %10s %10s %10s %12s %7s %10s %9s %12s %13s\n", "peers", "listening_s",
              "joined_s", "cpu_start", "cpu_wait", "cpu_after_s", "rss_MB", "rss_joined",
              "rss_after", "peers_cpu_s", "peers_rss_MB");
  std::vector<double> x, wall, wait, cpu, cpu_wait, cpu_after, rss;
  bool all_ok = true;
  for (uint32_t k : ks) {
    for (uint32_t t = 0; t < trials; ++t) {
      const Run r = Measure(k, per_process);
      if (!r.ok) {
        std::printf("%6u failed (see above)\n", k);
        all_ok = false;
        continue;
      }
      std::printf("%6u %12.3f %10.3f %10.3f %10.3f %12.3f %7.1f %10.1f %9.1f %12.3f %13.1f\n", k,
                  r.listening_s, r.joined_s, r.cpu_listening_s, r.cpu_s - r.cpu_listening_s,
                  r.cpu_after_s, r.rss_listening / 1e6, r.rss_joined / 1e6, r.rss_after / 1e6,
                  r.peers_cpu_s, r.peers_rss / 1e6);
      std::fflush(stdout);
      x.push_back(k);
      wall.push_back(r.joined_s);
      wait.push_back(r.joined_s - r.listening_s);
      cpu.push_back(r.cpu_s);
      cpu_wait.push_back(r.cpu_s - r.cpu_listening_s);
      cpu_after.push_back(r.cpu_after_s);
      rss.push_back(r.rss_after);
    }
  }
  std::printf(
      "(seconds from the hub's launch; cpu_start: the hub's CPU to listening, cpu_wait: in "
      "WaitForPeers, cpu_after_s: in all, once every peer has read; MB resident)\n");
  if (x.size() >= 2) {
    std::printf(
        "per peer (least squares over K): wall to WaitForPeers' return %.2f ms (in it %.2f ms), "
        "hub CPU %.2f ms (in WaitForPeers %.2f ms; with the peers' reads %.2f ms), hub memory "
        "%.0f KB\n",
        1e3 * Slope(x, wall), 1e3 * Slope(x, wait), 1e3 * Slope(x, cpu), 1e3 * Slope(x, cpu_wait),
        1e3 * Slope(x, cpu_after), Slope(x, rss) / 1e3);
  }
  return all_ok ? 0 : 1;
}
