// peer_bench: peer read throughput and latency between two PeerLinks (two nopfsd peer services in
// one process) over the loopback fabric, against iperf3 over the same loopback in the same run.
//
//   peer_bench [--seconds S] [--rounds R] [--inflight N] [--no-iperf]
//              [--only rma|in-place|replies|replies-pool] [--pool]
//
// (--only measures that path alone, without the socket reads; --pool adds "replies-pool".)
//
// Three paths, each with its own pair of links: "in-place", as nopfsd serves RAM-tier samples on
// tcp (node 0 sends a reply straight from the memory, with the recorded xxh3, which node 1
// checks); "rma", as it serves them where the nodes ask for RMA reads (node 0 answers with the
// sample's place in memory it exposed, node 1 fetches it with an RMA read and checks its xxh3);
// and "replies", as it serves SSD-tier samples: the bytes read from a file (the SSD tier's data
// file, here in the page cache) and checked against their recorded xxh3, as a tier read, and the
// reply carries them; read on the progress thread with preadv2(RWF_NOWAIT) (serve_nowait), by a
// serving thread only where that would block. "replies-pool" (with --pool) is the same without
// serve_nowait: every read handed to a serving thread and back. Throughput: node 1 keeps N reads of
// distinct 128 KiB samples in flight (N threads) for S seconds, each read into a buffer of the
// reader's (as into a tier slot) and checked byte for byte. Baseline: `iperf3 -c 127.0.0.1 -t S`
// (one TCP stream) against an iperf3 server started here, or, without iperf3, a TCP stream of this
// program's own (a thread writing 128 KiB at a time to a thread reading it). "tcp-reads" does the
// paths' reads over a plain TCP socket (a 16-byte request, a 128 KiB reply, N outstanding on one
// connection): what the request and reply themselves cost on this wire, without libfabric or
// nopfs's protocol. Each round measures the baseline, the socket reads and every path back to back
// (in a rotating order), so that a ratio compares figures taken under the same load; the summary
// gives every round's ratios and their medians. Each measure also reports the CPU time the whole
// transfer took (both ends: this process's threads, or iperf3's two processes) per 128 KiB moved,
// which a busy machine changes less than the throughput. Latency: one thread, sequential 4 KiB
// reads, median and p99.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <xxhash.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/checksum.h"
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

double CpuSeconds(int who) {
  rusage u{};
  ::getrusage(who, &u);
  const auto sec = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6; };
  return sec(u.ru_utime) + sec(u.ru_stime);
}

constexpr double kChunk = 128 << 10;  // bytes a CPU figure is given per

// A throughput figure and the CPU time it cost per 128 KiB moved (both ends).
struct Rate {
  double bytes_per_s = 0;
  double cpu_us_per_chunk = 0;
};

