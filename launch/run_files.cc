#include "launch/run_files.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>

namespace nopfs::launch {
namespace {

// The value of `key=` on a line of its own in `text`, if present.
bool Find(std::string_view text, std::string_view key, std::string_view* value) {
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find('\n', at);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(at, end - at);
    if (line.size() > key.size() && line.substr(0, key.size()) == key && line[key.size()] == '=') {
      *value = line.substr(key.size() + 1);
      return true;
    }
    at = end + 1;
  }
  return false;
}

template <typename T>
Result<T> Digits(std::string_view what, std::string_view v, T max) {
  T n = 0;
  const bool digits = !v.empty() && v.size() <= 20 &&
                      std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; });
  const auto r = std::from_chars(v.data(), v.data() + v.size(), n);
  if (!digits || r.ec != std::errc() || r.ptr != v.data() + v.size() || n > max) {
    return Status::InvalidArgument(std::string(what) + ": not a number up to " +
                                   std::to_string(max));
  }
  return n;
}

// The last non-empty line of `text`, at most 400 bytes.
std::string LastLine(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' '))
    text.remove_suffix(1);
  const size_t nl = text.rfind('\n');
  const std::string_view line = nl == std::string_view::npos ? text : text.substr(nl + 1);
  return std::string(line.substr(0, 400));
}

}  // namespace

std::string FormatReady(const ReadyInfo& info) {
  std::string out =
      "pid=" + std::to_string(info.pid) + "\nsamples=" + std::to_string(info.samples) + "\n";
  if (info.peer_port != 0) {
    out += "peer_port=" + std::to_string(info.peer_port) + "\n";
    out += std::string("peers_joined=") + (info.peers_joined ? "1" : "0") + "\n";
  }
  if (!info.peers.empty()) {
    std::string line = info.peers.substr(0, 1000);
    for (char& c : line) {
      if (c == '\n') c = ' ';
    }
    out += "peers=" + line + "\n";
  }
  return out;
}

Result<ReadyInfo> ParseReady(std::string_view text) {
  std::string_view pid;
  std::string_view samples;
  if (!Find(text, "pid", &pid) || !Find(text, "samples", &samples)) {
    return Status::InvalidArgument("ready: no pid= or samples= line");
  }
  Result<int64_t> p = Digits<int64_t>("ready: pid", pid, INT32_MAX);
  if (!p.ok()) return p.status();
  Result<uint64_t> f = Digits<uint64_t>("ready: samples", samples, uint64_t{1} << 48);
  if (!f.ok()) return f.status();
  ReadyInfo info{static_cast<pid_t>(*p), *f, 0, false, {}};
  if (std::string_view port; Find(text, "peer_port", &port)) {
    Result<uint16_t> n = Digits<uint16_t>("ready: peer_port", port, 65535);
    if (!n.ok()) return n.status();
    info.peer_port = *n;
  }
  if (std::string_view joined; Find(text, "peers_joined", &joined)) {
    Result<uint8_t> n = Digits<uint8_t>("ready: peers_joined", joined, 1);
    if (!n.ok()) return n.status();
    info.peers_joined = *n == 1;
  }
  if (std::string_view peers; Find(text, "peers", &peers)) {
    info.peers = std::string(peers.substr(0, 1000));
  }
  return info;
}

std::string FormatLayout(uint32_t ranks_per_node) {
  return "ranks_per_node=" + std::to_string(ranks_per_node) + "\n";
}

std::string FormatLayoutError(std::string_view message) {
  return "error=" + std::string(message) + "\n";
}

Result<uint32_t> ParseLayout(std::string_view text) {
  while (!text.empty() && text.back() == '\n')
    text.remove_suffix(1);
  if (text.substr(0, 6) == "error=") return Status::FailedPrecondition(std::string(text.substr(6)));
  std::string_view n;
  if (!Find(text, "ranks_per_node", &n)) {
    return Status::InvalidArgument("layout: no ranks_per_node= line");
  }
  Result<uint32_t> v = Digits<uint32_t>("layout: ranks_per_node", n, 4096);
  if (v.ok() && *v == 0) return Status::InvalidArgument("layout: ranks_per_node=0");
  return v;
}

std::string ReadyMessage(const ReadyInfo& info) {
  return "ready\n" + FormatReady(info);
}

std::string FailedMessage(std::string_view reason) {
  return "failed\n" + std::string(reason) + "\n";
}

Result<ReadyInfo> WaitReady(int fd, std::chrono::steady_clock::time_point deadline,
                            const std::function<bool()>& stop) {
  std::string said;  // at most 4 KiB
  for (;;) {
    if (stop && stop()) return Status::Unavailable("interrupted while nopfsd was starting");
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return Status::TimedOut("nopfsd was not ready in time");
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 100)));
    if (r <= 0) continue;  // a timeout, or EINTR: look at stop() and the deadline again
    char buf[1024];
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) break;
    if (said.size() < 4096) said.append(buf, static_cast<size_t>(n));
  }
  if (said.rfind("failed\n", 0) == 0) {
    return Status::FailedPrecondition(LastLine(std::string_view(said).substr(7)));
  }
  if (said.rfind("ready\n", 0) == 0) return ParseReady(std::string_view(said).substr(6));
  return Status::Internal("closed its ready pipe without saying ready");
}

}  // namespace nopfs::launch
