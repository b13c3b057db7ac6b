#include "fabric/peer_link.h"

#include <spdlog/spdlog.h>
#include <xxhash.h>

#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <thread>
#include <utility>

#include "common/mutex.h"
#include "fabric/peer_handshake.h"
#include "fabric/serve_pool.h"

namespace nopfs::fabric {
namespace {

constexpr auto kPollSlice = std::chrono::milliseconds(50);
// Exchange rounds a node may send before this node asks for them (Exchange is collective, so a
// node runs at most a round or two ahead); more are dropped, so that buffers cannot pile up.
constexpr uint32_t kMaxEarlyExchanges = 4;
// How long a start-up Hello to a node not heard from yet may wait for the provider's queue (a
// connection under way): not at all. It is tried once and, if the queue is full, dropped; it is
// sent again kHelloRetryUnheard later (the progress thread's receive slice is that short
// meanwhile), so that the progress thread neither blocks nor spins while the connection is made.
constexpr auto kHelloPost = std::chrono::milliseconds(0);

uint64_t TagOf(uint32_t node) {
  return uint64_t{node} << 32;
}

}  // namespace

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

// One Read waiting for its reply (on the reader's stack; in State::pending until answered).
struct PeerLink::Pending {
  uint32_t peer = 0;
  uint64_t sample = 0;
  bool sent = false;
  bool done = false;
  CondVar cv;                  // signalled (under the link's mutex) when done is set
  bool remote_posted = false;  // a kRemoteReply came: an RMA read is under way
  Status status;
  std::vector<std::byte> data;
  uint64_t data_xxh3 = 0;  // what the sealed reply says data hashes to
  // The RMA path: the bytes as the read delivered them and the xxh3 they must have.
  ReadBuffer remote;
  uint64_t remote_len = 0;
  uint64_t remote_xxh3 = 0;
  bool is_remote = false;
  std::chrono::steady_clock::time_point deadline{};
};

// The link core: the endpoint, the reads waiting for replies, the outgoing queue, exchanges,
// pushes, RMA registration and the counters. The progress thread (Run) alone drives the endpoint
// and the handshake; the serving threads answer requests through Answer.
struct PeerLink::State {
  PeerLinkOptions opts;
  ServeFn serve;
  std::unique_ptr<Endpoint> ep;
  std::vector<PeerAddr> addr;  // fi_addr of every node
  // The handshake and the sessions, read and written by the progress thread only (the other
  // threads see a peer's death through `dead`).
  std::unique_ptr<PeerHandshake> shake;
  // Per node, whether a message claiming to be from it has arrived (progress thread only).
  std::vector<bool> heard;
  ServePool pool;

  using Pending = PeerLink::Pending;
  mutable Mutex mu;
  CondVar cv;  // exchanges, registrations and dead peers (each Read has its own)
  // Per node, whether it is dead (as shake's client state kDead, for the threads other than the
  // progress thread; both are set together by KillLocked).
  std::vector<bool> dead GUARDED_BY(mu);
  // Per node, whether this node's handshake with it is done (shake's client state kAuthed).
  std::vector<bool> joined GUARDED_BY(mu);
  // Per node, whether it answered this node's Hello without proving the job secret (logged once).
  std::vector<bool> failed_auth GUARDED_BY(mu);
  // WaitForPeers' deadline: handshakes started before it last until it.
  std::chrono::steady_clock::time_point startup_until GUARDED_BY(mu){};
  std::map<uint64_t, Pending*> pending GUARDED_BY(mu);
  std::deque<std::pair<uint32_t, std::vector<std::byte>>> outbox GUARDED_BY(mu);  // (node, message)
  uint64_t next_id GUARDED_BY(mu) = 1;
  // Exchange buffers, class-done notices and pushes waiting for their peer's handshake.
  std::deque<std::pair<uint32_t, PeerMessage>> exchange_out GUARDED_BY(mu);
  // Per node, the classes it reported done (bit c: class c < 64; larger classes never count).
  std::vector<uint64_t> peer_done GUARDED_BY(mu);
  std::chrono::steady_clock::time_point last_reject_log GUARDED_BY(mu){};
  // Exchange buffers received per (round, node).
  std::map<std::pair<uint64_t, uint32_t>, std::vector<std::byte>> exchange_in GUARDED_BY(mu);
  PeerLinkCounters counters GUARDED_BY(mu);
  bool stop GUARDED_BY(mu) = false;
  std::atomic<bool> wake{false};  // a Read is waiting to be scheduled: end the receive slice
  std::thread thread;
  uint64_t push_queued_bytes GUARDED_BY(mu) = 0;  // pushes waiting in exchange_out
  static constexpr uint64_t kMaxPushQueued = uint64_t{64} << 20;
  // RMA: memory exposed for peers' reads (registered by the progress thread; a Region's fields are
  // read and written with mu held).
  struct Region {
    const std::byte* begin = nullptr;
    uint64_t size = 0;
    bool registered = false;
    bool tried = false;  // the progress thread has tried to register it
    Status status;       // why not, if it failed
    ExposedRegion exposed;
  };
  // A deque: the progress thread keeps pointers while others append.
  std::deque<Region> regions GUARDED_BY(mu);
  bool regions_pending GUARDED_BY(mu) = false;
  // RemoteReplies whose RMA read the progress thread must post: (node, reply).
  std::deque<std::pair<uint32_t, RemoteReply>> reads_to_post GUARDED_BY(mu);

