// peer_forge: an attacker without a job's secret, for the cluster test of the peer protocol's
// authentication (tests/slurm/security_peer_test.py). It opens a tcp;ofi_rxm endpoint of its own
// on a loopback port the kernel picks and, for a bounded time and number of messages, sends to
// every target node every kind of peer message (fabric/peer_protocol.h) in the name of every node
// it is told to impersonate: Hellos, Challenges and Auths with made-up nonces and MACs, AuthResult
// refusals, PushSamples of bytes of its choice with their own correct xxh3, ReadRequests,
// ReadReplies and RemoteReplies, ExchangeData of made-up rounds (some a few MB large), ClassDones,
// and Leaves and LeaveAcks (a node that took a Leave would stop reading from the one named). Half
// of the sealed messages carry an empty authentication block, half one sealed under a key of its
// own with increasing sequence numbers.
//
//   nopfs_peer_forge --to HOST:PORT [--to ...] --as NODE [--as ...] [--seconds S]
//                    [--samples N | --dataset DIR] [--pushes-per-round P] [--large-bytes B]
//                    [--max-messages M] [--stop-file PATH [--min-rounds R]]
//
// With --dataset (an ImageFolder the attacker can list, as the job's users can), sample i's pushes
// and replies have the length of the i-th file in the catalog's order (classes, then files, by
// name), so that a receiver that checked only lengths and the sender's own xxh3 would keep them.
//
// Between rounds it receives whatever comes back to its endpoint and prints each message (a
// daemon that answers a forger would show here). It ends after S seconds (default 10, at most
// 120), after M messages (default 200000), or as soon as PATH exists and it has sent at least R
// rounds (default 0; so that a slow machine still sees the whole attack), and prints
//   peer_forge: sent N messages (...), F failed, H held back; received R messages
// Targets must be loopback addresses (127.0.0.0/8): this is a test tool, not a scanner.
//
// Thread safety: a single-threaded program.
#include <arpa/inet.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "fabric/endpoint.h"
#include "fabric/peer_protocol.h"

namespace {

using namespace nopfs::fabric;  // NOLINT(build/namespaces): a test program of this library
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

struct Target {
  std::string host;
  uint16_t port = 0;
  PeerAddr addr = 0;
};

struct Flags {
  std::vector<Target> to;
  std::vector<uint32_t> as;
  int seconds = 10;
  uint64_t samples = 120;
  std::vector<uint64_t> sizes;  // of each sample (--dataset); empty: 8 KiB each
  uint64_t pushes_per_round = 4;
  uint64_t large_bytes = uint64_t{4} << 20;
  uint64_t max_messages = 200000;
  std::string stop_file;
  uint64_t min_rounds = 0;
};

[[noreturn]] void Usage(const std::string& why) {
  std::fprintf(stderr,
               "peer_forge: %s\nusage: nopfs_peer_forge --to HOST:PORT [--to ...] --as NODE "
               "[--as ...] [--seconds S (1..120)] [--samples N | --dataset DIR] "
               "[--pushes-per-round P] [--large-bytes B] [--max-messages M] [--stop-file PATH "
               "[--min-rounds R]]\n",
               why.c_str());
  std::exit(2);
}

uint64_t Number(const char* flag, const char* text, uint64_t lo, uint64_t hi) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || text[0] == '-' || v < lo || v > hi)
    Usage(std::string(flag) + " " + text + ": write a whole number from " + std::to_string(lo) +
          " to " + std::to_string(hi));
  return v;
}

// The sizes of an ImageFolder's files in catalog order: class directories by name, then files by
// name within each (hidden entries skipped).
std::vector<uint64_t> DatasetSizes(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<fs::path> classes;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec))
    if (e.is_directory() && e.path().filename().string()[0] != '.') classes.push_back(e.path());
  if (ec) Usage("--dataset " + dir + ": " + ec.message());
  std::sort(classes.begin(), classes.end());
  std::vector<uint64_t> sizes;
  for (const fs::path& c : classes) {
    std::vector<fs::path> files;
    for (const fs::directory_entry& e : fs::directory_iterator(c, ec))
      if (e.is_regular_file() && e.path().filename().string()[0] != '.') files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const fs::path& p : files)
      sizes.push_back(std::min<uint64_t>(fs::file_size(p, ec), kMaxSampleBytes));
  }
  if (sizes.empty()) Usage("--dataset " + dir + ": no files in class directories");
  return sizes;
}

