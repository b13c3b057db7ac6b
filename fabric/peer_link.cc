#include "fabric/peer_link.h"

#include <spdlog/spdlog.h>
#include <xxhash.h>

#include <cstring>

#include "common/checksum.h"
#include "fabric/peer_link_state.h"

namespace nopfs::fabric {

using namespace peer_link_detail;  // the link's constants

Result<std::vector<PeerAddress>> ParsePeerList(const std::string& list) {
  std::vector<PeerAddress> out;
  size_t start = 0;
  while (start <= list.size()) {
    size_t end = list.find(',', start);
    if (end == std::string::npos) end = list.size();
    std::string item = list.substr(start, end - start);
    size_t colon = item.rfind(':');
    if (item.empty() || colon == std::string::npos || colon == 0 || colon + 1 == item.size()) {
      return Status::InvalidArgument("--peers: \"" + item + "\" is not HOST:PORT");
    }
    uint64_t port = 0;
    for (char c : item.substr(colon + 1)) {
      if (c < '0' || c > '9' || port > 65535) {
        return Status::InvalidArgument("--peers: bad port in \"" + item + "\"");
      }
      port = port * 10 + static_cast<uint64_t>(c - '0');
    }
    if (port == 0 || port > 65535) {
      return Status::InvalidArgument("--peers: bad port in \"" + item + "\"");
    }
    out.push_back({item.substr(0, colon), static_cast<uint16_t>(port)});
    start = end + 1;
  }
  return out;
}

PeerLink::PeerLink(std::unique_ptr<State> state) : s_(std::move(state)) {}

Result<std::unique_ptr<PeerLink>> PeerLink::Start(const PeerLinkOptions& options, ServeFn serve) {
  if (options.node >= options.peers.size()) {
    return Status::InvalidArgument("peer link: node " + std::to_string(options.node) +
                                   " is not in the peer list of " +
                                   std::to_string(options.peers.size()));
  }
  auto s = std::make_unique<State>();
  s->opts = options;
  s->serve = std::move(serve);
  const PeerAddress& self = options.peers[options.node];
  auto ep = Endpoint::Open({options.provider, self.host, self.port, options.remote_read});
  if (!ep.ok()) return ep.status();
  s->ep = std::move(*ep);
  s->ask_remote = s->ep->supports_remote_read() &&
                  (options.rma_in_software || s->ep->remote_read_in_hardware());
  if (options.after_bind) NOPFS_RETURN_IF_ERROR(options.after_bind());
  for (const PeerAddress& p : options.peers) {
    auto a = s->ep->AddPeer(p.host, p.port);
    if (!a.ok()) return a.status();
    s->addr.push_back(*a);
  }
  const auto nodes = static_cast<uint32_t>(options.peers.size());
  s->shake = std::make_unique<PeerHandshake>(options.secret, options.node, nodes, options.timeout);
  s->heard.assign(nodes, false);
  s->acked_leave.assign(nodes, false);
  {
    MutexLock lock(&s->mu);  // no other thread yet: for the analysis
    s->peer_done.assign(nodes, 0);
    s->dead.assign(nodes, false);
    s->joined.assign(nodes, false);
    s->failed_auth.assign(nodes, false);
  }
  State* raw = s.get();
  // The pool first: the progress thread asks it whether it has threads.
  s->pool.Start(options.serve_threads, [raw](ServeJob& job) { raw->Serve(job); });
  s->thread = std::thread([raw] { raw->Run(); });
  return std::unique_ptr<PeerLink>(new PeerLink(std::move(s)));
}

PeerLink::~PeerLink() {
  Stop();
}

void PeerLink::Stop() {
  {
    MutexLock lock(&s_->mu);
    if (s_->stop && !s_->thread.joinable()) return;
    s_->stop = true;
    s_->wake.store(true);
    s_->ep->Wake();
    for (auto& [id, w] : s_->pending) {
      w->done = true;
      w->status = Status::Unavailable("peer link stopped");
      State::Release(*w);
    }
    s_->pending.clear();
    s_->cv.SignalAll();
  }
  s_->pool.Stop();
  if (s_->thread.joinable()) s_->thread.join();
}

void PeerLink::AnnounceClassDone(uint32_t cls) {
  MutexLock lock(&s_->mu);
  if (s_->stop || cls > 0xFFFF) return;
  for (uint32_t k = 0; k < s_->dead.size(); ++k) {
    if (k != s_->opts.node && !s_->dead[k]) {
      s_->exchange_out.emplace_back(k, ClassDone{cls});
    }
  }
  s_->wake.store(true);
  s_->ep->Wake();
}

void PeerLink::Push(uint32_t peer, uint64_t sample, uint64_t xxh3,
                    std::span<const std::byte> data) {
  if (data.size() > kMaxSampleBytes) {
    MutexLock lock(&s_->mu);
    ++s_->counters.pushes_dropped;
    return;
  }
  PushSample m{sample, xxh3, {data.begin(), data.end()}};  // copied before taking the lock
  MutexLock lock(&s_->mu);
  if (s_->stop || peer >= s_->dead.size() || peer == s_->opts.node) return;
  if (s_->dead[peer] || s_->push_queued_bytes + m.data.size() > State::kMaxPushQueued) {
    ++s_->counters.pushes_dropped;
    return;
  }
  s_->push_queued_bytes += m.data.size();
  ++s_->counters.pushes_sent;
  s_->counters.push_bytes_sent += m.data.size();
  s_->exchange_out.emplace_back(peer, std::move(m));
  s_->wake.store(true);
  s_->ep->Wake();
}

bool PeerLink::PeerClassDone(uint32_t peer, uint32_t cls) const {
  MutexLock lock(&s_->mu);
  return peer < s_->peer_done.size() && cls < 64 && (s_->peer_done[peer] >> cls & 1) != 0;
}

Status PeerLink::Await(uint32_t peer, uint64_t sample, const std::shared_ptr<Pending>& w) {
  if (peer >= nodes() || peer == s_->opts.node) {
    return Status::InvalidArgument("peer link: no peer node " + std::to_string(peer));
  }
  w->peer = peer;
  w->sample = sample;
  {
    MutexLock lock(&s_->mu);
    if (s_->stop) return Status::Unavailable("peer link stopped");
    if (s_->dead[peer]) {
      return Status::Unavailable("peer node " + std::to_string(peer) + " is dead");
    }
    // The deadline covers the handshake too; the progress thread expires it.
    w->deadline = std::chrono::steady_clock::now() + s_->opts.timeout;
    uint64_t id = s_->next_id++;
    s_->pending.emplace(id, w);
  }
  s_->wake.store(true);
  s_->ep->Wake();
  State::AwaitReady(*w);
  if (!w->status.ok()) {
    if (w->status.code() == StatusCode::kNotFound) {
      MutexLock lock(&s_->mu);
      ++s_->counters.fetch_not_available;
    }
    return w->status;
  }
  return Status::Ok();  // counted as fetched by the caller, once the bytes are handed over
}

void PeerLink::CountFetched(uint64_t bytes, bool remote) {
  MutexLock lock(&s_->mu);
  ++s_->counters.fetched_reads;
  s_->counters.fetched_bytes += bytes;
  if (remote) ++s_->counters.fetched_remote;
}

namespace {

Status RemoteMismatch(uint32_t peer, uint64_t sample) {
  return Status::Corruption("sample " + std::to_string(sample) + " read from node " +
                            std::to_string(peer) + " by RMA failed its checksum");
}

}  // namespace

Result<std::vector<std::byte>> PeerLink::Read(uint32_t peer, uint64_t sample) {
  auto p = std::make_shared<Pending>();
  Pending& w = *p;
  NOPFS_RETURN_IF_ERROR(Await(peer, sample, p));
  if (!w.is_remote) {
    if (!w.data.empty() && Xxh3(w.data) != w.data_xxh3) {
      return Status::Corruption("sample " + std::to_string(sample) + " from node " +
                                std::to_string(peer) + " failed its checksum");
    }
    CountFetched(w.data.size(), false);
    return std::move(w.data);
  }
  if (Xxh3({w.remote.get(), w.remote_len}) != w.remote_xxh3) {
    MutexLock lock(&s_->mu);
    ++s_->counters.remote_failed;
    return RemoteMismatch(peer, sample);
  }
  CountFetched(w.remote_len, true);
  return std::vector<std::byte>(w.remote.get(), w.remote.get() + w.remote_len);
}

Result<uint64_t> PeerLink::ReadInto(uint32_t peer, uint64_t sample, std::span<std::byte> dst) {
  auto p = std::make_shared<Pending>();
  Pending& w = *p;
  w.dst = dst;
  NOPFS_RETURN_IF_ERROR(Await(peer, sample, p));
  const std::byte* src = w.is_remote ? w.remote.get() : w.data.data();
  const uint64_t len = w.in_dst ? dst.size() : w.is_remote ? w.remote_len : w.data.size();
  if (len != dst.size()) {
    return Status::Corruption("peer node " + std::to_string(peer) + " sent " + std::to_string(len) +
                              " bytes of sample " + std::to_string(sample) + ", which has " +
                              std::to_string(dst.size()));
  }
  if (len > 0 && !w.in_dst) std::memcpy(dst.data(), src, len);
  const uint64_t h = Xxh3(dst);
  if (w.is_remote && h != w.remote_xxh3) {
    MutexLock lock(&s_->mu);
    ++s_->counters.remote_failed;
    return RemoteMismatch(peer, sample);
  }
  if (!w.is_remote && len > 0 && h != w.data_xxh3) {
    return Status::Corruption("sample " + std::to_string(sample) + " from node " +
                              std::to_string(peer) + " failed its checksum");
  }
  CountFetched(len, w.is_remote);
  return h;
}

Status PeerLink::ExposeForRemoteRead(std::span<const std::byte> region) {
  if (region.empty()) return Status::InvalidArgument("peer link: an empty region");
  if (!s_->ep->supports_remote_read()) {
    return Status::FailedPrecondition("provider " + s_->ep->provider() +
                                      " does no RMA reads with keys of our choosing");
  }
  MutexLock lock(&s_->mu);
  if (s_->stop) return Status::Unavailable("peer link stopped");
  State::Region& g = s_->regions.emplace_back();
  g.begin = region.data();
  g.size = region.size();
  s_->regions_pending = true;
  s_->wake.store(true);
  s_->ep->Wake();
  while (!g.tried && !s_->stop)
    s_->cv.Wait(&s_->mu);
  if (!g.tried) return Status::Unavailable("peer link stopped");
  return g.status;
}

bool PeerLink::supports_remote_read() const {
  return s_->ep->supports_remote_read();
}

bool PeerLink::asks_remote_read() const {
  return s_->ask_remote;
}

Status PeerLink::WaitForPeers(std::chrono::steady_clock::time_point deadline) {
  MutexLock lock(&s_->mu);
  const auto now = std::chrono::steady_clock::now();
  s_->startup_until = std::max(s_->startup_until, deadline);
  for (uint32_t k = 0; k < nodes(); ++k) {
    if (k != s_->opts.node) s_->BeginLocked(k, now);
  }
  s_->wake.store(true);
  s_->ep->Wake();
  // The progress thread expires the handshakes that are not done at the deadline (within one
  // receive slice of it).
  for (uint32_t k = 0; k < nodes() && !s_->stop;) {
    if (k == s_->opts.node || s_->joined[k] || s_->dead[k]) {
      ++k;
    } else if (!s_->cv.WaitUntil(&s_->mu, deadline + 10 * kPollSlice)) {
      break;
    }
  }
  std::string missing, failed;
  for (uint32_t k = 0; k < nodes(); ++k) {
    if (k == s_->opts.node || s_->joined[k]) continue;
    std::string& list = s_->failed_auth[k] ? failed : missing;
    list += (list.empty() ? "" : ", ") + std::to_string(k);
  }
  if (s_->stop) return Status::Unavailable("peer link stopped");
  if (missing.empty() && failed.empty()) return Status::Ok();
  std::string why;
  if (!missing.empty()) {
    why = "peer node(s) " + missing + " did not answer the handshake by the start-up deadline";
  }
  if (!failed.empty()) {
    why += (why.empty() ? "" : "; ") + ("peer node(s) " + failed) +
           " failed authentication (a wrong or different job secret?)";
  }
  return Status::Unavailable(why);
}

Result<std::vector<std::vector<std::byte>>> PeerLink::Exchange(
    uint64_t round, std::vector<std::vector<std::byte>> out) {
  return Exchange(round, std::move(out), std::chrono::steady_clock::now() + 5 * s_->opts.timeout);
}

Result<std::vector<std::vector<std::byte>>> PeerLink::Exchange(
    uint64_t round, std::vector<std::vector<std::byte>> out,
    std::chrono::steady_clock::time_point deadline) {
  const uint32_t nodes = this->nodes();
  const uint32_t self = s_->opts.node;
  if (out.size() != nodes) {
    return Status::InvalidArgument("exchange: " + std::to_string(out.size()) + " buffers for " +
                                   std::to_string(nodes) + " nodes");
  }
  for (const auto& b : out) {
    if (b.size() > kMaxSampleBytes) {
      return Status::InvalidArgument("exchange: buffer over " + std::to_string(kMaxSampleBytes) +
                                     " bytes");
    }
  }
  MutexLock lock(&s_->mu);
  for (uint32_t k = 0; k < nodes; ++k) {
    if (k == self) continue;
    const uint64_t h = XXH3_64bits(out[k].data(), out[k].size());
    s_->exchange_out.emplace_back(k, ExchangeData{round, h, std::move(out[k])});
  }
  s_->wake.store(true);
  s_->ep->Wake();
  std::vector<std::vector<std::byte>> in(nodes);
  for (uint32_t k = 0; k < nodes; ++k) {
    if (k == self) continue;
    auto key = std::make_pair(round, k);
    bool ready = false;
    bool timed_out = false;
    while (!(ready = s_->stop || s_->exchange_in.count(key) > 0 || s_->dead[k]) && !timed_out) {
      timed_out = !s_->cv.WaitUntil(&s_->mu, deadline);
    }
    auto it = s_->exchange_in.find(key);
    if (it == s_->exchange_in.end()) {
      if (!ready) {
        return Status::TimedOut("exchange round " + std::to_string(round) + ": nothing from node " +
                                std::to_string(k));
      }
      return Status::Unavailable("exchange round " + std::to_string(round) + ": node " +
                                 std::to_string(k) + " is dead or the link stopped");
    }
    in[k] = std::move(it->second);
    s_->exchange_in.erase(it);
  }
  in[self] = std::move(out[self]);
  return in;
}

bool PeerLink::IsDead(uint32_t peer) const {
  MutexLock lock(&s_->mu);
  return peer < s_->dead.size() && s_->dead[peer];
}

PeerLinkCounters PeerLink::counters() const {
  MutexLock lock(&s_->mu);
  return s_->counters;
}

uint32_t PeerLink::node() const {
  return s_->opts.node;
}
uint32_t PeerLink::nodes() const {
  return static_cast<uint32_t>(s_->opts.peers.size());
}
const std::string& PeerLink::provider() const {
  return s_->ep->provider();
}

}  // namespace nopfs::fabric