  // The registered region holding [p, p + n), if any.
  const Region* RegionOfLocked(const std::byte* p, uint64_t n) const REQUIRES(mu) {
    for (const Region& r : regions) {
      if (r.registered && p >= r.begin && n <= r.size &&
          static_cast<uint64_t>(p - r.begin) <= r.size - n) {
        return &r;
      }
    }
    return nullptr;
  }

  // A serving thread's job (or the progress thread's, without serving threads).
  void Serve(ServeJob& job) {
    if (job.push) {
      opts.on_push(job.node, job.sample, job.push_xxh3, job.push_data);
    } else {
      Answer(job);
    }
  }
  // Serves one request and queues its reply (any thread).
  void Answer(const ServeJob& job) {
    ServeResult r = serve(job.sample);
    ReadReply reply{job.request_id, job.sample, r.status, 0, {}};
    std::optional<RemoteReply> remote;
    if (r.status == ReadStatus::kOk && !r.in_place.empty()) {
      if (r.in_place.size() > kMaxSampleBytes) {
        reply.status = ReadStatus::kError;
      } else {
        if (job.remote_ok && r.in_place.size() >= opts.remote_read_min) {
          MutexLock lock(&mu);
          if (const Region* g = RegionOfLocked(r.in_place.data(), r.in_place.size())) {
            remote = RemoteReply{
                job.request_id,
                job.sample,
                r.in_place.size(),
                g->exposed.wire_base + static_cast<uint64_t>(r.in_place.data() - g->begin),
                g->exposed.key,
                r.xxh3};
          }
        }
        if (!remote) {  // copy it into the reply, checked as a tier read would be
          reply.data.assign(r.in_place.begin(), r.in_place.end());
          reply.xxh3 = r.xxh3;
          if (XXH3_64bits(reply.data.data(), reply.data.size()) != r.xxh3) {
            spdlog::warn("nopfsd: sample {} failed its checksum while being served to node {}",
                         job.sample, job.node);
            reply.status = ReadStatus::kError;
            reply.data.clear();
            reply.xxh3 = 0;
          }
        }
      }
    } else if (r.status == ReadStatus::kOk && r.data.size() > kMaxSampleBytes) {
      reply.status = ReadStatus::kError;
    } else if (r.status == ReadStatus::kOk) {
      reply.data = std::move(r.data);
      if (!reply.data.empty()) reply.xxh3 = XXH3_64bits(reply.data.data(), reply.data.size());
    }
    std::vector<std::byte> bytes = remote ? Encode(*remote) : Encode(reply);
    {
      MutexLock lock(&mu);
      if (remote) {
        ++counters.served_reads;
        ++counters.served_remote;
        counters.served_bytes += remote->length;
      } else if (reply.status == ReadStatus::kOk) {
        ++counters.served_reads;
        counters.served_bytes += reply.data.size();
      } else {
        ++counters.served_not_available;
      }
      outbox.emplace_back(job.node, std::move(bytes));
    }
    wake.store(true);
    ep->Wake();
  }