Flags Parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) Usage(a + " needs a value");
    const char* v = argv[++i];
    if (a == "--to") {
      const std::string s = v;
      const size_t colon = s.rfind(':');
      if (colon == std::string::npos) Usage(s + ": write HOST:PORT");
      Target t;
      t.host = s.substr(0, colon);
      t.port = static_cast<uint16_t>(Number("--to", s.c_str() + colon + 1, 1, 65535));
      in_addr ip{};
      if (inet_pton(AF_INET, t.host.c_str(), &ip) != 1 || (ntohl(ip.s_addr) >> 24) != 127)
        Usage(s + ": only loopback targets (127.0.0.0/8) are allowed");
      f.to.push_back(t);
    } else if (a == "--as") {
      f.as.push_back(static_cast<uint32_t>(Number("--as", v, 0, 65535)));
    } else if (a == "--seconds") {
      f.seconds = static_cast<int>(Number("--seconds", v, 1, 120));
    } else if (a == "--samples") {
      f.samples = Number("--samples", v, 1, 1000000);
    } else if (a == "--dataset") {
      f.sizes = DatasetSizes(v);
      f.samples = f.sizes.size();
    } else if (a == "--pushes-per-round") {
      f.pushes_per_round = Number("--pushes-per-round", v, 1, 64);
    } else if (a == "--large-bytes") {
      f.large_bytes = Number("--large-bytes", v, 1, uint64_t{16} << 20);
    } else if (a == "--max-messages") {
      f.max_messages = Number("--max-messages", v, 1, 10000000);
    } else if (a == "--stop-file") {
      f.stop_file = v;
    } else if (a == "--min-rounds") {
      f.min_rounds = Number("--min-rounds", v, 0, 100000);
    } else {
      Usage("unknown flag " + a);
    }
  }
  if (f.to.empty() || f.as.empty()) Usage("give at least one --to and one --as");
  return f;
}

const char* TypeName(PeerType t) {
  switch (t) {
    case PeerType::kHello:
      return "Hello";
    case PeerType::kChallenge:
      return "Challenge";
    case PeerType::kAuth:
      return "Auth";
    case PeerType::kAuthResult:
      return "AuthResult";
    case PeerType::kReadRequest:
      return "ReadRequest";
    case PeerType::kReadReply:
      return "ReadReply";
    case PeerType::kExchange:
      return "Exchange";
    case PeerType::kClassDone:
      return "ClassDone";
    case PeerType::kRemoteReply:
      return "RemoteReply";
    case PeerType::kPush:
      return "Push";
    case PeerType::kLeave:
      return "Leave";
    case PeerType::kLeaveAck:
      return "LeaveAck";
  }
  return "unknown";
}

Nonce Random() {
  return RandomNonce();
}