// iperf3's throughput (receiver side) and its two processes' CPU time, or nullopt without iperf3.
std::optional<Rate> Iperf(int seconds) {
  uint16_t port = nopfs::fabric::FreeLoopbackPort();
  std::fflush(stdout);
  const double cpu0 = CpuSeconds(RUSAGE_CHILDREN);
  pid_t server = ::fork();
  if (server == 0) {
    int null = ::open("/dev/null", O_WRONLY);
    if (null >= 0) ::dup2(null, STDOUT_FILENO);
    if (null >= 0) ::dup2(null, STDERR_FILENO);
    std::string p = std::to_string(port);
    ::execlp("iperf3", "iperf3", "-s", "-1", "-p", p.c_str(), "-B", "127.0.0.1", nullptr);
    ::_exit(127);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::string out = Run("iperf3 -J -c 127.0.0.1 -p " + std::to_string(port) + " -t " +
                        std::to_string(seconds) + " 2>/dev/null");
  int status = 0;
  if (out.empty()) ::kill(server, SIGTERM);  // no client ran: the server would wait for ever
  ::waitpid(server, &status, 0);
  const double cpu = CpuSeconds(RUSAGE_CHILDREN) - cpu0;
  // The receiver's summary: end.sum_received.bits_per_second and .bytes.
  const nopfs::Json doc = nopfs::Json::parse(out, nullptr, /*allow_exceptions=*/false);
  const nopfs::Json::json_pointer rate("/end/sum_received/bits_per_second");
  const nopfs::Json::json_pointer bytes("/end/sum_received/bytes");
  if (doc.is_discarded() || !doc.contains(rate) || !doc[rate].is_number() || !doc.contains(bytes) ||
      !doc[bytes].is_number() || doc[bytes].get<double>() <= 0) {
    return std::nullopt;
  }
  return Rate{doc[rate].get<double>() / 8, cpu / (doc[bytes].get<double>() / kChunk) * 1e6};
}

// A TCP socket listening on a free loopback port (its address in *a), or -1.
int ListenOnLoopback(sockaddr_in* a) {
  const int lsock = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  *a = sockaddr_in{};
  a->sin_family = AF_INET;
  a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof *a;
  if (lsock < 0 || ::bind(lsock, reinterpret_cast<sockaddr*>(a), sizeof *a) != 0 ||
      ::listen(lsock, 1) != 0 || ::getsockname(lsock, reinterpret_cast<sockaddr*>(a), &len) != 0) {
    if (lsock >= 0) ::close(lsock);
    return -1;
  }
  return lsock;
}

// Without iperf3: one TCP stream over loopback between two threads of this process, 128 KiB
// writes and reads (iperf3's defaults), for `seconds`.
Rate SocketStream(int seconds) {
  Rate out;
  sockaddr_in a{};
  const int lsock = ListenOnLoopback(&a);
  if (lsock < 0) return out;
  std::atomic<uint64_t> received{0};
  const double cpu0 = CpuSeconds(RUSAGE_SELF);
  const auto t0 = Clock::now();
  std::thread reader([&] {
    const int c = ::accept4(lsock, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) return;
    std::vector<char> buf(128 << 10);
    ssize_t n;
    while ((n = ::recv(c, buf.data(), buf.size(), 0)) > 0)
      received.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
    ::close(c);
  });
  const int w = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (w >= 0 && ::connect(w, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    std::vector<char> buf(128 << 10, 'x');
    const auto until = t0 + std::chrono::seconds(seconds);
    while (Clock::now() < until) {
      if (::send(w, buf.data(), buf.size(), MSG_NOSIGNAL) < 0) break;
    }
  }
  if (w >= 0) ::shutdown(w, SHUT_WR);
  reader.join();
  if (w >= 0) ::close(w);
  ::close(lsock);
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  const double bytes = static_cast<double>(received.load());
  if (bytes <= 0) return out;
  out.bytes_per_s = bytes / secs;
  out.cpu_us_per_chunk = (CpuSeconds(RUSAGE_SELF) - cpu0) / (bytes / kChunk) * 1e6;
  return out;
}

// The same reads over a plain TCP socket, without libfabric or nopfs's protocol: what a read
// protocol's request and reply cost on this wire. One connection; the reader keeps `inflight`
// 16-byte requests (a sample id) outstanding and reads each 128 KiB reply into its buffer and
// checks it as the paths do; the server writes each reply from the pattern (in place, as a RAM
// tier serves). TCP_NODELAY on both ends, as libfabric's tcp provider sets it.
Rate SocketReads(int seconds, int inflight) {
  Rate out;
  sockaddr_in a{};
  const int lsock = ListenOnLoopback(&a);
  if (lsock < 0) return out;
  const int one = 1;
  const uint64_t big = uint64_t{128 << 10} << 40;
  std::thread server([&] {
    const int c = ::accept4(lsock, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) return;
    ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    uint64_t req[2];
    while (::recv(c, req, sizeof req, MSG_WAITALL) == static_cast<ssize_t>(sizeof req)) {
      const std::span<const std::byte> e = Expected(req[0]);
      if (::send(c, e.data(), e.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(e.size())) break;
    }
    ::close(c);
  });
  const int w = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  uint64_t reads = 0;
  const double cpu0 = CpuSeconds(RUSAGE_SELF);
  const auto t0 = Clock::now();
  if (w >= 0 && ::connect(w, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    ::setsockopt(w, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    std::vector<std::byte> dst(128 << 10);
    uint64_t sent = 0, got = 0;
    const auto request = [&] {
      const uint64_t req[2] = {big | sent++, 0};
      return ::send(w, req, sizeof req, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof req);
    };
    bool ok = true;
    for (int i = 0; i < inflight && ok; ++i)
      ok = request();
    const auto until = t0 + std::chrono::seconds(seconds);
    while (ok) {
      if (::recv(w, dst.data(), dst.size(), MSG_WAITALL) != static_cast<ssize_t>(dst.size())) break;
      if (Matches(dst, big | got)) ++reads;
      ++got;
      if (Clock::now() < until) {
        ok = request();
      } else if (got == sent) {
        break;
      }
    }
  }
  if (w >= 0) ::close(w);
  server.join();
  ::close(lsock);
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  if (reads == 0) return out;
  out.bytes_per_s = static_cast<double>(reads) * kChunk / secs;
  out.cpu_us_per_chunk = (CpuSeconds(RUSAGE_SELF) - cpu0) / static_cast<double>(reads) * 1e6;
  return out;
}

// How node 0 answers a read of a sample: "rma", in place (from memory node 0 exposed) by an RMA
// read; "in-place", in place by a reply sent straight from that memory; "replies", read from a
// file into the reply (an SSD-tier read), on the progress thread where the read does not block;
// "replies-pool", the same always on a serving thread.
enum class Mode { kRma, kInPlace, kReplies, kRepliesPool };
const char* NameOf(Mode m) {
  return m == Mode::kRma       ? "rma"
         : m == Mode::kInPlace ? "in-place"
         : m == Mode::kReplies ? "replies"
                               : "replies-pool";
}
bool IsReplies(Mode m) {
  return m == Mode::kReplies || m == Mode::kRepliesPool;
}

// The SSD tier's data file: the pattern in an unlinked file (in the page cache once written);
// sample s is at offset s % 251, as in Pattern(). -1 if it cannot be made.
int PatternFile() {
  static const int fd = [] {
    const char* dir = std::getenv("TMPDIR");
    std::string path =
        std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") + "/nopfs_peer_bench.XXXXXX";
    const int f = ::mkstemp(path.data());
    if (f < 0) return -1;
    ::unlink(path.c_str());
    const std::vector<std::byte>& p = Pattern();
    if (::pwrite(f, p.data(), p.size(), 0) != static_cast<ssize_t>(p.size())) {
      ::close(f);
      return -1;
    }
    return f;
  }();
  return fd;
}

// Reads `sample` from the pattern file into a reply's bytes and checks it against its recorded
// xxh3, as nopfsd's SSD tier does (service/peers/peers.cc); `nowait`: preadv2(RWF_NOWAIT), and
// WouldBlock where the bytes are not all in the page cache.
ServeResult ReadFromFile(uint64_t sample, bool nowait) {
  const uint64_t size = std::min(sample >> 40, kMaxBenchSample);
  std::vector<std::byte> b(size);
  const auto off = static_cast<off_t>(sample % 251);
  ssize_t got;
  if (nowait) {
    iovec iov{b.data(), b.size()};
    got = ::preadv2(PatternFile(), &iov, 1, off, RWF_NOWAIT);
    if (got != static_cast<ssize_t>(size)) return ServeResult::WouldBlock();
  } else {
    got = ::pread(PatternFile(), b.data(), b.size(), off);
  }
  if (got != static_cast<ssize_t>(size) || nopfs::Xxh3(b) != RecordedXxh3(sample)) {
    return ServeResult::Refused(nopfs::fabric::ReadStatus::kError);
  }
  const uint64_t h = RecordedXxh3(sample);
  return ServeResult::Verified(std::move(b), h);
}

// One path: a pair of links (node 0 serves, node 1 reads), kept for every round.
class Path {
 public:
  static std::unique_ptr<Path> Start(Mode mode) {
    auto p = std::unique_ptr<Path>(new Path());
    p->mode_ = mode;
    std::vector<nopfs::fabric::PeerAddress> peers{{"127.0.0.1", nopfs::fabric::FreeLoopbackPort()},
                                                  {"127.0.0.1", nopfs::fabric::FreeLoopbackPort()}};
    auto opts = [&](uint32_t node) {
      nopfs::fabric::PeerLinkOptions o;
      o.node = node;
      o.peers = peers;
      o.secret.fill(0x42);
      o.timeout = std::chrono::milliseconds(5000);
      o.remote_read = !IsReplies(mode);
      // RMA even where the provider does it in software (tcp), to measure it there.
      o.rma_in_software = mode == Mode::kRma;
      // As nopfsd: samples in memory (a RAM tier) are answered on the progress thread, the others
      // (an SSD tier's read) by the serving threads.
      o.serve_inline = [mode](uint64_t) { return !IsReplies(mode); };
      if (mode == Mode::kReplies) {
        o.serve_nowait = [](uint64_t sample) { return ReadFromFile(sample, true); };
      }
      return o;
    };
    // Replies: the bytes read from the file and checked against their recorded xxh3, as an SSD
    // tier's read.
    nopfs::fabric::ServeFn serve = [mode](uint64_t sample) {
      if (!IsReplies(mode)) {
        return ServeResult::InPlace(Expected(sample), RecordedXxh3(sample));
      }
      return ReadFromFile(sample, false);
    };
    if (IsReplies(mode) && PatternFile() < 0) {
      std::fprintf(stderr, "peer_bench: cannot write the SSD tier's file in $TMPDIR or /tmp\n");
      return nullptr;
    }
    auto n0 = PeerLink::Start(opts(0), serve);
    auto n1 = PeerLink::Start(opts(1), serve);
    if (!n0.ok() || !n1.ok()) {
      std::fprintf(stderr, "peer_bench: %s %s\n", n0.status().ToString().c_str(),
                   n1.status().ToString().c_str());
      return nullptr;
    }
    p->server_ = std::move(*n0);
    p->client_ = std::move(*n1);
    if (!IsReplies(mode)) {
      const nopfs::Status st = p->server_->ExposeForRemoteRead(Pattern());
      if (!st.ok()) {
        std::fprintf(stderr, "peer_bench: no RMA: %s\n", st.ToString().c_str());
        return nullptr;
      }
    }
    // The handshake and the first messages' buffers, outside the measurement.
    std::vector<std::byte> dst(4 << 10);
    if (!p->client_->ReadInto(0, (uint64_t{4 << 10} << 40) | 1, dst).ok()) {
      std::fprintf(stderr, "peer_bench: the first read failed\n");
      return nullptr;
    }
    return p;
  }

  // N readers of distinct 128 KiB samples for `seconds`.
  Rate Throughput(int seconds, int inflight) {
    const uint64_t big = uint64_t{128 << 10} << 40;
    std::atomic<uint64_t> bytes{0};
    const auto until = Clock::now() + std::chrono::seconds(seconds);
    const double cpu0 = CpuSeconds(RUSAGE_SELF);
    const auto t0 = Clock::now();
    std::vector<std::thread> threads;
    for (int t = 0; t < inflight; ++t) {
      threads.emplace_back([&] {
        std::vector<std::byte> dst(128 << 10);
        while (Clock::now() < until) {
          uint64_t sample = big | next_.fetch_add(1);
          auto got = client_->ReadInto(0, sample, dst);
          if (!got.ok() || !Matches(dst, sample)) {
            errors_.fetch_add(1);
            continue;
          }
          bytes.fetch_add(dst.size());
        }
      });
    }
    for (auto& t : threads)
      t.join();
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    Rate r;
    r.bytes_per_s = static_cast<double>(bytes.load()) / secs;
    if (bytes.load() > 0) {
      r.cpu_us_per_chunk =
          (CpuSeconds(RUSAGE_SELF) - cpu0) / (static_cast<double>(bytes.load()) / kChunk) * 1e6;
    }
    return r;
  }

  // Sequential 4 KiB reads: median and p99 in microseconds.
  std::pair<double, double> Latency() {
    std::vector<double> lat;
    const uint64_t small = uint64_t{4 << 10} << 40;
    std::vector<std::byte> dst(4 << 10);
    for (uint64_t i = 0; i < 2000; ++i) {
      const uint64_t sample = small | (next_.fetch_add(1) & 0xffffff);
      auto s = Clock::now();
      auto got = client_->ReadInto(0, sample, dst);
      lat.push_back(std::chrono::duration<double, std::micro>(Clock::now() - s).count());
      if (!got.ok() || !Matches(dst, sample)) errors_.fetch_add(1);
    }
    std::sort(lat.begin(), lat.end());
    return {lat[lat.size() / 2], lat[lat.size() * 99 / 100]};
  }

  uint64_t errors() const { return errors_.load(); }
  Mode mode() const { return mode_; }
  uint64_t remote() const { return client_->counters().fetched_remote; }
  uint64_t in_place() const { return server_->counters().served_in_place; }
  uint64_t nowait() const { return server_->counters().served_nowait; }
  uint64_t served() const { return server_->counters().served_reads; }
  const std::string& provider() const { return client_->provider(); }

 private:
  Path() = default;
  Mode mode_ = Mode::kReplies;
  std::unique_ptr<PeerLink> server_;
  std::unique_ptr<PeerLink> client_;
  std::atomic<uint64_t> next_{0};
  std::atomic<uint64_t> errors_{0};
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 == 1 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  int seconds = 3;
  int rounds = 3;
  int inflight = 8;
  bool iperf = true;
  bool pool = false;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--seconds" && i + 1 < argc) {
      seconds = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--rounds" && i + 1 < argc) {
      rounds = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--inflight" && i + 1 < argc) {
      inflight = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--no-iperf") {
      iperf = false;
    } else if (a == "--pool") {
      pool = true;
    } else if (a == "--only" && i + 1 < argc &&
               (std::string(argv[i + 1]) == "rma" || std::string(argv[i + 1]) == "in-place" ||
                std::string(argv[i + 1]) == "replies" ||
                std::string(argv[i + 1]) == "replies-pool")) {
      only = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: peer_bench [--seconds S] [--rounds R] [--inflight N] [--no-iperf] "
                   "[--only rma|in-place|replies|replies-pool] [--pool]\n");
      return 2;
    }
  }
  spdlog::set_level(spdlog::level::warn);
  struct Entry {
    std::string name;
    std::unique_ptr<Path> path;  // null: the baseline
    std::vector<double> rates, cpus, ratios;
  };
  std::vector<Entry> entries;
  std::string baseline;
  if (iperf) {
    baseline = Run("command -v iperf3").empty() ? "tcp" : "iperf3";
    entries.push_back({baseline, nullptr, {}, {}, {}});
  }
  // The same reads over a plain socket (not with --only, which looks at one path alone).
  if (only.empty()) entries.push_back({"tcp-reads", nullptr, {}, {}, {}});
  uint64_t errors = 0;
  for (const Mode mode : {Mode::kRma, Mode::kInPlace, Mode::kReplies, Mode::kRepliesPool}) {
    const std::string name = NameOf(mode);
    if (!only.empty() && only != name) continue;
    if (only.empty() && mode == Mode::kRepliesPool && !pool) continue;
    auto p = Path::Start(mode);
    if (p == nullptr) return 1;
    entries.push_back({name, std::move(p), {}, {}, {}});
  }
  std::printf("peer_bench: provider %s, %d reads of 128 KiB in flight, %d rounds of %d s each%s\n",
              entries.back().path ? entries.back().path->provider().c_str() : "?", inflight, rounds,
              seconds,
              baseline == "tcp" ? "; iperf3 not installed: the baseline is a TCP stream of "
                                  "this program's own"
                                : "");
  for (int r = 0; r < rounds; ++r) {
    double base = 0;
    std::string line;
    for (size_t k = 0; k < entries.size(); ++k) {
      Entry& e = entries[(k + static_cast<size_t>(r)) % entries.size()];
      Rate rate;
      if (e.name == "tcp-reads") {
        rate = SocketReads(seconds, inflight);
      } else if (e.path == nullptr) {
        rate = baseline == "iperf3" ? Iperf(seconds).value_or(Rate{}) : SocketStream(seconds);
        base = rate.bytes_per_s;
      } else {
        rate = e.path->Throughput(seconds, inflight);
      }
      e.rates.push_back(rate.bytes_per_s);
      e.cpus.push_back(rate.cpu_us_per_chunk);
    }
    for (Entry& e : entries) {
      const bool ratio = base > 0 && e.name != baseline;
      if (ratio) e.ratios.push_back(e.rates.back() / base);
      char buf[160];
      std::snprintf(buf, sizeof buf, "%s%s %.1f MB/s (%.1f us CPU per 128 KiB)",
                    line.empty() ? "" : "; ", e.name.c_str(), e.rates.back() / 1e6, e.cpus.back());
      line += buf;
      if (ratio) {
        std::snprintf(buf, sizeof buf, ", %s/%s = %.3f", e.name.c_str(), baseline.c_str(),
                      e.ratios.back());
        line += buf;
      }
    }
    std::printf("round %d: %s\n", r + 1, line.c_str());
    std::fflush(stdout);
  }
  for (Entry& e : entries) {
    std::printf("%s: median %.1f MB/s, %.1f us CPU per 128 KiB", e.name.c_str(),
                Median(e.rates) / 1e6, Median(e.cpus));
    if (!e.ratios.empty()) {
      std::printf("; %s/%s median %.3f (rounds:", e.name.c_str(), baseline.c_str(),
                  Median(e.ratios));
      for (double x : e.ratios)
        std::printf(" %.3f", x);
      std::printf(")");
    }
    std::printf("\n");
  }
  for (Entry& e : entries) {
    if (e.path == nullptr) continue;
    const auto [median, p99] = e.path->Latency();
    errors += e.path->errors();
    std::printf("peer read 4 KiB latency (%s): median %.1f us, p99 %.1f us\n", e.name.c_str(),
                median, p99);
    std::printf(
        "%s: %llu errors, %llu reads by RMA, %llu sent from memory, %llu of %llu served without "
        "a serving thread (serve_nowait)\n",
        e.name.c_str(), static_cast<unsigned long long>(e.path->errors()),
        static_cast<unsigned long long>(e.path->remote()),
        static_cast<unsigned long long>(e.path->in_place()),
        static_cast<unsigned long long>(e.path->nowait()),
        static_cast<unsigned long long>(e.path->served()));
    // Each path must have gone the way it is named for (the rma path's 4 KiB reads, under
    // remote_read_min, come in replies sent from memory).
    const Mode m = e.path->mode();
    if ((m == Mode::kRma) != (e.path->remote() > 0) || !IsReplies(m) != (e.path->in_place() > 0) ||
        (m == Mode::kReplies) != (e.path->nowait() > 0)) {
      std::printf("peer_bench: the %s path did not go its way\n", e.name.c_str());
      ++errors;
    }
  }
  return errors == 0 ? 0 : 1;
}