  // Progress thread: registers exposed regions, posts the RMA reads of RemoteReplies, and hands
  // completed reads to their waiting Read calls.
  void DriveRemote() {
    std::vector<Region*> todo;
    std::deque<std::pair<uint32_t, RemoteReply>> posts;
    {
      MutexLock lock(&mu);
      if (regions_pending) {
        for (Region& g : regions)
          if (!g.registered) todo.push_back(&g);
        regions_pending = false;
      }
      posts.swap(reads_to_post);
    }
    for (Region* g : todo) {
      const Nonce n = RandomNonce();
      uint64_t key = 0;
      std::memcpy(&key, n.data(), sizeof key);
      Result<ExposedRegion> e = ep->ExposeForRemoteRead({g->begin, g->size}, key);
      MutexLock lock(&mu);
      g->tried = true;
      if (e.ok()) {
        g->exposed = *e;
        g->registered = true;
      } else {
        g->status = e.status();
      }
      cv.SignalAll();
    }
    for (auto& [node, v] : posts) {
      Status st = ep->PostRead(addr[node], v.addr, v.key, v.length, v.request_id, opts.timeout);
      if (!st.ok()) {
        MutexLock lock(&mu);
        ++counters.remote_failed;
        auto it = pending.find(v.request_id);
        if (it != pending.end()) {
          it->second->done = true;
          it->second->status =
              Status::IoError("RMA read of sample " + std::to_string(v.sample) + " from node " +
                              std::to_string(node) + " not posted: " + st.ToString());
          it->second->cv.Signal();
          pending.erase(it);
        }
      }
    }
    std::vector<ReadCompletion> done = ep->TakeReads();
    if (done.empty()) return;
    MutexLock lock(&mu);
    for (ReadCompletion& c : done) {
      auto it = pending.find(c.cookie);
      if (it == pending.end()) continue;  // timed out or its peer died meanwhile
      Pending* w = it->second;
      pending.erase(it);
      w->done = true;
      w->cv.Signal();  // wakes it once the mutex is released, after the fields below are set
      if (c.error != 0) {
        ++counters.remote_failed;
        w->status = Status::IoError("RMA read of sample " + std::to_string(w->sample) +
                                    " from node " + std::to_string(w->peer) + " failed");
        // The provider drops the connection on a failed RMA read: treat the peer as gone.
        KillLocked(w->peer, "an RMA read failed: " + c.error_text);
      } else {
        w->is_remote = true;
        w->remote = std::move(c.data);
        w->remote_len = c.length;
      }
    }
  }

  void Queue(uint32_t node, const PeerMessage& m) REQUIRES(mu) {
    outbox.emplace_back(node, Encode(m));
  }

  // Kills `peer`, failing every read waiting on it.
  void KillLocked(uint32_t peer, const std::string& why) REQUIRES(mu) {
    if (!dead[peer]) spdlog::warn("nopfsd: peer node {} marked dead: {}", peer, why);
    dead[peer] = true;
    shake->Kill(peer);
    for (auto it = pending.begin(); it != pending.end();) {
      if (it->second->peer == peer) {
        it->second->done = true;
        it->second->cv.Signal();
        it->second->status =
            Status::Unavailable("peer node " + std::to_string(peer) + " is dead: " + why);
        it = pending.erase(it);
      } else {
        ++it;
      }
    }
    cv.SignalAll();
  }

  void Malformed(uint32_t node, const std::string& why) {
    MutexLock lock(&mu);
    ++counters.malformed;
    if (ShouldLogLocked())
      spdlog::warn("nopfsd: peer message from node {} rejected: {}", node, why);
  }

  // Logs and counts a message refused for want of authentication.
  void Refused(uint32_t node, const std::string& why) {
    MutexLock lock(&mu);
    ++counters.auth_refused;
    if (ShouldLogLocked()) {
      spdlog::warn("nopfsd: peer message claiming to be from node {} refused: {}", node, why);
    }
  }