// The messages of one round in the name of `as`: every type of the protocol.
std::vector<std::vector<std::byte>> Round(uint64_t i, uint32_t as, const Flags& f,
                                          const std::vector<std::byte>& large) {
  auto evil = [&](uint64_t sample) {  // bytes of the attacker's choice, of the sample's length
    const uint64_t n = f.sizes.empty() ? 8192 : f.sizes[sample % f.sizes.size()];
    return std::vector<std::byte>(n, std::byte{0x66});
  };
  auto xxh3 = [](const std::vector<std::byte>& d) { return XXH3_64bits(d.data(), d.size()); };
  const uint64_t sample = i % f.samples;
  Mac made_up{};
  const Nonce n = Random();
  std::copy(n.begin(), n.end(), made_up.begin());
  std::vector<std::vector<std::byte>> m;
  m.push_back(Encode(Hello{as, Random()}));
  m.push_back(Encode(Challenge{Random(), made_up}));
  m.push_back(Encode(Auth{Random(), Random(), made_up}));
  m.push_back(Encode(AuthResult{false}));
  for (uint64_t k = 0; k < f.pushes_per_round; ++k) {
    const uint64_t s = (i * f.pushes_per_round + k) % f.samples;
    std::vector<std::byte> d = evil(s);
    const uint64_t h = xxh3(d);
    m.push_back(Encode(PushSample{s, h, std::move(d)}));
  }
  m.push_back(Encode(ReadRequest{i, sample, kAcceptsRemoteRead}));
  std::vector<std::byte> reply = evil(sample);
  const uint64_t reply_xxh3 = xxh3(reply);
  m.push_back(Encode(RemoteReply{i, sample, reply.size(), 0x10000, i * 7919, reply_xxh3}));
  m.push_back(Encode(ReadReply{i, sample, ReadStatus::kOk, reply_xxh3, std::move(reply)}));
  m.push_back(Encode(ClassDone{static_cast<uint32_t>(i % 3)}));
  std::vector<std::byte> ex = i % 25 == 0 ? large : evil(sample);
  m.push_back(Encode(ExchangeData{i + 1, xxh3(ex), std::move(ex)}));
  m.push_back(Encode(Leave{}));
  m.push_back(Encode(LeaveAck{}));
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f = Parse(argc, argv);
  spdlog::set_level(spdlog::level::warn);
  auto ep = Endpoint::Open({"tcp;ofi_rxm", "127.0.0.1", 0, /*remote_read=*/false});
  if (!ep.ok()) {
    std::fprintf(stderr, "peer_forge: cannot open an endpoint: %s\n",
                 ep.status().ToString().c_str());
    return 1;
  }
  for (Target& t : f.to) {
    auto a = (*ep)->AddPeer(t.host, t.port);
    if (!a.ok()) {
      std::fprintf(stderr, "peer_forge: %s:%u: %s\n", t.host.c_str(), t.port,
                   a.status().ToString().c_str());
      return 1;
    }
    t.addr = *a;
  }
  std::printf("peer_forge: from 127.0.0.1:%u to %zu nodes as %zu nodes\n", (*ep)->port(),
              f.to.size(), f.as.size());
  std::fflush(stdout);

  // A large buffer for made-up exchange rounds.
  const std::vector<std::byte> large(f.large_bytes, std::byte{0x77});
  SessionKey own_key(Random());  // "sealed" under a key that is not the session's
  uint64_t seq = 0, sent = 0, failed = 0, held = 0, received = 0;
  std::map<std::string, uint64_t> by_type;
  const auto deadline = Clock::now() + std::chrono::seconds(f.seconds);
  uint64_t rounds = 0;
  auto stop = [&] {
    struct stat st {};
    return Clock::now() >= deadline || sent >= f.max_messages ||
           (rounds >= f.min_rounds && !f.stop_file.empty() &&
            ::stat(f.stop_file.c_str(), &st) == 0);
  };
  for (uint64_t i = 1; !stop(); ++i, ++rounds) {
    for (const Target& t : f.to) {
      bool reachable = true;  // a target not listening yet costs one post's timeout per round
      for (uint32_t as : f.as) {
        for (std::vector<std::byte>& msg : Round(i, as, f, large)) {
          if (!reachable) break;
          const PeerType type = *TypeOf(msg);
          if (IsSealed(type) && i % 2 == 0) Seal(msg, ++seq, own_key);
          // Bounded memory: messages the targets do not take stay queued in the endpoint.
          if ((*ep)->pending_ops() > 256) {
            ++held;
            continue;
          }
          if ((*ep)->Post(t.addr, uint64_t{as} << 32, std::move(msg), milliseconds(100)).ok()) {
            ++sent;
            ++by_type[TypeName(type)];
          } else {
            ++failed;
            reachable = false;
          }
        }
      }
    }
    // Whatever comes back; the wait paces the rounds (about 100 a second).
    auto got = (*ep)->Recv(0, ~uint64_t{0}, uint64_t{8} << 20, milliseconds(10));
    if (got.ok()) {
      ++received;
      const auto type = TypeOf(got->data);
      std::printf("peer_forge: received %zu bytes tagged %#llx: %s\n", got->data.size(),
                  static_cast<unsigned long long>(got->tag),
                  type ? TypeName(*type) : "not a message");
    } else if (got.status().code() != nopfs::StatusCode::kTimedOut) {
      ++received;
      std::printf("peer_forge: received something unreadable: %s\n",
                  got.status().ToString().c_str());
    }
  }
  std::string types;
  for (const auto& [name, count] : by_type)
    types += (types.empty() ? "" : ", ") + name + " " + std::to_string(count);
  failed += (*ep)->failed_posts();
  std::printf(
      "peer_forge: sent %llu messages (%s), %llu failed, %llu held back; received %llu "
      "messages\n",
      static_cast<unsigned long long>(sent), types.c_str(), static_cast<unsigned long long>(failed),
      static_cast<unsigned long long>(held), static_cast<unsigned long long>(received));
  return 0;
}