  // Whether to log one more rejected message. A flood of forged messages must not
  // fill the job's log: the first 20 are logged, then one line every 10 s with the totals (the
  // counters count every one).
  bool ShouldLogLocked() REQUIRES(mu) {
    constexpr uint64_t kFirst = 20;
    const uint64_t rejected = counters.auth_refused + counters.malformed;
    if (rejected <= kFirst) return true;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_reject_log < std::chrono::seconds(10)) return false;
    last_reject_log = now;
    spdlog::warn("nopfsd: {} peer messages refused and {} malformed so far (logging one in 10 s)",
                 counters.auth_refused, counters.malformed);
    return false;
  }

  // Progress thread: acts on what the handshake made of a message from `node`.
  void Apply(uint32_t node, HandshakeStep step) {
    using V = HandshakeStep::Verdict;
    switch (step.verdict) {
      case V::kOk:
      case V::kIgnored:
        break;
      case V::kMalformed:
        return Malformed(node, step.why);
      case V::kRefused:
        Refused(node, step.why);
        break;
      case V::kForged: {
        // Not proof that node is bad: anybody can send a challenge in its name. The handshake's
        // deadline decides. Logged under the same limit as the other refusals.
        MutexLock lock(&mu);
        ++counters.auth_refused;
        if (ShouldLogLocked()) spdlog::warn("nopfsd: {}", step.why);
        break;
      }
      case V::kWrongSecret: {
        // The node at the listed address answered without the secret: waiting for it until the
        // deadline would change nothing (docs/fabric.md, "Start-up"). Logged at once, whatever
        // the flood of other refusals, the first time per node.
        MutexLock lock(&mu);
        ++counters.auth_refused;
        if (!failed_auth[node]) {
          failed_auth[node] = true;
          const PeerAddress& a = opts.peers[node];
          spdlog::warn(
              "nopfsd: peer node {} ({}:{}) failed authentication: a wrong or different job "
              "secret (or node list)? {}; this node does not wait for it",
              node, a.host, a.port, step.why);
        }
        KillLocked(node, "it failed authentication");
        break;
      }
      case V::kDead: {
        MutexLock lock(&mu);
        ++counters.auth_refused;
        KillLocked(node, step.why);
        break;
      }
    }
    if (step.reply) {
      MutexLock lock(&mu);
      Queue(node, *step.reply);
    }
  }

  // Requests, exchanges, notices and pushes to this node as a server; each has passed its
  // session's Admit.
  void HandleRequest(uint32_t node, PeerMessage& m) {
    if (auto* x = std::get_if<ExchangeData>(&m)) {
      MutexLock lock(&mu);
      if (XXH3_64bits(x->data.data(), x->data.size()) != x->xxh3) {
        ++counters.malformed;
        spdlog::warn("nopfsd: exchange round {} from node {} failed its checksum", x->round, node);
        return;
      }
      uint32_t held = 0;
      for (const auto& [key, buf] : exchange_in)
        held += key.second == node ? 1 : 0;
      if (held >= kMaxEarlyExchanges) {
        ++counters.malformed;
        spdlog::warn(
            "nopfsd: node {} sent exchange round {} with {} of its rounds unclaimed; "
            "dropped",
            node, x->round, held);
        return;
      }
      if (!exchange_in.emplace(std::make_pair(x->round, node), std::move(x->data)).second) {
        ++counters.malformed;
        spdlog::warn("nopfsd: peer node {} sent exchange round {} twice", node, x->round);
        return;
      }
      cv.SignalAll();
    } else if (auto* d = std::get_if<ClassDone>(&m)) {
      MutexLock lock(&mu);
      if (d->cls < 64) peer_done[node] |= uint64_t{1} << d->cls;
    } else if (auto* u = std::get_if<PushSample>(&m)) {
      MutexLock lock(&mu);
      if (!opts.on_push) {
        ++counters.pushes_dropped;
        return;
      }
      ++counters.pushes_received;
      ServeJob job{node, 0, u->sample, false, true, u->xxh3, std::move(u->data)};
      if (pool.inline_only()) {
        lock.Unlock();
        opts.on_push(job.node, job.sample, job.push_xxh3, job.push_data);
        return;
      }
      lock.Unlock();
      pool.Submit(std::move(job));
    } else if (auto* q = std::get_if<ReadRequest>(&m)) {
      ServeJob job{node, q->request_id, q->sample, (q->flags & kAcceptsRemoteRead) != 0, false, 0,
                   {}};
      if (pool.inline_only() || (opts.serve_inline && opts.serve_inline(q->sample))) {
        Answer(job);
        return;
      }
      pool.Submit(std::move(job));
    }
  }

  // Replies to this node as a client; a sealed one has passed Admit with sequence number `seq`.
  void HandleReply(uint32_t node, uint64_t seq, PeerMessage& m) {
    MutexLock lock(&mu);
    if (auto* v = std::get_if<RemoteReply>(&m)) {
      auto it = pending.find(v->request_id);
      if (it == pending.end() || it->second->peer != node || it->second->sample != v->sample ||
          it->second->remote_posted || !ep->supports_remote_read()) {
        lock.Unlock();
        return Malformed(node, "remote reply to no outstanding request");
      }
      it->second->remote_posted = true;
      it->second->remote_xxh3 = v->xxh3;
      v->key = shake->UnmaskRemoteKey(node, seq, v->key);
      reads_to_post.emplace_back(node, *v);
    } else if (auto* p = std::get_if<ReadReply>(&m)) {
      auto it = pending.find(p->request_id);
      if (it == pending.end() || it->second->peer != node || it->second->sample != p->sample) {
        lock.Unlock();
        return Malformed(node, "reply to no outstanding request");
      }
      Pending* w = it->second;
      pending.erase(it);
      w->done = true;
      w->cv.Signal();  // wakes it once the mutex is released, after the fields below are set
      if (p->status == ReadStatus::kOk) {
        w->data = std::move(p->data);
        w->data_xxh3 = p->xxh3;
      } else if (p->status == ReadStatus::kNotAvailable) {
        w->status = Status::NotFound("sample " + std::to_string(p->sample) +
                                     " not ready on peer node " + std::to_string(node));
      } else {
        w->status = Status::IoError("peer node " + std::to_string(node) +
                                    " failed reading sample " + std::to_string(p->sample));
      }
    }
  }

  // Progress thread: hands a message from `node` (sealed ones admitted with seq `seq`) to the
  // handshake or to the request and reply handlers.
  void Dispatch(uint32_t node, uint64_t seq, PeerMessage& m) {
    if (auto* h = std::get_if<Hello>(&m)) {
      HandshakeStep step = shake->OnHello(node, *h);
      const bool valid = step.verdict == HandshakeStep::Verdict::kOk;
      Apply(node, std::move(step));
      if (valid) ReviveOnHello(node);
    } else if (auto* a = std::get_if<Auth>(&m)) {
      Apply(node, shake->OnAuth(node, *a));
    } else if (auto* c = std::get_if<Challenge>(&m)) {
      Apply(node, shake->OnChallenge(node, *c));
    } else if (auto* r = std::get_if<AuthResult>(&m)) {
      Apply(node, shake->OnAuthResult(node, *r));
    } else if (std::holds_alternative<ReadReply>(m) || std::holds_alternative<RemoteReply>(m)) {
      HandleReply(node, seq, m);
    } else {
      HandleRequest(node, m);
    }
  }

  // Progress thread: a node that this one gave up on because it did not answer the handshake
  // (it started later) has sent a Hello: it is up now, so this node tries again (at most once per
  // ten timeouts, PeerHandshake::Revive).
  void ReviveOnHello(uint32_t node) {
    MutexLock lock(&mu);
    const auto now = std::chrono::steady_clock::now();
    if (!shake->Revive(node, now)) return;
    dead[node] = false;
    spdlog::info(
        "nopfsd: peer node {} sent a hello after this node gave up on it: handshaking again", node);
    BeginLocked(node, now);
  }

  // Starts the handshake with `peer` if none was started.
  void BeginLocked(uint32_t peer, std::chrono::steady_clock::time_point now) REQUIRES(mu) {
    if (std::optional<Hello> h = shake->Begin(peer, now, startup_until)) Queue(peer, *h);
  }

  // Starts handshakes, queues reads of authenticated peers, expires deadlines.
  void ScheduleLocked() REQUIRES(mu) {
    auto now = std::chrono::steady_clock::now();
    for (auto& [id, w] : pending) {
      BeginLocked(w->peer, now);
      if (shake->state(w->peer) == PeerState::kAuthed && !w->sent) {
        w->sent = true;
        Queue(w->peer,
              ReadRequest{id, w->sample, ep->supports_remote_read() ? kAcceptsRemoteRead : 0u});
      }
    }
    for (auto it = exchange_out.begin(); it != exchange_out.end();) {
      BeginLocked(it->first, now);
      const PeerState st = shake->state(it->first);
      if (st == PeerState::kAuthed || st == PeerState::kDead) {
        if (const auto* u = std::get_if<PushSample>(&it->second)) {
          push_queued_bytes -= u->data.size();
          if (st == PeerState::kDead) ++counters.pushes_dropped;
        }
        if (st == PeerState::kAuthed) Queue(it->first, it->second);
        it = exchange_out.erase(it);
      } else {
        ++it;
      }
    }
    bool changed = false;
    for (uint32_t p = 0; p < joined.size(); ++p) {
      if (p == opts.node) continue;
      if (now < startup_until) {  // the start-up phase: a node may not be listening yet
        const auto interval = heard[p] ? kHelloRetry : kHelloRetryUnheard;
        if (std::optional<Hello> h = shake->Resend(p, now, interval)) Queue(p, *h);
      }
      const bool j = shake->state(p) == PeerState::kAuthed;
      changed |= j != joined[p];
      joined[p] = j;
    }
    if (changed) cv.SignalAll();
    for (uint32_t p : shake->Expire(now)) {
      ++counters.timeouts;
      KillLocked(p, now < startup_until + opts.timeout
                        ? "no handshake by the start-up deadline"
                        : "no handshake within " + std::to_string(opts.timeout.count()) + " ms");
    }
    for (auto it = pending.begin(); it != pending.end(); ++it) {
      if (now >= it->second->deadline) {
        uint32_t peer = it->second->peer;
        ++counters.timeouts;
        KillLocked(peer, "no reply within " + std::to_string(opts.timeout.count()) + " ms");
        break;  // KillLocked erased entries; the rest expire on the next turn
      }
    }
  }

  void Run() {
    for (;;) {
      std::deque<std::pair<uint32_t, std::vector<std::byte>>> sends;
      bool starting = false;
      {
        MutexLock lock(&mu);
        if (stop) break;
        ScheduleLocked();
        sends.swap(outbox);
        wake.store(false);
        starting = std::chrono::steady_clock::now() < startup_until;
      }
      // In the start-up phase, while a node has not been heard from and its handshake waits for
      // its Challenge, the receive slice is as short as the Hello's retry.
      bool hello_waiting = false;
      for (uint32_t p = 0; starting && p < heard.size(); ++p) {
        hello_waiting |= p != opts.node && !heard[p] && shake->state(p) == PeerState::kHelloSent;
      }
      for (auto& [node, bytes] : sends) {
        if (!shake->Seal(node, bytes)) continue;  // its session is gone
        // In the start-up phase a Hello to a node that is not listening yet stays in the
        // provider's queue while it connects: until the node has been heard from, it is tried
        // once and dropped (Resend sends it again kHelloRetryUnheard later) rather than hold the
        // progress thread for a timeout. A Hello that cannot be sent never kills the node: the
        // handshake's deadline decides.
        const bool hello = *TypeOf(bytes) == PeerType::kHello;
        Status st = ep->Post(addr[node], TagOf(opts.node), std::move(bytes),
                             hello && starting && !heard[node] ? kHelloPost : opts.timeout);
        if (!st.ok() && hello) continue;
        if (!st.ok()) {
          MutexLock lock(&mu);
          ++counters.timeouts;
          KillLocked(node, st.ToString());
        }
      }
      DriveRemote();
      auto msg = ep->Recv(
          0, ~uint64_t{0}, kMaxPeerMessageBytes, hello_waiting ? kHelloRetryUnheard : kPollSlice,
          [this] { return wake.load(std::memory_order_relaxed) || ep->has_reads(); });
      DriveRemote();
      if (!msg.ok()) {
        if (msg.status().code() == StatusCode::kCorruption) Malformed(~0u, msg.status().ToString());
        continue;
      }
      uint64_t sender = msg->tag >> 32;
      if (sender >= opts.peers.size() || sender == opts.node || (msg->tag & 0xffffffffu) != 0) {
        Malformed(static_cast<uint32_t>(sender), "tag names no other node of the job");
        continue;
      }
      auto node = static_cast<uint32_t>(sender);
      if (!heard[node]) {
        // A claim only, but enough to wait for the provider's queue, and a sign that the node
        // listens now: a Hello sent before it did was lost, so the next goes at once.
        heard[node] = true;
        MutexLock lock(&mu);
        if (std::chrono::steady_clock::now() < startup_until) {
          const auto now = std::chrono::steady_clock::now();
          if (std::optional<Hello> h = shake->Resend(node, now, std::chrono::milliseconds(0))) {
            Queue(node, *h);
          }
        }
      }
      auto decoded = Decode(msg->data);
      if (!decoded.ok()) {
        Malformed(node, decoded.status().ToString());
        continue;
      }
      const PeerType type = *TypeOf(msg->data);
      uint64_t seq = 0;
      if (IsSealed(type)) {
        Result<uint64_t> admitted = shake->Admit(node, type, msg->data);
        if (!admitted.ok()) {
          Refused(node, admitted.status().message());
          continue;
        }
        seq = *admitted;
      }
      Dispatch(node, seq, *decoded);
    }
  }
};

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
  for (const PeerAddress& p : options.peers) {
    auto a = s->ep->AddPeer(p.host, p.port);
    if (!a.ok()) return a.status();
    s->addr.push_back(*a);
  }
  const auto nodes = static_cast<uint32_t>(options.peers.size());
  s->shake = std::make_unique<PeerHandshake>(options.secret, options.node, nodes, options.timeout);
  s->heard.assign(nodes, false);
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
      w->cv.Signal();
      w->status = Status::Unavailable("peer link stopped");
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

Status PeerLink::Await(uint32_t peer, uint64_t sample, Pending& w) {
  if (peer >= nodes() || peer == s_->opts.node) {
    return Status::InvalidArgument("peer link: no peer node " + std::to_string(peer));
  }
  w.peer = peer;
  w.sample = sample;
  MutexLock lock(&s_->mu);
  if (s_->stop) return Status::Unavailable("peer link stopped");
  if (s_->dead[peer]) {
    return Status::Unavailable("peer node " + std::to_string(peer) + " is dead");
  }
  // The deadline covers the handshake too; the progress thread expires it.
  w.deadline = std::chrono::steady_clock::now() + s_->opts.timeout;
  uint64_t id = s_->next_id++;
  s_->pending.emplace(id, &w);
  s_->wake.store(true);
  s_->ep->Wake();
  while (!w.done)
    w.cv.Wait(&s_->mu);
  if (!w.status.ok()) {
    if (w.status.code() == StatusCode::kNotFound) ++s_->counters.fetch_not_available;
    return w.status;
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
  Pending w;
  NOPFS_RETURN_IF_ERROR(Await(peer, sample, w));
  if (!w.is_remote) {
    if (!w.data.empty() && XXH3_64bits(w.data.data(), w.data.size()) != w.data_xxh3) {
      return Status::Corruption("sample " + std::to_string(sample) + " from node " +
                                std::to_string(peer) + " failed its checksum");
    }
    CountFetched(w.data.size(), false);
    return std::move(w.data);
  }
  if (XXH3_64bits(w.remote.get(), w.remote_len) != w.remote_xxh3) {
    MutexLock lock(&s_->mu);
    ++s_->counters.remote_failed;
    return RemoteMismatch(peer, sample);
  }
  CountFetched(w.remote_len, true);
  return std::vector<std::byte>(w.remote.get(), w.remote.get() + w.remote_len);
}

Result<uint64_t> PeerLink::ReadInto(uint32_t peer, uint64_t sample, std::span<std::byte> dst) {
  Pending w;
  NOPFS_RETURN_IF_ERROR(Await(peer, sample, w));
  const std::byte* src = w.is_remote ? w.remote.get() : w.data.data();
  const uint64_t len = w.is_remote ? w.remote_len : w.data.size();
  if (len != dst.size()) {
    return Status::Corruption("peer node " + std::to_string(peer) + " sent " + std::to_string(len) +
                              " bytes of sample " + std::to_string(sample) + ", which has " +
                              std::to_string(dst.size()));
  }
  if (len > 0) std::memcpy(dst.data(), src, len);
  const uint64_t h = XXH3_64bits(dst.data(), dst.size());
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
